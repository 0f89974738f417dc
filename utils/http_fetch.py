"""Byte-capped http(s) fetching: the one streaming reader behind data-set, image and weights downloads.

A URL's body is read in chunks and refused once the server announces or sends more than the caller's cap, or
closes before the length it announced; a byte range (``fetch_range``, ``RangedFile``: tar shards) reads at most its
length whatever the server sends. Bodies are asked for and read unencoded: a gzip answer is refused, never
inflated. Failures raise :class:`FetchError` whose message is the bare reason
(``HTTP 404 Not Found``, ``more than the cap of N bytes; refused``); each caller turns it into its own one-line
error with the URL or file it was fetching. Redirects are followed only to http(s) URLs (never ftp://, file://,
data: ...), never from https:// down to http://, and at most MAX_REDIRECTS times; the body after them meets the
same cap.
"""

from __future__ import annotations

import http.client
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

CHUNK = 1 << 16
USER_AGENT = "yolo-ddp"
MAX_REDIRECTS = 10


class FetchError(Exception):
    """A fetch that failed; the message is the reason, without the URL."""


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to an http(s) URL, and not from https:// to http://."""

    max_redirections = MAX_REDIRECTS

    def http_error_302(self, req: urllib.request.Request, fp: object, code: int, msg: str,
                       headers: http.client.HTTPMessage) -> object:
        target = headers.get("location") or headers.get("uri") or ""
        scheme = urllib.parse.urlsplit(urllib.parse.urljoin(req.full_url, target)).scheme.lower()
        if scheme not in ("http", "https"):
            raise FetchError(f"redirected to a {scheme or 'scheme-less'}:// URL; only http:// and https:// are "
                             "fetched")
        if scheme == "http" and urllib.parse.urlsplit(req.full_url).scheme.lower() == "https":
            raise FetchError("redirected from https:// to http://; refused")
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _opener() -> urllib.request.OpenerDirector:
    """urllib's opener with the redirect rule above and no ftp:// or file:// handlers at all."""
    opener = urllib.request.OpenerDirector()
    handlers = (urllib.request.ProxyHandler(), urllib.request.HTTPHandler(), urllib.request.HTTPSHandler(),
                urllib.request.HTTPDefaultErrorHandler(), _HttpOnlyRedirects(), urllib.request.HTTPErrorProcessor())
    for handler in handlers:
        opener.add_handler(handler)
    return opener


