"""`quantgate review --serve`: the review page from 127.0.0.1, its Save writing review-NAME.jsonl straight into the
run directory (each line checked as `report --reviews` checks it: a bad one is refused with its reason)."""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

from harness.errors import UserError

NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
MAX_BODY = 16 * 2**20


def make_server(run_dir: Path, page: str, check_lines: Callable[[Path], Any], port: int = 0) -> ThreadingHTTPServer:
    """A server (not yet serving) for the page; check_lines(path) raises UserError for a file it would refuse."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # the command prints what matters
            pass

        def _reply(self, status: int, body: str, kind: str = "text/plain; charset=utf-8") -> None:
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if urlparse(self.path).path in ("/", "/review.html"):
                self._reply(200, page, "text/html; charset=utf-8")
            else:
                self._reply(404, "not found")

        def do_POST(self) -> None:
            url = urlparse(self.path)
            reviewer = (parse_qs(url.query).get("reviewer") or [""])[0]
            if url.path != "/judgments":
                return self._reply(404, "not found")
            if not NAME.fullmatch(reviewer):
                return self._reply(400, "reviewer: letters, digits, - and _ only")
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY:
                return self._reply(400, "no judgments in the request")
            body = self.rfile.read(length).decode("utf-8", errors="replace")
            target = run_dir / f"review-{reviewer}.jsonl"
            staged = run_dir / f".review-{reviewer}.jsonl.part"
            staged.write_text(body, encoding="utf-8")
            try:
                check_lines(staged)
            except UserError as exc:
                staged.unlink(missing_ok=True)
                return self._reply(422, str(exc).replace(str(staged), target.name))
            staged.replace(target)
            self._reply(200, str(target))

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="quantgate-review", daemon=True)
    thread.start()
    return thread
