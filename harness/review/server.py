"""`quantgate review --serve`: the review page from 127.0.0.1 only, its Save adding review-NAME.jsonl lines to the
run directory (each line checked as `report --reviews` checks it, and against the session's reviewer).

Only the page itself may save: a request whose Host is not this server's (DNS rebinding), or whose Origin or
Sec-Fetch-Site says another site sent it (a cross-origin form or fetch, which needs no preflight for text/plain),
is refused with 403 before anything is read.
"""

from __future__ import annotations

import errno
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

from harness.errors import UserError

NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
MAX_BODY = 16 * 2**20
HOST = "127.0.0.1"


class ReviewServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line on stderr for a request that failed (a client that went away, say), never a traceback."""
        exc = sys.exc_info()[1]
        print(f"quantgate review: a request from {client_address[0]} failed ({type(exc).__name__}: {exc})",
              file=sys.stderr)


def make_server(page: str, save: Callable[[str, str], str], port: int = 0) -> ReviewServer:
    """A server (not yet serving) for the page on 127.0.0.1; save(reviewer, body) stores one save and says where,
    or raises UserError for a save it refuses. A port that cannot be bound is a UserError."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: not a port; give 1 to 65535, or leave --port out for a free one")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # the command prints what matters
            pass

        def _reply(self, status: int, body: str, kind: str = "text/plain; charset=utf-8") -> None:
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(data)

        def _foreign(self) -> str | None:
            """Why the request does not come from the page on this server; None when it does."""
            bound = self.server.server_address[1]
            ours = {f"127.0.0.1:{bound}", f"localhost:{bound}"}
            host = (self.headers.get("Host") or "").strip().lower()
            if host not in ours:
                return f"Host {host or '(none)'!r}: this server answers http://127.0.0.1:{bound}/ only"
            origin = self.headers.get("Origin")
            if origin is not None and origin.strip().lower() not in {f"http://{h}" for h in ours}:
                return f"Origin {origin!r}: only the review page served here may save"
            site = self.headers.get("Sec-Fetch-Site")
            if site is not None and site.strip().lower() not in ("same-origin", "none"):
                return f"Sec-Fetch-Site {site!r}: only the review page served here may save"
            return None

        def do_GET(self) -> None:
            if (why := self._foreign()) is not None:
                return self._reply(403, why)
            if urlparse(self.path).path in ("/", "/review.html"):
                self._reply(200, page, "text/html; charset=utf-8")
            else:
                self._reply(404, "not found")

        def do_POST(self) -> None:
            if (why := self._foreign()) is not None:
                self.close_connection = True
                return self._reply(403, why)
            url = urlparse(self.path)
            reviewer = (parse_qs(url.query).get("reviewer") or [""])[0]
            if url.path != "/judgments":
                return self._reply(404, "not found")
            if not NAME.fullmatch(reviewer):
                return self._reply(400, "reviewer: letters, digits, - and _ only")
            raw = (self.headers.get("Content-Length") or "").strip()
            if not (raw.isascii() and raw.isdigit()):
                self.close_connection = True  # the body's end is unknown: the connection cannot be reused
                return self._reply(400, f"Content-Length {raw!r}: not a byte count")
            length = int(raw)
            if length == 0:
                return self._reply(400, "no judgments in the request")
            if length > MAX_BODY:
                self.close_connection = True
                return self._reply(413, f"{length:,} bytes: a save is at most {MAX_BODY:,}")
            body = self.rfile.read(length).decode("utf-8", errors="replace")
            try:
                return self._reply(200, save(reviewer, body))
            except UserError as exc:
                return self._reply(422, str(exc))
            except OSError as exc:
                return self._reply(500, f"{exc.filename or 'the run directory'}: cannot write ({exc.strerror or exc})")

    try:
        return ReviewServer((HOST, port), Handler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"--port {port}: already in use on {HOST}; give another port, or leave --port out for "
                            "a free one") from None
        raise UserError(f"--port {port}: cannot serve on {HOST} ({exc.strerror or exc}); give another port, or "
                        "leave --port out for a free one") from None


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="quantgate-review", daemon=True)
    thread.start()
    return thread
