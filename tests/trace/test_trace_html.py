"""The trace page's markup (qrun/trace/html.py), read back with html.parser: every token with its
data, every hole, the stats, whitespace shown but faithful, and nothing from the trace able to
add markup or script."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

import pytest
from trace_helpers import FIXTURE_NAMES, Element, parse_page, synthetic_trace

from qrun.trace import render_html

Load = Callable[[str], dict[str, Any]]
PAGE_JS = resources.files("qrun.trace").joinpath("page.js").read_text(encoding="utf-8")

# Every tag the renderer writes. A hostile string that became markup would add another (or an
# attribute outside ALLOWED_ATTRS).
ALLOWED_TAGS = {"#document", "html", "head", "meta", "title", "style", "body", "header", "h1",
                "h2", "span", "dl", "div", "dt", "dd", "main", "section", "p", "i", "table",
                "thead", "tbody", "tr", "th", "td", "code", "a", "script"}
ALLOWED_ATTRS = {"lang", "charset", "http-equiv", "content", "name", "class", "id", "href",
                 "title", "style", "role", "hidden", "tabindex", "aria-label"}


def tokens_of(root: Element) -> list[Element]:
    return root.by_id("text").find_all("span", "t")


def token_text(span: Element) -> str:
    """The token's text as the page knows it: its content, or data-raw where they differ."""
    return json.loads(span.attrs["data-raw"]) if "data-raw" in span.attrs else span.text()


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_every_token_is_there_with_its_data(load_trace: Load, name: str) -> None:
    trace = load_trace(name)
    root = parse_page(render_html(trace))
    spans = tokens_of(root)
    assert len(spans) == len(trace["events"])
    for i, (span, event) in enumerate(zip(spans, trace["events"], strict=True)):
        attrs, classes = span.attrs, span.classes()
        assert attrs["data-i"] == str(i)
        assert attrs["data-id"] == str(event["id"])
        assert attrs["data-pos"] == str(event["pos"])
        assert attrs["data-k"] == event["kind"] and f"k-{event['kind']}" in classes
        assert token_text(span) == event["text"]
        assert ("c" in classes) == event["cached"]
        assert ("x" in classes) == (not event["kept"])
        assert attrs.get("data-drop") == event["dropped_by"]
        assert attrs.get("data-hole") == (None if event["hole"] is None else str(event["hole"]))
        assert attrs.get("data-mask") == (
            None if event["mask_size"] is None else str(event["mask_size"]))
        if event["logprob"] is None:
            assert "data-lp" not in attrs and "data-p" not in attrs
        else:
            assert float(attrs["data-lp"]) == event["logprob"]
            assert float(attrs["data-p"]) == event["prob"]
        top = [[alt["id"], alt["text"], alt["logprob"]] for alt in event["top"]]
        assert json.loads(attrs.get("data-top", "[]")) == top
        assert attrs.get("data-opt") == (
            None if event.get("option") is None else str(event["option"]))


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_the_kept_text_is_the_runs_text(load_trace: Load, name: str) -> None:
    trace = load_trace(name)
    spans = tokens_of(parse_page(render_html(trace)))
    kept = "".join(token_text(s) for s in spans if "x" not in s.classes())
    assert kept == trace["text"]


def test_probability_is_a_colour_for_scored_tokens(load_trace: Load) -> None:
    trace = load_trace("kinds")
    spans = tokens_of(parse_page(render_html(trace)))
    buckets = {i: {c for c in s.classes() if re.fullmatch(r"p\d", c)} for i, s in enumerate(spans)}
    assert buckets[19] == {"p9"}  # "is", p = 0.998
    assert buckets[40] == {"p0"}  # "\t", p = 0.0055
    assert buckets[39] == {"p2"}  # " Nice", p = 0.20
    assert buckets[18] == {"p9"}  # healed " Par", p = 0.90
    # A select option's tokens take the option's share among the options, not their own
    # in-context probability: " no" (0.12 in context) is 12.7% of the options.
    assert buckets[33] == {"p1"} and buckets[32] == {"p8"}
    assert buckets[34] == buckets[35] == {"p0"}  # " may" + "be": " maybe", 2.6%
    for i, event in enumerate(trace["events"]):
        if event["kind"] in ("fixed", "forced"):
            assert buckets[i] == set(), i


