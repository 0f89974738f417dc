"""Byte-capped http(s) fetching: the one streaming reader behind data-set, image and weights downloads.

A URL's body is read in chunks and refused once the server announces or sends more than the caller's cap, or
closes before the length it announced. Failures raise :class:`FetchError` whose message is the bare reason
(``HTTP 404 Not Found``, ``more than the cap of N bytes; refused``); each caller turns it into its own one-line
error with the URL or file it was fetching. Redirects are followed only to http(s) URLs (never ftp://, file://,
data: ...), never from https:// down to http://, and at most MAX_REDIRECTS times; the body after them meets the
same cap.
"""

from __future__ import annotations

import http.client
import os
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


def open_url(url: str, timeout: float) -> http.client.HTTPResponse:
    """The open response of an http(s) ``url``; FetchError for another scheme or a failed request."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise FetchError("only http:// and https:// URLs are fetched")
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    try:
        return _opener().open(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise FetchError(f"HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
        raise FetchError(f"cannot download it ({getattr(e, 'reason', e)})") from None


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
