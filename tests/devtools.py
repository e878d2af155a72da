"""A real headless Chromium driven over the DevTools protocol, for the pages quantgate writes (report.html,
review.html).

The protocol runs over `--remote-debugging-pipe` (fds 3 and 4, NUL-separated JSON), so no selenium, chromedriver or
websocket package is needed. The `browser` fixture skips when no Chromium is installed, and fails instead under
QUANTGATE_REQUIRE_BROWSER=1 (CI installs it: apt-get install -y chromium).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
)
TIMEOUT_S = 60.0


def chromium() -> str | None:
    for name in (os.environ.get("QUANTGATE_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class DevToolsBrowser:
    """Just enough of the Chrome DevTools protocol: one page, commands, and the events it sends."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def wire_pipes() -> None:  # in the child: chrome reads commands on fd 3, writes replies on fd 4
            os.dup2(to_chrome_r, 100)
            os.dup2(from_chrome_w, 101)
            os.dup2(100, 3)
            os.dup2(101, 4)

        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            close_fds=False,  # fds 3 and 4 must survive exec; the pipes' own fds are close-on-exec
            preexec_fn=wire_pipes,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def open_page(self) -> None:
        target = self.call("Target.createTarget", {"url": "about:blank"}, browser=True)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True}, browser=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})

    def call(self, method: str, params: dict[str, Any] | None = None, *, browser: bool = False) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if not browser:
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._event(reply)

    def wait_for(self, method: str, after: int = 0) -> dict[str, Any]:
        """The first `method` event from the `after`-th event on (a second page load must not take the first's)."""
        for event in self.events[after:]:
            if event.get("method") == method:
                return event
        while True:
            event = self._read()
            self._event(event)
            if event.get("method") == method:
                return event

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise AssertionError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        try:
            self.call("Browser.close", browser=True)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            os.close(fd)

    def _event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        if event.get("method") == "Page.javascriptDialogOpening":  # answer it, or the page hangs
            self.call("Page.handleJavaScriptDialog", {"accept": True})

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT_S
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_chrome], [], [], max(left, 0))
            if not ready:
                raise AssertionError(f"no DevTools message from Chromium within {TIMEOUT_S:.0f} s")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                stderr = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.stderr else ""
                raise AssertionError(f"Chromium closed the DevTools pipe; stderr tail:\n{stderr}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    # what a page did that a report must never do
    def dialogs(self) -> list[dict[str, Any]]:
        return [e["params"] for e in self.events if e.get("method") == "Page.javascriptDialogOpening"]

    def console_problems(self) -> list[str]:
        problems = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                problems.append(f"uncaught: {params.get('exceptionDetails', {}).get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                problems.append(f"console.{params['type']}: {[a.get('value') for a in params.get('args', [])]}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
                problems.append(f"log {params['entry'].get('source')}: {params['entry'].get('text')}")
        return problems

    def requested_urls(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]


@pytest.fixture
def browser(tmp_path: Path):
    binary = chromium()
    if binary is None:
        if os.environ.get("QUANTGATE_REQUIRE_BROWSER") == "1":  # CI: the browser check must run, never skip
            pytest.fail("Chromium is not installed but QUANTGATE_REQUIRE_BROWSER=1 (apt-get install -y chromium)")
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    instance = DevToolsBrowser(binary, tmp_path / "chromium-profile")
    try:
        instance.open_page()
        yield instance
    finally:
        instance.close()


def load_page(browser: DevToolsBrowser, page: Path) -> None:
    seen = len(browser.events)
    browser.call("Page.navigate", {"url": page.resolve().as_uri()})
    browser.wait_for("Page.loadEventFired", after=seen)
