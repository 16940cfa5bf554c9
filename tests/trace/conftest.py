"""Fixtures for the trace tests: the traces under tests/trace/fixtures and a headless Chromium
for the `browser` tier (`make browser`)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from trace_helpers import CHROMIUM_ARGS, FIXTURES


@pytest.fixture
def load_trace() -> Callable[[str], dict[str, Any]]:
    """A fixture trace, read afresh (tests may mutate it)."""

    def load(name: str) -> dict[str, Any]:
        trace: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text("utf-8"))
        return trace

    return load


# --- the browser tier ---

@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """A headless Debian Chromium driven by Playwright (never `playwright install`: the browser
    is the system's). Skipped where either is missing, unless QRUN_REQUIRE_BROWSER=1 (set by
    `make browser`, so CI fails instead of skipping)."""
    executable = os.environ.get("QRUN_CHROMIUM", "/usr/bin/chromium")
    required = os.environ.get("QRUN_REQUIRE_BROWSER") == "1"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if required:
            pytest.fail("playwright is not installed (make browser installs it)")
        pytest.skip("playwright is not installed (make browser installs it)")
    if shutil.which(executable) is None:
        if required:
            pytest.fail(f"{executable} not found (make browser installs Debian's chromium)")
        pytest.skip(f"{executable} not found (make browser installs Debian's chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
