"""The trace page in a real headless Chromium (the `browser` tier, `make browser`): it renders
without a script error, shows every hole, and hovering or focusing a token shows its data.
A hostile trace runs no script of its own and fetches nothing."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from trace_helpers import FIXTURE_NAMES, synthetic_trace

from qrun.trace import write_html

pytestmark = pytest.mark.browser

Load = Callable[[str], dict[str, Any]]


class Opened:
    """A page with everything it reported: console errors, uncaught exceptions, dialogs
    (an injected alert() would open one) and the URLs it requested."""

    def __init__(self, page: Any, url: str) -> None:
        self.page = page
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.requests: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("dialog", self._dialog)
        page.on("request", lambda r: self.requests.append(r.url))
        page.goto(url)
        self.url = page.url

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def tip(self) -> str:
        tip = self.page.locator("#tip")
        assert tip.is_visible()
        return str(tip.inner_text())

    def assert_clean(self) -> None:
        assert self.errors == []
        assert self.dialogs == []
        assert self.requests == [self.url]  # the file itself, nothing else


@pytest.fixture
def open_trace(chromium: Any, tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], Opened]]:
    contexts: list[Any] = []

    def open_(trace: dict[str, Any]) -> Opened:
        path = tmp_path / f"trace{len(contexts)}.html"
        write_html(trace, path)
        context = chromium.new_context(viewport={"width": 1100, "height": 800})
        contexts.append(context)
        return Opened(context.new_page(), path.as_uri())

    yield open_
    for context in contexts:
        context.close()


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_the_page_renders_and_shows_every_hole(load_trace: Load, open_trace: Any,
                                              name: str) -> None:
    trace = load_trace(name)
    opened = open_trace(trace)
    page = opened.page
    assert page.locator("#text .t").count() == len(trace["events"])
    for hole in trace["holes"]:
        box = page.locator(f"#hole-{hole['index']}")
        assert box.is_visible()
        # The name label is drawn by CSS from data-label.
        label = box.evaluate("e => getComputedStyle(e, '::before').content")
        assert label.startswith('"') and label != '""'
        row = page.locator(f"#h-{hole['index']}")
        assert row.is_visible()
        assert row.locator("td.name").inner_text() == hole["name"]
    assert page.locator("#stats table").is_visible()
    opened.assert_clean()


def test_hovering_a_sampled_token_shows_its_data(load_trace: Load, open_trace: Any) -> None:
    trace = load_trace("kinds")
    opened = open_trace(trace)
    page = opened.page
    assert page.locator("#tip").is_hidden()
    page.hover('#text .t[data-i="18"]')  # healed " Par", in hole "city"
    tip = opened.tip()
    for shown in ('" Par"', "healed", "7042", "city (#0)", "-0.1050", "90.0%",
                  "2210 tokens allowed", '" Lyon"', "5.5%", "-2.900", '" Mars"'):
        assert shown in tip, shown
    page.hover('#text .t[data-i="20"]')  # the "\n" that overshot the stop
    tip = opened.tip()
    assert '"\\n"' in tip and "rolled back (stop)" in tip
    page.hover('#text .t[data-i="33"]')  # a losing select option's token
    assert '" no", 12.7% of the options' in opened.tip()
    page.mouse.move(5, 5)
    assert page.locator("#tip").is_hidden()
    opened.assert_clean()


def test_the_tokens_are_styled_by_kind(load_trace: Load, open_trace: Any) -> None:
    opened = open_trace(load_trace("kinds"))

    def style(index: int, prop: str) -> str:
        return str(opened.page.locator(f'#text .t[data-i="{index}"]').evaluate(
            f"e => getComputedStyle(e).{prop}"))

    assert "line-through" in style(20, "textDecorationLine")  # rolled back
    assert "line-through" not in style(19, "textDecorationLine")
    assert style(0, "borderTopStyle") == "solid"  # cached
    assert style(4, "borderTopStyle") == "none"
    assert style(25, "borderBottomStyle") == "dashed"  # forced
    assert style(18, "borderBottomStyle") == "double"  # healed
    assert style(19, "backgroundColor") != style(40, "backgroundColor")  # p 0.998 vs 0.0055
    # The newline glyph is drawn, and is not part of the text.
    glyph = opened.page.locator('#text .t[data-i="2"] .nl').evaluate(
        "e => getComputedStyle(e, '::before').content")
    assert glyph == '"\u21b5"'
    assert opened.page.locator('#text .t[data-i="2"]').evaluate("e => e.textContent") == "\n"


def test_the_keyboard_reaches_every_token(load_trace: Load, open_trace: Any) -> None:
    trace = load_trace("kinds")
    opened = open_trace(trace)
    page = opened.page
    focused = "() => document.activeElement.dataset.i"
    page.keyboard.press("Tab")  # the text's one tab stop: the first token with a probability
    assert page.evaluate(focused) == "18"
    assert '" Par"' in opened.tip()
    page.keyboard.press("ArrowRight")
    assert page.evaluate(focused) == "19" and '"is"' in opened.tip()
    page.keyboard.press("ArrowDown")  # the next token with a probability: "\n" (20)
    page.keyboard.press("ArrowDown")  # skips fixed tokens 21-24 and forced 25-26
    assert page.evaluate(focused) == "27" and "10 tokens allowed" in opened.tip()
    page.keyboard.press("ArrowLeft")
    assert page.evaluate(focused) == "26" and "forced" in opened.tip()
    page.keyboard.press("End")
    assert page.evaluate(focused) == str(len(trace["events"]) - 1)
    page.keyboard.press("Escape")
    assert page.locator("#tip").is_hidden()
    # One tab stop: Tab leaves the text for the holes table's first link.
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.getAttribute('href')") == "#hole-0"
    opened.assert_clean()


def test_a_hostile_trace_runs_nothing(load_trace: Load, open_trace: Any) -> None:
    trace = load_trace("hostile")
    opened = open_trace(trace)
    page = opened.page
    assert page.evaluate("() => document.scripts.length") == 1
    assert page.title() == f"qrun trace · {trace['template']}"
    texts = page.locator("#text .t").evaluate_all("es => es.map(e => e.textContent)")
    assert texts[0] == "</script><script>alert(1)</script>"
    assert texts[1] == "<img src=x onerror=alert(2)>"
    assert page.locator("img, svg, iframe, object, embed").count() == 0
    page.hover('#text .t[data-i="4"]')
    tip = opened.tip()
    assert '"</span><script>alert(5)</script>"' in tip
    assert '"><script>alert(8)</script> (#0)' in tip
    page.hover('#text .t[data-i="5"]')
    assert '"-->\\u202e\\u0000\\r"' in opened.tip()
    opened.assert_clean()


def test_a_long_run_stays_usable(open_trace: Any) -> None:
    trace = synthetic_trace(10_000)
    start = time.perf_counter()
    opened = open_trace(trace)
    loaded = time.perf_counter() - start
    page = opened.page
    assert page.locator("#text .t").count() == 10_000
    last = page.locator('#text .t[data-i="9999"]')
    last.scroll_into_view_if_needed()
    start = time.perf_counter()
    last.hover()
    tip = opened.tip()
    hovered = time.perf_counter() - start
    assert f"{math.exp(trace['events'][9999]['logprob']) * 100:.1f}%" in tip
    assert '" alt4"' in tip
    print(f"\n10k tokens: load {loaded:.2f} s, hover {hovered * 1000:.0f} ms")
    # Loose bounds for a busy 2-core machine: a quadratic page would take minutes.
    assert loaded < 30 and hovered < 5
    opened.assert_clean()
