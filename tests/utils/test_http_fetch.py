"""utils/http_fetch.py: the byte cap (announced and sent), short bodies, HTTP errors, against a loopback server."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from utils import http_fetch
from utils.http_fetch import FetchError


class Handler(http.server.BaseHTTPRequestHandler):
    """/ok: 5000 bytes; /liar: announces 5000, sends 100; /nolength: 5000 bytes without Content-Length."""

    def do_GET(self) -> None:  # noqa: N802 (the http.server API)
        body = bytes(range(250)) * 20
        if self.path.startswith("/to/"):  # /to/<url>: a 302 redirect to <url>
            self.send_response(302)
            self.send_header("Location", self.path[len("/to/"):])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/missing":
            self.send_error(404)
            return
        self.send_response(200)
        if self.path != "/nolength":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[:100] if self.path == "/liar" else body)
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def base_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_body_within_the_cap_is_read_whole(base_url: str, tmp_path: Path) -> None:
    body = bytes(range(250)) * 20
    assert http_fetch.read_url(f"{base_url}/ok", 5000, timeout=10) == body
    assert http_fetch.read_url(f"{base_url}/nolength", 5000, timeout=10) == body
    assert http_fetch.fetch_to_file(f"{base_url}/ok", tmp_path / "f", 5000, timeout=10) == 5000
    assert (tmp_path / "f").read_bytes() == body


@pytest.mark.parametrize("path, cap, reason", [
    ("/ok", 4999, "the server announces 5000 bytes, more than the cap of 4999"),
    ("/nolength", 4999, "more than the cap of 4999 bytes; refused"),
    ("/liar", 10_000, "the connection closed after 100 of 5000 bytes"),
    ("/missing", 10_000, "HTTP 404"),
])
def test_refusals_and_failures_give_the_bare_reason(base_url: str, tmp_path: Path, path: str, cap: int,
                                                    reason: str) -> None:
    with pytest.raises(FetchError, match=reason) as info:
        http_fetch.fetch_to_file(f"{base_url}{path}", tmp_path / "f", cap, timeout=10)
    assert "\n" not in str(info.value) and base_url not in str(info.value)
    assert (tmp_path / "f").stat().st_size <= cap if (tmp_path / "f").exists() else True


def test_other_schemes_and_dead_servers_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="only http:// and https://"):
        http_fetch.read_url(f"file://{tmp_path}", 10, timeout=1)
    with pytest.raises(FetchError, match="cannot download it"):
        http_fetch.read_url("http://127.0.0.1:9/x", 10, timeout=2)  # the discard port: nothing listens


def test_redirects_stay_on_http_and_under_the_cap(base_url: str, tmp_path: Path) -> None:
    """Finding 10 of issue 31: a 302 to ftp:// (or file://) is refused in one line, and the other server is never
    contacted; a redirect within http(s) is followed and its body capped as any other."""
    import socket

    with socket.socket() as listener:  # stands for an FTP server: it must see no connection
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        for target in (f"ftp://127.0.0.1:{port}/x", "file:///etc/hostname", f"gopher://127.0.0.1:{port}/x"):
            with pytest.raises(FetchError, match="redirected to a .* URL; only http") as info:
                http_fetch.read_url(f"{base_url}/to/{target}", 10_000, timeout=3)
            assert "\n" not in str(info.value)
        with pytest.raises(TimeoutError):
            listener.accept()
    assert http_fetch.read_url(f"{base_url}/to/{base_url}/ok", 5000, timeout=10) == bytes(range(250)) * 20
    with pytest.raises(FetchError, match="more than the cap of 4999"):
        http_fetch.fetch_to_file(f"{base_url}/to/{base_url}/nolength", tmp_path / "f", 4999, timeout=10)
