"""A trace as one self-contained HTML page (docs/trace.md, "The page"): the text token by token,
the holes, the stats. Torch-free. Every string from the trace reaches the page through `_text`
or `_attr` (escaped); the page's own script and style are package files (page.js, page.css),
and a Content-Security-Policy allows that script alone and no network at all."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import Any

from qrun.trace.format import TOKEN_KINDS, Hole, TokenEvent, Trace, validate

_KIND_LABELS = {
    "fixed": "fixed text",
    "sampled": "sampled",
    "forced": "forced (only one token allowed)",
    "healed": "healed (re-covers healed text)",
    "select": "select option",
}
_PROB_BUCKETS = 10
# Kinds whose tokens carry a probability worth a colour (a forced token's is 1 by construction).
_COLOURED = {"sampled", "healed", "select"}

# Characters shown as a glyph and kept in the text (so copying the text stays faithful).
_GLYPHS = {"\n": "nl", "\t": "tab"}
# Characters that would be invisible, reorder the line (bidi controls) or not survive HTML
# parsing (C0/C1 controls, CR, lone surrogates): shown as a labelled glyph instead.
_HIDDEN = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]")
_SPECIAL = re.compile(f"[\n\t]|{_HIDDEN.pattern}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def render_html(trace: Mapping[str, Any]) -> str:
    """The page for a trace (validated first: TraceFormatError on a malformed one)."""
    checked = validate(trace)
    script = _asset("page.js")
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    csp = (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; "
           "img-src data:; base-uri 'none'; form-action 'none'")
    title = f"qrun trace · {checked['template']}"
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        "<meta name=\"generator\" content=\"qrun\">\n",
        f"<title>{_text(title)}</title>\n<style>\n{_asset('page.css')}</style>\n</head>\n",
        "<body>\n", _header(checked), "<main>\n",
        _text_section(checked), _holes_section(checked), _blocks_section(checked),
        _calls_section(checked), _stats_section(checked),
        "</main>\n<div id=\"tip\" role=\"tooltip\" hidden></div>\n",
        f"<script>{script}</script>\n</body>\n</html>\n",
    ])


def _asset(name: str) -> str:
    return resources.files("qrun.trace").joinpath(name).read_text(encoding="utf-8")


# Escaping. Lone surrogates (possible in a str read from JSON) cannot be written as UTF-8.

def _clean(value: str) -> str:
    return _SURROGATE.sub("\ufffd", value)


def _text(value: str) -> str:
    return html.escape(_clean(value), quote=False)


def _attr(value: str) -> str:
    return html.escape(_clean(value), quote=True)


def _num(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


# Header

def _header(trace: Trace) -> str:
    events = trace["events"]
    kept = sum(1 for e in events if e["kept"])
    cached = sum(1 for e in events if e["cached"])
    wall = trace["stats"].get("wall_s")
    pairs = [
        ("model", trace["model"]), ("backend", trace["backend"]),
        ("device", trace["device"] or "—"), ("dtype", trace["dtype"] or "—"),
        ("tokens", f"{kept} kept, {len(events) - kept} rolled back, {cached} from cache"),
        ("holes", str(len(trace["holes"]))),
    ]
    if wall is not None:
        pairs.append(("wall", f"{wall:.3f} s"))
    items = "".join(f"<div><dt>{_text(k)}</dt><dd>{_text(v)}</dd></div>" for k, v in pairs)
    return (f"<header>\n<h1>qrun trace <span class=\"tmpl\">{_text(trace['template'])}</span>"
            f"</h1>\n<dl class=\"meta\">{items}</dl>\n</header>\n")


# The text, token by token

def _text_section(trace: Trace) -> str:
    events = trace["events"]
    opens = {h["first_event"]: h for h in trace["holes"] if h["first_event"] is not None}
    closes = {h["last_event"] for h in trace["holes"] if h["last_event"] is not None}
    focus = next((i for i, e in enumerate(events) if e["logprob"] is not None), 0)
    parts = ["<section id=\"run\">\n<h2>Text</h2>\n", _legend(),
             "<p class=\"help\">Hover, click or focus a token for its data "
             "(Tab into the text, then ←/→ token by token, ↑/↓ between tokens with a "
             "probability, Esc hides).</p>\n<div id=\"text\" class=\"text\">"]
    for i, event in enumerate(events):
        hole = opens.get(i)
        if hole is not None:
            parts.append(f"<span class=\"hole\" id=\"hole-{hole['index']}\" "
                         f"data-hole=\"{hole['index']}\" data-label=\"{_attr(hole['name'])}\">")
        parts.append(_token(i, event, focus == i, _option_prob(trace, event)))
        if i in closes:
            parts.append("</span>")
    parts.append("</div>\n</section>\n")
    return "".join(parts)


def _option_prob(trace: Trace, event: TokenEvent) -> float | None:
    option, hole = event.get("option"), event["hole"]
    options = None if hole is None else trace["holes"][hole]["options"]
    return None if option is None or options is None else options[option]["prob"]


def _token(i: int, event: TokenEvent, tab_stop: bool, option_prob: float | None) -> str:
    """One token's element: its kind, colour and marks as classes, its data as attributes
    (the inspector in page.js reads them), its text as content."""
    body, faithful = _token_body(event["text"], event["kept"])
    attrs = _token_data(i, event)
    if not faithful:
        attrs.append(f"data-raw=\"{_attr(json.dumps(event['text']))}\"")
    if tab_stop:
        attrs.append("tabindex=\"0\"")
    classes = " ".join(_token_classes(event, option_prob))
    return f"<span class=\"{classes}\" {' '.join(attrs)}>{body}</span>"


def _token_classes(event: TokenEvent, option_prob: float | None) -> list[str]:
    """Kind, then probability as a colour bucket (a select option's token takes the option's
    probability among the options; its own, in context, is in the inspector), then marks:
    c = KV from the cache, x = rolled back, ws = a token of spaces only."""
    classes = ["t", f"k-{event['kind']}"]
    colour = option_prob if option_prob is not None else event["prob"]
    if colour is not None and event["kind"] in _COLOURED:
        classes.append(f"p{min(_PROB_BUCKETS - 1, int(colour * _PROB_BUCKETS))}")
    if event["cached"]:
        classes.append("c")
    if not event["kept"]:
        classes.append("x")
    if event["text"] and event["text"].strip(" ") == "":
        classes.append("ws")
    return classes


def _token_data(i: int, event: TokenEvent) -> list[str]:
    """The data-* attributes; numbers and names from closed sets need no escaping (validate
    checked their types), strings go through _attr. data-top is [[id, text, logprob], ...]."""
    attrs = [f"data-i=\"{i}\"", f"data-k=\"{event['kind']}\"", f"data-id=\"{event['id']}\"",
             f"data-pos=\"{event['pos']}\""]
    if event["hole"] is not None:
        attrs.append(f"data-hole=\"{event['hole']}\"")
    if event.get("option") is not None:
        attrs.append(f"data-opt=\"{event.get('option')}\"")
    if event["logprob"] is not None and event["prob"] is not None:
        attrs += [f"data-lp=\"{_num(event['logprob'])}\"", f"data-p=\"{_num(event['prob'])}\""]
    if event["mask_size"] is not None:
        attrs.append(f"data-mask=\"{event['mask_size']}\"")
    if event["top"]:
        top = [[alt["id"], alt["text"], alt["logprob"]] for alt in event["top"]]
        attrs.append(f"data-top=\"{_attr(_compact_json(top))}\"")
    if not event["kept"]:
        attrs.append(f"data-drop=\"{event['dropped_by']}\"")
    return attrs


def _token_body(text: str, kept: bool) -> tuple[str, bool]:
    """The token's markup, and whether its text content equals the token's text (when not,
    the page reads the text from data-raw). A kept newline is a glyph and a real line break; a
    rolled-back one is the glyph only, so the page's kept text is the run's text."""
    if not _SPECIAL.search(text):
        return _text(text), True
    out: list[str] = []
    faithful = True
    last = 0
    for match in _SPECIAL.finditer(text):
        out.append(_text(text[last:match.start()]))
        char = match.group()
        last = match.end()
        if char in _GLYPHS:
            out.append(f"<i class=\"g {_GLYPHS[char]}\"></i>")
            if kept or char != "\n":
                out.append(char)
            else:
                faithful = False
        else:
            out.append(f"<i class=\"g u\" data-u=\"{_hidden_label(char)}\"></i>")
            faithful = False
    out.append(_text(text[last:]))
    return "".join(out), faithful


def _hidden_label(char: str) -> str:
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)  # the Control Pictures block: ␀ ␁ ... ␍ ...
    if code == 0x7F:
        return "\u2421"
    return f"U+{code:04X}"


def _legend() -> str:
    kinds = "".join(
        f"<span class=\"item\"><span class=\"t k-{kind}{' p8' if kind in _COLOURED else ''}\">"
        f"{_text(kind)}</span> {_text(_KIND_LABELS[kind])}</span>" for kind in TOKEN_KINDS)
    scale = "".join(f"<span class=\"p{k}\" title=\"{k / _PROB_BUCKETS:.1f}–"
                    f"{(k + 1) / _PROB_BUCKETS:.1f}\"></span>" for k in range(_PROB_BUCKETS))
    return ("<div class=\"legend\" aria-label=\"legend\">" + kinds +
            "<span class=\"item\"><span class=\"t k-fixed c\">cached</span> KV from the prefix "
            "cache</span><span class=\"item\"><span class=\"t k-sampled p5 x\">dropped</span> "
            "rolled back</span><span class=\"item\"><span class=\"hole\" data-label=\"name\">"
            "</span> hole</span>"
            f"<span class=\"item\">probability 0 <span class=\"scale\">{scale}</span> 1</span>"
            "</div>\n")


# Holes

def _holes_section(trace: Trace) -> str:
    rows = "".join(_hole_row(hole, trace["events"]) for hole in trace["holes"])
    if not rows:
        return "<section id=\"holes\">\n<h2>Holes</h2>\n<p>This run has no holes.</p>\n</section>\n"
    return ("<section id=\"holes\">\n<h2>Holes</h2>\n<table class=\"holes\">\n<thead><tr>"
            "<th>#</th><th>name</th><th>at</th><th>constraint</th><th>value</th>"
            "<th>finish</th><th class=\"num\">tokens</th><th class=\"num\">time</th></tr>"
            f"</thead>\n<tbody>\n{rows}</tbody>\n</table>\n</section>\n")


def _hole_row(hole: Hole, events: list[TokenEvent]) -> str:
    index = hole["index"]
    first, last = hole["first_event"], hole["last_event"]
    own = [] if first is None or last is None else events[first:last + 1]
    kept = sum(1 for e in own if e["kept"])
    constraint = hole["constraint"]
    value = _shown_json(hole["value"])
    name = _text(hole["name"])
    link = f"<a href=\"#hole-{index}\">{name}</a>" if first is not None else name
    options = "" if hole["options"] is None else _options(hole)
    options += _drawn(hole)
    return (f"<tr id=\"h-{index}\" data-hole=\"{index}\" data-name=\"{_attr(hole['name'])}\">"
            f"<td class=\"num\">{index}</td><td class=\"name\">{link}</td>"
            f"<td>{hole['span']['line']}:{hole['span']['column']}</td>"
            f"<td><code>{_text(constraint) if constraint is not None else '—'}</code></td>"
            f"<td><code class=\"value\">{_text(value)}</code>{options}</td>"
            f"<td>{_text(hole['finish'])}</td>"
            f"<td class=\"num\">{kept}/{len(own)}</td>"
            f"<td class=\"num\">{hole['seconds']:.3f} s</td></tr>\n")


def _blocks_section(trace: Trace) -> str:
    """Each `{% particles %}` block (docs/trace.md §2.5): its particles' values with their
    weights as bars, the one that went on ticked, and log P(evidence); none: no section."""
    blocks = trace.get("particle_blocks") or []
    parts = []
    for block in blocks:
        rows = []
        for k, particle in enumerate(block["particles"]):
            shown = (_shown_json(particle["values"]) if particle["error"] is None
                     else particle["error"])
            rows.append(_bar_row(shown, particle["weight"], k == block["chosen"],
                                 before=f"<td class=\"num\">{k + 1}</td>") + "\n")
        evidence = block["log_evidence"]
        note = "" if evidence is None else f", log P(evidence) {evidence:.3f}"
        parts.append(f"<h3>particles at {block['span']['line']}:{block['span']['column']}: "
                     f"{len(rows)} particles{_text(note)}</h3>\n<table class=\"options\">"
                     f"<tbody>\n{''.join(rows)}</tbody>\n</table>\n")
    if not parts:
        return ""
    return f"<section id=\"particles\">\n<h2>Particles</h2>\n{''.join(parts)}</section>\n"


def _calls_section(trace: Trace) -> str:
    """Host function calls (docs/trace.md §2.4), in the order they ran; none: no section."""
    calls = trace.get("calls") or []
    if not calls:
        return ""
    rows = []
    for call in calls:
        arguments = [_shown_json(a) for a in call["args"]] + [
            f"{key}={_shown_json(value)}" for key, value in call["kwargs"].items()]
        error = call["error"]
        outcome = (f"<td class=\"error\">{_text(error)}</td>" if error is not None
                   else f"<td><code class=\"value\">{_text(_shown_json(call['result']))}"
                        "</code></td>")
        rows.append(f"<tr><td class=\"name\"><code>{_text(call['name'])}</code></td>"
                    f"<td>{call['span']['line']}:{call['span']['column']}</td>"
                    f"<td><code>{_text(', '.join(arguments))}</code></td>{outcome}"
                    f"<td class=\"num\">{call['seconds'] * 1000:.2f} ms</td></tr>\n")
    return ("<section id=\"calls\">\n<h2>Host calls</h2>\n<table class=\"holes\">\n<thead><tr>"
            "<th>function</th><th>at</th><th>arguments</th><th>result</th>"
            "<th class=\"num\">time</th></tr>"
            f"</thead>\n<tbody>\n{''.join(rows)}</tbody>\n</table>\n</section>\n")


def _drawn(hole: Hole) -> str:
    """A gen hole's value distribution (sampler="exact" or "smc", docs/language.md §14.8) with
    probability bars, the chosen value ticked; the particles' count and the log-probability of
    the language under the model. Nothing for a hole sampled under the mask."""
    values = hole.get("values")
    if values is None:
        return ""
    rows = [_share_row(hole, value["text"], value["prob"]) for value in values]
    particles = hole.get("particles")
    evidence = hole.get("log_evidence")
    notes = [] if particles is None else [f"{len(particles)} particles"]
    if evidence is not None:
        notes.append(f"log P(language) {evidence:.3f}")
    if notes:
        rows.append(f"<tr><td>{_text(', '.join(notes))}</td></tr>")
    return f"<table class=\"options\">{''.join(rows)}</table>"


def _options(hole: Hole) -> str:
    rows = [_share_row(hole, option["text"], option["prob"],
                       f"<td class=\"num lp\">{option['logprob']:.3f}</td>")
            for option in hole["options"] or []]
    return f"<table class=\"options\">{''.join(rows)}</table>"


def _share_row(hole: Hole, text: str, prob: float, extra: str = "") -> str:
    """One row of a hole's options or values: the text, a probability bar and the percentage
    (the chosen one ticked), then `extra` cells."""
    return _bar_row(_shown_json(text), prob, text == hole["text"], after=extra,
                    data=f" data-text=\"{_attr(text)}\" data-p=\"{_num(prob)}\"")


def _bar_row(shown: str, prob: float, chosen: bool, before: str = "", after: str = "",
             data: str = "") -> str:
    """A row with `shown` (escaped here), a bar for `prob` and its percentage, ticked when
    `chosen`; `before`/`after`: cells around them, `data`: the row's attributes."""
    width = max(0.0, min(1.0, prob)) * 100
    mark = ' class="chosen"' if chosen else ""
    return (f"<tr{mark}{data}>{before}"
            f"<td><code>{_text(shown)}</code></td>"
            f"<td><span class=\"track\"><span class=\"bar\" style=\"width:{width:.1f}%\">"
            f"</span></span></td><td class=\"num\">{_percent(prob)}</td>{after}</tr>")


def _percent(p: float) -> str:
    return f"{p * 100:.1f}%" if p >= 0.001 else f"{p * 100:.2g}%"


# Stats

def _stats_section(trace: Trace) -> str:
    cells = [f"<th>{_text(key)}</th><td class=\"num\">{_stat(key, value)}</td>"
             for key, value in trace["stats"].items()]
    rows = "".join(f"<tr>{''.join(row)}</tr>\n" for row in _chunks(cells, 3))
    return (f"<section id=\"stats\">\n<h2>Stats</h2>\n<table class=\"stats\">\n{rows}</table>\n"
            "</section>\n")


def _stat(key: str, value: float | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.3f} s" if key.endswith("_s") else f"{value:g}"


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _shown_json(value: object) -> str:
    """A value as JSON for reading: non-ASCII kept, but the characters _HIDDEN names escaped
    (\\uXXXX is still JSON), so a value cannot hide text or reorder the line around it."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    return _HIDDEN.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _compact_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)

