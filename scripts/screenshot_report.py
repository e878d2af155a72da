"""The README's picture of the HTML report: the first screen of a report.html, in a real headless Chromium.

    .venv/bin/python scripts/screenshot_report.py reports/example/report.html docs/img/report-first-screen.png
"""

from __future__ import annotations

import base64
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from devtools import DevToolsBrowser, chromium, load_page  # noqa: E402 (the tests' DevTools driver)


def main(page: str, out: str, width: int = 1280, height: int = 900) -> int:
    binary = chromium()
    if binary is None:
        print("no Chromium found (apt-get install -y chromium, or set QUANTGATE_CHROMIUM)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as profile:
        browser = DevToolsBrowser(binary, Path(profile))
        try:
            browser.open_page()
            browser.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                                "deviceScaleFactor": 1, "mobile": False})
            load_page(browser, Path(page))
            data = browser.call("Page.captureScreenshot", {"format": "png"})["data"]
        finally:
            browser.close()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_bytes(base64.b64decode(data))
    print(out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
