#!/usr/bin/env python3
"""Screenshot a trace's page (docs/trace.png, the README's picture of a run): render the trace
JSON with qrun.trace, open it in Debian's headless chromium through Playwright, hover one token
so the inspector shows, and save the page from its header to the holes table.

    .venv/bin/python scripts/trace-screenshot.py [TRACE.json] [OUT.png] [--hover EVENT]

`make trace-screenshot` runs it on tests/trace/fixtures/review.json (after `make browser`'s
set-up: chromium from apt, playwright from pip; never `playwright install`)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from qrun.trace import validate, write_html

# The flags of the browser tier (tests/trace/trace_helpers.py CHROMIUM_ARGS).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", nargs="?", default="tests/trace/fixtures/review.json")
    parser.add_argument("out", nargs="?", default="docs/trace.png")
    parser.add_argument("--hover", type=int, default=None,
                        help="index of the event to hover (default: the third token of the "
                             "last hole, or the nearest before it with alternatives)")
    parser.add_argument("--width", type=int, default=1000, help="viewport width in CSS pixels")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--full", action="store_true", help="the whole page, stats included")
    args = parser.parse_args(argv)

    trace = validate(json.loads(Path(args.trace).read_text(encoding="utf-8")))
    hover = args.hover if args.hover is not None else default_hover(dict(trace))
    with tempfile.TemporaryDirectory() as tmp:
        page_path = Path(tmp) / "trace.html"
        write_html(trace, page_path)
        shoot(page_path, Path(args.out), hover, args)
    print(f"{args.out}: {Path(args.out).stat().st_size // 1024} KB, hovering event {hover}")
    return 0


def default_hover(trace: dict[str, Any]) -> int:
    """A token worth inspecting whose inspector hides little: the last hole is usually the
    text's last line, so the inspector opens over the prompt above it."""
    last = next((h for h in reversed(trace["holes"]) if h["first_event"] is not None), None)
    if last is None:
        return 0
    wanted = min(last["first_event"] + 2, last["last_event"])
    with_top = [i for i in range(last["first_event"], wanted + 1) if trace["events"][i]["top"]]
    return with_top[-1] if with_top else wanted


def shoot(page_path: Path, out: Path, hover: int, args: argparse.Namespace) -> None:
    from playwright.sync_api import sync_playwright  # the browser tier's dependency only

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": args.width, "height": 700})
            page.goto(page_path.as_uri())
            page.hover(f'#text .t[data-i="{hover}"]')
            last = "body" if args.full else "#holes"
            bottom = page.locator(last).evaluate(
                "e => e.getBoundingClientRect().bottom + window.scrollY")
            tip = page.locator("#tip").evaluate(
                "e => e.getBoundingClientRect().bottom + window.scrollY")
            height = int(max(bottom, tip)) + 12
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), full_page=True,
                            clip={"x": 0, "y": 0, "width": args.width, "height": height})
        finally:
            browser.close()


if __name__ == "__main__":
    sys.exit(main())