def test_whitespace_is_visible_and_faithful(load_trace: Load) -> None:
    root = parse_page(render_html(load_trace("kinds")))
    spans = tokens_of(root)
    kept_newline = spans[2]  # fixed "\n"
    assert [c.attrs["class"] for c in kept_newline.find_all("i")] == ["g nl"]
    assert kept_newline.text() == "\n" and "data-raw" not in kept_newline.attrs
    dropped_newline = spans[20]  # the "\n" that overshot the stop: a glyph, no line break
    assert [c.attrs["class"] for c in dropped_newline.find_all("i")] == ["g nl"]
    assert dropped_newline.text() == ""
    assert json.loads(dropped_newline.attrs["data-raw"]) == "\n"
    tab = spans[40]
    assert [c.attrs["class"] for c in tab.find_all("i")] == ["g tab"] and tab.text() == "\t"
    assert "ws" in spans[17].classes() and "ws" in spans[24].classes()  # " " tokens
    assert "ws" not in spans[4].classes()  # " a"


def test_invisible_and_control_characters_get_a_label(load_trace: Load) -> None:
    trace = load_trace("hostile")
    span = tokens_of(parse_page(render_html(trace)))[5]  # "-->\u202e\u0000\r"
    assert [i.attrs["data-u"] for i in span.find_all("i")] == ["U+202E", "\u2400", "\u240d"]
    assert span.text() == "-->"  # the bidi override, NUL and CR are not in the page's text
    assert json.loads(span.attrs["data-raw"]) == "-->\u202e\u0000\r"


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_every_hole_is_shown(load_trace: Load, name: str) -> None:
    trace = load_trace(name)
    root = parse_page(render_html(trace))
    for hole in trace["holes"]:
        index = hole["index"]
        box = root.by_id(f"hole-{index}")
        assert "hole" in box.classes() and box.attrs["data-label"] == hole["name"]
        inside = [int(s.attrs["data-i"]) for s in box.find_all("span", "t")]
        assert inside == list(range(hole["first_event"], hole["last_event"] + 1))
        row = root.by_id(f"h-{index}")
        cells = row.kids("td")
        assert row.attrs["data-name"] == hole["name"]
        assert cells[1].text() == hole["name"]
        assert cells[1].find_all("a")[0].attrs["href"] == f"#hole-{index}"
        assert cells[2].text() == f"{hole['span']['line']}:{hole['span']['column']}"
        assert cells[3].text() == (hole["constraint"] or "—")
        value = cells[4].find_all("code")[0].text()
        assert json.loads(value) == hole["value"]
        assert cells[5].text() == hole["finish"]
        assert cells[7].text() == f"{hole['seconds']:.3f} s"


def test_select_options_with_their_probabilities(load_trace: Load) -> None:
    trace = load_trace("kinds")
    row = parse_page(render_html(trace)).by_id("h-2")
    options = row.find_all("table", "options")[0].find_all("tr")
    assert [o.attrs["data-text"] for o in options] == [" yes", " no", " maybe"]
    assert [o.find_all("td")[2].text() for o in options] == ["84.8%", "12.7%", "2.6%"]
    assert ["chosen" in o.classes() for o in options] == [True, False, False]
    bars = [o.find_all("span", "bar")[0].attrs["style"] for o in options]
    assert bars == ["width:84.8%", "width:12.7%", "width:2.6%"]


def test_header_and_stats(load_trace: Load) -> None:
    trace = load_trace("kinds")
    root = parse_page(render_html(trace))
    header = root.find_all("header")[0]
    assert header.find_all("span", "tmpl")[0].text() == trace["template"]
    meta = {dt.text(): dd.text() for dt, dd in zip(header.find_all("dt"), header.find_all("dd"),
                                                   strict=True)}
    assert meta["model"] == "smollm2" and meta["backend"] == "transformers"
    assert meta["device"] == "cpu" and meta["dtype"] == "float32"
    assert meta["tokens"] == "39 kept, 6 rolled back, 4 from cache"
    assert meta["holes"] == "4"
    stats = root.by_id("stats").find_all("table")[0]
    shown = {th.text(): td.text() for th, td in zip(stats.find_all("th"), stats.find_all("td"),
                                                    strict=True)}
    assert list(shown) == list(trace["stats"])
    assert shown["context_tokens"] == "39" and shown["wall_s"] == "0.412 s"
    assert shown["load_s"] == "—"  # null


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_the_page_is_self_contained_with_its_own_script_only(load_trace: Load, name: str) -> None:
    page = render_html(load_trace(name))
    root = parse_page(page)
    scripts = root.find_all("script")
    assert len(scripts) == 1 and scripts[0].attrs == {} and scripts[0].text() == PAGE_JS
    digest = base64.b64encode(hashlib.sha256(PAGE_JS.encode()).digest()).decode()
    csp = [m for m in root.find_all("meta") if m.attrs.get("http-equiv") ==
           "Content-Security-Policy"]
    assert len(csp) == 1
    policy = csp[0].attrs["content"]
    assert "default-src 'none'" in policy and f"script-src 'sha256-{digest}'" in policy
    for element in root.iter():
        assert element.tag in ALLOWED_TAGS, element.tag
        for attr in element.attrs:
            assert attr in ALLOWED_ATTRS or attr.startswith("data-"), (element.tag, attr)
        href = element.attrs.get("href")
        assert href is None or re.fullmatch(r"#hole-\d+", href), href
    # No URL the page could fetch: no src attribute (above), no url(...) or @import in CSS.
    style = root.find_all("style")[0].text()
    assert "@import" not in style and "url(" not in style


