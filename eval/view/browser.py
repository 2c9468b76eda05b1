"""Headless Chromium for the viewer's tests and its benchmark: Debian's /usr/bin/chromium driven by Playwright
(pip's playwright, never `playwright install`: no browser download), with a fresh profile and nothing that calls out
(no background networking, component updates or sync)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]  # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start


@contextlib.contextmanager
def chromium(width: int = 1400, height: int = 1000, timeout_ms: int = 10_000):
    """A Playwright browser context of Debian's Chromium, headless, in a new temporary profile."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="viewer-chromium-") as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(profile, executable_path=str(CHROMIUM), args=ARGS,
                                                       viewport={"width": width, "height": height})
        context.set_default_timeout(timeout_ms)
        try:
            yield context
        finally:
            context.close()
