"""The one way kai-es starts a real browser: Debian's `chromium` package, headless, driven by
Playwright's Python driver (never `playwright install`: no browser is downloaded).

Contract: `launch(pw)` returns a Playwright `Browser` for the `chromium` on PATH (else
/usr/bin/chromium), or raises `ChromiumDidNotStart` naming the executable and why. Callers
report that failure (tests/test_serve_browser.py fails, tools/bench/bench_serve.py exits 1);
neither skips.
"""

from __future__ import annotations

import shutil
from typing import Any

FALLBACK = "/usr/bin/chromium"
ARGS = ("--headless=new", "--no-sandbox")


class ChromiumDidNotStart(RuntimeError):
    """Headless Chromium could not be launched; the message names the executable and the cause."""


def executable() -> str:
    return shutil.which("chromium") or FALLBACK


def launch(pw: Any) -> Any:
    """A headless Chromium browser from `pw` (what `sync_playwright()` yields)."""
    path = executable()
    try:
        return pw.chromium.launch(executable_path=path, args=list(ARGS))
    except Exception as exc:  # noqa: BLE001 - whatever Playwright raises, reported with the path
        raise ChromiumDidNotStart(f"headless Chromium ({path}) did not start: {exc}") from exc