def open_url(url: str, timeout: float, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    """The open response of an http(s) ``url``; FetchError for another scheme, a failed request, or a body in a
    content encoding (gzip, ...): bodies are asked for and read as the plain bytes they are, never inflated."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise FetchError("only http:// and https:// URLs are fetched")
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity",
                                                   **(headers or {})})
    try:
        response = _opener().open(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise FetchError(f"HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
        raise FetchError(f"cannot download it ({getattr(e, 'reason', e)})") from None
    encoding = (response.headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
        response.close()
        raise FetchError(f"the server sent a {encoding[:20]}-encoded body; only plain bytes are read")
    return response


def declared_length(response: http.client.HTTPResponse) -> int | None:
    """The Content-Length a response announces, or None when it announces none."""
    declared = response.headers.get("Content-Length")
    return int(declared) if declared and declared.isdigit() else None


def capped_chunks(response: http.client.HTTPResponse, max_bytes: int) -> Iterator[bytes]:
    """The body in chunks as they arrive; FetchError once it is announced or sent over ``max_bytes``, or ends short
    of its announced length."""
    expected = declared_length(response)
    if expected is not None and expected > max_bytes:
        raise FetchError(f"the server announces {expected} bytes, more than the cap of {max_bytes}")
    received = 0
    try:
        while chunk := response.read1(min(CHUNK, max_bytes + 1 - received)):  # what has arrived, so progress moves
            received += len(chunk)
            if received > max_bytes:
                raise FetchError(f"more than the cap of {max_bytes} bytes; refused")
            yield chunk
    except (OSError, http.client.HTTPException) as e:  # timeouts, resets, a truncated chunked body
        raise FetchError(f"the download failed after {received} bytes ({type(e).__name__}: {e})") from None
    if expected is not None and received != expected:
        raise FetchError(f"the connection closed after {received} of {expected} bytes")


def read_url(url: str, max_bytes: int, timeout: float) -> bytes:
    """The whole body of ``url`` (a small file, an image to decode), at most ``max_bytes``."""
    with open_url(url, timeout) as response:
        return b"".join(capped_chunks(response, max_bytes))


def fetch_to_file(url: str, target: Path, max_bytes: int, timeout: float, progress: str | None = None) -> int:
    """Stream ``url`` into ``target`` (a temporary name the caller renames), flushed to disk; the bytes written.

    ``progress`` labels a progress bar on stderr (None: no bar). FetchError for a failed download, OSError for a
    file that cannot be written; the caller removes ``target`` on failure.
    """
    with open_url(url, timeout) as response, open(target, "wb") as out:
        with tqdm(total=declared_length(response), unit="B", unit_scale=True, unit_divisor=1024, desc=progress,
                  disable=progress is None) as bar:
            written = 0
            for chunk in capped_chunks(response, max_bytes):
                out.write(chunk)
                written += len(chunk)
                bar.update(len(chunk))
        out.flush()
        os.fsync(out.fileno())
    return written


CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def read_at_most(response: http.client.HTTPResponse, count: int) -> bytes:
    """At most ``count`` bytes of a body (fewer when it ends first), whatever the server announced or sends."""
    parts, received = [], 0
    try:
        while received < count and (chunk := response.read(min(CHUNK, count - received))):
            parts.append(chunk)
            received += len(chunk)
    except (OSError, http.client.HTTPException) as e:
        raise FetchError(f"the transfer failed after {received} bytes ({type(e).__name__}: {e})") from None
    return b"".join(parts)


def fetch_range(url: str, start: int, end: int, timeout: float) -> bytes:
    """Bytes ``[start, end)`` of ``url`` by one range request. At most ``end - start`` bytes are read whatever the
    server announces or sends (a 2 GB answer to a 1 KB request costs 1 KB); the answer must be 206 for a range
    starting at ``start`` and inside the one asked for (or 200 for a range from 0: its first bytes), unencoded.
    Fewer bytes come back when the file ends first. FetchError otherwise."""
    with open_url(url, timeout, {"Range": f"bytes={start}-{end - 1}"}) as response:
        if response.status == 206:
            given = CONTENT_RANGE.fullmatch((response.headers.get("Content-Range") or "").strip())
            if given is None or int(given[1]) != start or int(given[2]) < start:
                raise FetchError(f"the server answered bytes {str(response.headers.get('Content-Range'))[:40]} to a "
                                 f"request for bytes {start}-{end - 1}")
            return read_at_most(response, min(int(given[2]) + 1, end) - start)
        if response.status == 200 and start == 0:
            return read_at_most(response, end)
        raise FetchError(f"the server ignored the byte range (HTTP {response.status}); shards need a server that "
                         "answers range requests")


class RangedFile:
    """A read-only file of the bytes ``[start, end)`` of an http(s) URL: reads are served from blocks of at least
    ``block`` bytes fetched by ``fetch_range`` (so each body is read with the cap of its range). With ``end`` None
    it is the whole body of one plain request, read front to back: its reader caps how much it reads, and a
    ``cap`` refuses a body announced larger before any of it is read."""

    def __init__(self, url: str, start: int = 0, end: int | None = None, block: int = 4 << 20,
                 timeout: float = 60.0, cap: int | None = None) -> None:
        self.url, self.position, self.end, self.block, self.timeout, self.cap = url, start, end, block, timeout, cap
        self.buffer, self.buffer_start = b"", start
        self.stream: http.client.HTTPResponse | None = None

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence != os.SEEK_SET or self.end is None:
            raise OSError("a ranged http file seeks to absolute offsets only")
        self.position = int(offset)
        return self.position

    def read(self, size: int = -1) -> bytes:
        if self.end is None:
            if size is None or size < 0:
                raise OSError("reading a whole http body needs a size (a cap)")
            if self.stream is None:
                self.stream = open_url(self.url, self.timeout)
                declared = declared_length(self.stream)
                if self.cap is not None and declared is not None and declared > self.cap:
                    raise FetchError(f"the server announces {declared} bytes, more than the cap of {self.cap}")
            data = read_at_most(self.stream, size)
        else:
            size = self.end - self.position if size is None or size < 0 else min(size, self.end - self.position)
            if size <= 0:
                return b""
            offset = self.position - self.buffer_start
            if offset < 0 or offset + size > len(self.buffer):
                stop = min(self.end, self.position + max(size, self.block))
                self.buffer, self.buffer_start, offset = fetch_range(self.url, self.position, stop, self.timeout), \
                    self.position, 0
            data = self.buffer[offset:offset + size]
        self.position += len(data)
        return data

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        self.buffer = b""

    def __enter__(self) -> RangedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
