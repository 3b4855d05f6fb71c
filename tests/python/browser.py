"""A real browser for the tests of the web pages: Debian's Chromium, driven by
Playwright (the Python `playwright` package; its own browser download is never
used: Chromium is launched from /usr/bin/chromium, headless, with --no-sandbox).

`browser` (module-scoped fixture) launches Chromium once per test module.
`pages` (per test) gives pages in a fresh browser context, records every console
error and uncaught exception of those pages, and fails the test if any page
logged one (except the 404 of the browser's own /favicon.ico request); where a
test provokes network errors on purpose (it kills the server under a page), it
allows their messages with `pages.allow(regex)`.

Screenshots go to <repo>/target/test-artifacts/screenshots/ (created on demand),
named <test>-<label>.png, so a run leaves pictures of every page it checked; a
failing test also gets one of each of its open pages (<test>-failed-<n>.png).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from conftest import REPO

CHROMIUM = Path(os.environ.get("THRONG_CHROMIUM") or "/usr/bin/chromium")
SCREENSHOTS = REPO / "target" / "test-artifacts" / "screenshots"
# How long Playwright waits for a page to get to a state (ms): actions, waits and
# `expect(...)` assertions alike, unless a test says otherwise.
TIMEOUT_MS = 10_000
expect.set_options(timeout=TIMEOUT_MS)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:120]


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"Chromium not found at {CHROMIUM} (scripts/test.sh installs Debian's chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"], headless=True)
        try:
            yield b
        finally:
            b.close()


class Pages:
    """The pages of one test, in one browser context."""

    def __init__(self, browser, test_name: str):
        self.test = _safe(test_name)
        self.context = browser.new_context(viewport={"width": 1200, "height": 800})
        self.context.set_default_timeout(TIMEOUT_MS)
        self.pages = []
        self.errors: list[str] = []
        # Chromium asks every origin for /favicon.ico by itself; a page that declares
        # no icon gets that request's 404 logged, which is not the page's error.
        self.allowed: list[re.Pattern] = [re.compile(r"status of 404 .*\(https?://[^/]+/favicon\.ico:")]

    def allow(self, pattern: str) -> None:
        """Console errors matching `pattern` (re.search) do not fail the test."""
        self.allowed.append(re.compile(pattern))

    def new(self, label: str = "page"):
        page = self.context.new_page()
        self.pages.append(page)

        def on_console(msg, label=label):
            if msg.type == "error":
                loc = msg.location or {}
                where = f" ({loc.get('url')}:{loc.get('lineNumber')})" if loc.get("url") else ""
                self.errors.append(f"[{label}] console.error: {msg.text}{where}")

        def on_pageerror(err, label=label):
            self.errors.append(f"[{label}] uncaught exception: {err}")

        page.on("console", on_console)
        page.on("pageerror", on_pageerror)
        return page

    def unexpected_errors(self) -> list[str]:
        def allowed(e: str) -> bool:
            return "uncaught exception" not in e and any(p.search(e) for p in self.allowed)

        return [e for e in self.errors if not allowed(e)]

    def assert_no_errors(self) -> None:
        bad = self.unexpected_errors()
        assert not bad, "the pages logged errors:\n" + "\n".join(bad)

    def screenshot(self, page, label: str, full_page: bool = True) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{self.test}-{_safe(label)}.png"
        page.screenshot(path=str(path), full_page=full_page)
        return path

    def close(self, failed: bool) -> None:
        if failed:
            for i, page in enumerate(self.pages):
                if not page.is_closed():
                    try:
                        self.screenshot(page, f"failed-{i}")
                    except Exception:
                        pass
        self.context.close()


@pytest.fixture
def pages(browser, request):
    failed_before = request.session.testsfailed
    p = Pages(browser, request.node.name)
    yield p
    # The call's report is logged before fixtures are torn down.
    failed = request.session.testsfailed > failed_before
    p.close(failed)
    if not failed:
        p.assert_no_errors()
