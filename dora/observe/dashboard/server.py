"""The dashboard's HTTP server: the page at /, the state JSON at /api/state, nothing else.

Binds 127.0.0.1 by default. Runs on its own daemon thread and never touches run objects: it
serves whatever bytes `state()` returns (RunState.latest in a live run; RUN_DIR/state.json
read afresh for `dora dashboard`). A port that is taken falls back to a free one, and
`url`/`note` say so.
"""

from __future__ import annotations

import errno
import http.server
import threading
import time
from typing import Callable

from dora.observe.dashboard.page import page_html

DEFAULT_PORT = 8765


class _Handler(http.server.BaseHTTPRequestHandler):
    server: "_Server"

    def do_GET(self) -> None:   # noqa: N802 (http.server's name)
        t = time.thread_time()
        try:
            self._get()
        finally:
            with self.server.lock:
                self.server.cpu_s += time.thread_time() - t
                self.server.requests += 1

    def _get(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send(200, "text/html; charset=utf-8", self.server.page)
        elif path == "/api/state":
            try:
                body = self.server.state()
            except Exception as e:   # e.g. state.json unreadable: say so, keep serving
                self._send(503, "text/plain; charset=utf-8", f"state unavailable: {type(e).__name__}: {e}".encode())
                return
            self._send(200, "application/json", body)
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found: the dashboard serves / and /api/state\n")

    def _send(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:   # quiet: the run's output stays readable
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False     # a port in use must be seen as taken

    def __init__(self, addr, state: Callable[[], bytes]):
        self.state = state
        self.page = page_html().encode()
        self.lock = threading.Lock()
        self.cpu_s, self.requests = 0.0, 0     # CPU time spent answering, for the overhead benchmark
        super().__init__(addr, _Handler)


class DashboardServer:
    def __init__(self, state: Callable[[], bytes], port: int = DEFAULT_PORT, host: str = "127.0.0.1"):
        self.note: str | None = None
        try:
            self.httpd = _Server((host, port), state)
        except OSError as e:
            if e.errno not in (errno.EADDRINUSE, errno.EACCES) or port == 0:
                raise
            self.httpd = _Server((host, 0), state)
            why = "is taken" if e.errno == errno.EADDRINUSE else "is not allowed"
            self.note = f"port {port} {why}; serving on port {self.httpd.server_address[1]} instead"
        self.host, self.port = host, int(self.httpd.server_address[1])
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> "DashboardServer":
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.5},
                                       name="dora-dashboard", daemon=True)
        self.thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve on this thread until interrupted (Ctrl-C)."""
        self.httpd.serve_forever(poll_interval=0.5)

    def close(self) -> None:
        if self.thread is not None:
            self.httpd.shutdown()
            self.thread.join(timeout=5)
        self.httpd.server_close()