def test_a_hostile_trace_renders_as_text(load_trace: Load) -> None:
    trace = load_trace("hostile")
    page = render_html(trace)
    root = parse_page(page)
    # Every string came through as text or as an attribute's value, never as markup.
    assert "<script>alert" not in page and "<img" not in page and "<svg" not in page
    assert root.find_all("title")[0].text() == f"qrun trace · {trace['template']}"
    assert root.find_all("span", "tmpl")[0].text() == trace["template"]
    spans = tokens_of(root)
    assert spans[0].text() == "</script><script>alert(1)</script>"
    assert spans[1].text() == "<img src=x onerror=alert(2)>"
    assert spans[2].text() == "\"' onmouseover=\"alert(3)"
    assert spans[3].text() == "&lt;not-an-entity&gt; &amp;"  # entities stay literal text
    assert json.loads(spans[4].attrs["data-top"])[1][1] == "</span><script>alert(5)</script>"
    hole = trace["holes"][0]
    assert root.by_id("hole-0").attrs["data-label"] == hole["name"]
    row = root.by_id("h-0")
    assert row.kids("td")[1].text() == hole["name"]
    assert row.kids("td")[3].text() == hole["constraint"]
    value = row.find_all("code")[1].text()
    assert json.loads(value) == hole["value"]
    assert "\u202e" not in value and "\\u202e" in value  # escaped: it cannot reorder the line
    options = root.by_id("h-1").find_all("tr")[1:]
    assert [o.attrs["data-text"] for o in options] == [o["text"] for o in trace["holes"][1]
                                                       ["options"]]
    stats = root.by_id("stats").find_all("th")
    assert [th.text() for th in stats] == list(trace["stats"])


def test_the_script_builds_no_markup_from_data() -> None:
    # The page's script puts trace data on screen with textContent only: nothing that parses
    # a string as HTML or code.
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "new Function", "setTimeout(\"", "srcdoc"):
        assert sink not in PAGE_JS, sink
    # Delegation: a fixed handful of listeners, none per token.
    assert PAGE_JS.count("addEventListener") <= 8


def test_a_long_run_renders_in_linear_time_and_size() -> None:
    sizes, times = {}, {}
    for n in (1000, 10000):
        trace = synthetic_trace(n)
        start = time.perf_counter()
        page = render_html(trace)
        times[n] = time.perf_counter() - start
        sizes[n] = len(page.encode())
    assert len(tokens_of(parse_page(page))) == 10000
    per_token = (sizes[10000] - sizes[1000]) / 9000
    assert per_token < 400, per_token  # bytes per token, five alternatives each
    # Ten times the tokens, well under a hundred times the time (quadratic would be ~100x).
    assert times[10000] < max(1.0, 30 * times[1000]), times


def test_a_run_without_tokens_or_holes(load_trace: Load) -> None:
    trace = load_trace("kinds")
    trace.update(events=[], holes=[], text="")
    root = parse_page(render_html(trace))
    assert tokens_of(root) == []
    assert root.by_id("holes").find_all("p")[0].text() == "This run has no holes."


def test_a_hole_that_appended_nothing_has_a_row_and_no_box(load_trace: Load) -> None:
    trace = load_trace("kinds")
    trace["holes"][3].update(first_event=None, last_event=None)
    for event in trace["events"][39:43]:
        event["hole"] = None
    root = parse_page(render_html(trace))
    assert [e.attrs["id"] for e in root.by_id("text").find_all("span", "hole")] == [
        "hole-0", "hole-1", "hole-2"]
    cell = root.by_id("h-3").kids("td")[1]
    assert cell.text() == "note" and cell.find_all("a") == []
    assert root.by_id("h-3").kids("td")[6].text() == "0/0"
