"""Helpers of the trace tests: where the fixture traces are, the Chromium flags, and a rendered
page parsed with html.parser into a small element tree (what a browser's parser builds from the
markup, minus CSS and script)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"
# kinds: every token kind and drop reason, by hand; review: assembled from a real SmolLM2 run
# (docs/trace.md, "The example trace"); hostile: markup and script in every string field.
FIXTURE_NAMES = ("kinds", "review", "hostile")

# Debian's chromium on a 2-core CI machine without a display or network: no sandbox (root),
# no GPU, and none of the background requests a fresh profile makes.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

VOID = {"meta", "br", "hr", "img", "input", "link", "area", "base", "col", "embed", "source",
        "track", "wbr"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    parent: Element | None
    children: list[Element | str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def iter(self) -> Iterator[Element]:
        yield self
        for child in self.children:
            if isinstance(child, Element):
                yield from child.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None) -> list[Element]:
        return [e for e in self.iter()
                if (tag is None or e.tag == tag) and (cls is None or cls in e.classes())]

    def kids(self, tag: str) -> list[Element]:
        """Direct children with this tag (a table row's own cells, not a nested table's)."""
        return [c for c in self.children if isinstance(c, Element) and c.tag == tag]

    def by_id(self, ident: str) -> Element:
        found = [e for e in self.iter() if e.attrs.get("id") == ident]
        assert len(found) == 1, f"{len(found)} elements with id {ident!r}"
        return found[0]

    def ancestors(self) -> Iterator[Element]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {}, None)
        self.node = self.root
        self.unclosed: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs}, self.node)
        self.node.children.append(element)
        if tag not in VOID:
            self.node = element

    def handle_endtag(self, tag: str) -> None:
        # The renderer closes every element it opens: a mismatch is a rendering bug.
        assert self.node.tag == tag, f"</{tag}> closes <{self.node.tag}>"
        assert self.node.parent is not None
        self.node = self.node.parent

    def handle_data(self, data: str) -> None:
        self.node.children.append(data)


def parse_page(page: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(page)
    builder.close()
    assert builder.node is builder.root, f"<{builder.node.tag}> left open"
    return builder.root


def synthetic_trace(n_tokens: int) -> dict[str, Any]:
    """A long run: n sampled tokens in holes of 50, each with five alternatives."""
    events: list[dict[str, Any]] = []
    holes: list[dict[str, Any]] = []
    for i in range(n_tokens):
        hole = i // 50
        if i % 50 == 0:
            holes.append({"index": hole, "name": f"h{hole}", "kind": "gen", "constraint": None,
                          "value": "", "text": "", "finish": "max_tokens", "seconds": 0.5,
                          "span": {"line": hole + 1, "column": 1}, "first_event": i,
                          "last_event": min(i + 49, n_tokens - 1), "options": None})
        lp = -((i % 17) / 4)
        events.append({"pos": i, "id": i % 4000, "text": " tok" if i % 13 else "\n",
                       "kind": "sampled", "kept": True, "dropped_by": None, "cached": False,
                       "hole": hole, "logprob": lp, "prob": 2.718281828 ** lp, "mask_size": None,
                       "top": [{"id": k, "text": f" alt{k}", "logprob": -k - 0.5}
                               for k in range(5)]})
    text = "".join(e["text"] for e in events)
    return {"format": "qrun-trace", "version": 1, "template": "long.tmpl", "model": "m",
            "backend": "transformers", "device": "cpu", "dtype": "float32", "text": text,
            "stats": {"context_tokens": n_tokens}, "events": events, "holes": holes}
