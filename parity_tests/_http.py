"""A loopback HTTP server for testing downloads offline.

Set no_proxy=127.0.0.1 while using it, so that a proxy from the environment stays out of the way.

    with serve(folder) as base_url:  # 'http://127.0.0.1:PORT/'
        fetch(base_url + 'a.bin', ...)            # the file folder/a.bin
        fetch(base_url + 'truncated/a.bin', ...)  # announces its full size, sends half, hangs up

Where the host refuses TCP sockets even on the loopback (a sandboxed TPU VM's: errno 97), `serve`
and `closed_port_url` skip the test with the reason, as does `skip_without_tcp` (test_launch).
"""

import contextlib
import functools
import http.server
import pathlib
import socket
import threading

import pytest


class _Handler(http.server.BaseHTTPRequestHandler):
    root: pathlib.Path  # set per server by `serve`

    def do_GET(self):
        path = self.root / self.path.rsplit('/', 1)[-1]
        if not path.is_file():
            return self.send_error(404)
        body = path.read_bytes()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if self.path.startswith('/truncated/') else body)
        self.close_connection = True  # the client sees EOF right after what was sent

    def log_message(self, *args):  # keep pytest's output clean
        pass


@functools.cache
def tcp_refused() -> str:
    """'' where this host lets a test open a loopback TCP socket, else why not (probed once)."""
    try:
        with socket.socket() as s:
            s.bind(('127.0.0.1', 0))
        return ''
    except OSError as e:
        return f'this host refuses TCP sockets, even on the loopback ({e})'


def skip_without_tcp(needs: str) -> None:
    """Skips the calling test, naming what `needs` the socket, where the host refuses them."""
    if reason := tcp_refused():
        pytest.skip(f'{reason}: {needs}')


@contextlib.contextmanager
def serve(folder: pathlib.Path):
    """Serve the files in `folder` on 127.0.0.1 from a thread; yields the base URL."""
    skip_without_tcp('the downloads are served by a loopback HTTP server')
    handler = type('Handler', (_Handler,), {'root': pathlib.Path(folder)})
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f'http://127.0.0.1:{httpd.server_port}/'
    finally:
        httpd.shutdown()  # waits at most one 0.01 s poll
        httpd.server_close()
        thread.join()


def closed_port_url() -> str:
    """A loopback URL nobody listens on: connecting is refused at once, as when offline."""
    skip_without_tcp('a closed loopback port stands for being offline')
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    return f'http://127.0.0.1:{port}/'
