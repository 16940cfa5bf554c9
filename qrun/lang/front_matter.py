"""Part of stage 2 (build_ast): the front matter's YAML -> ast.FrontMatter entries, each value
as plain data with the position of every part of it. The only module of qrun.lang that imports
PyYAML.

Read with qrun/yaml_data.py's DataLoader (a SafeLoader, never PyYAML's full loader, whose plain
scalars are YAML 1.2's JSON-like types: `yes` and `0123` stay strings, `1e3` is a number),
after an event pass that refuses what a template's settings never need and what makes YAML
hostile: anchors and aliases (the "billion laughs" expansion), explicit tags (`!!python/...`,
`!!binary`, `!!set`), nesting deeper than MAX_FRONT_MATTER_DEPTH; and front matter over
MAX_FRONT_MATTER_SIZE characters. Values are JSON's types only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from qrun.lang import ast
from qrun.source import Source, Span
from qrun.yaml_data import DataLoader, screen

MAX_FRONT_MATTER_SIZE = 65_536
"""Characters between the two `---` lines at most (a typed template's is a few hundred)."""
MAX_FRONT_MATTER_DEPTH = 32
"""Mappings and lists nest at most this deep in front matter (JSON Schemas included)."""

_YAML_NOTE = ("front matter is YAML: quote a value that contains ': ' or ' #', or begins "
              "with one of [ ] { } , & * ! | > ' \" % @ `")


_Loader = DataLoader

Fail = Callable[[str, Span, tuple[str, ...]], None]


class _Refused(Exception):
    def __init__(self, message: str, mark: Any, notes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.mark = mark
        self.notes = notes


def read_front_matter(text: str, start: int, source: Source, fail: Fail) -> ast.FrontMatter:
    """The entries of the front matter token `text` (both `---` lines included) found at
    offset `start` of `source`. Errors go to `fail(message, span, notes)`; what they spoil is
    left out."""
    span = source.span_at(start, len(text))
    first_line = text.index("\n") + 1
    body_end = text.rstrip("\n").rfind("\n") + 1
    body = text[first_line:body_end] if body_end > first_line else ""
    offset = start + first_line
    if len(body) > MAX_FRONT_MATTER_SIZE:
        fail(f"front matter is {len(body):,} characters long; at most "
             f"{MAX_FRONT_MATTER_SIZE:,} are read", source.span_at(start, 3), ())
        return ast.FrontMatter((), span)
    reader = _Reader(body, offset, source)
    try:
        entries = reader.entries()
    except _Refused as refused:
        fail(refused.message, reader.span(refused.mark), refused.notes)
        return ast.FrontMatter((), span)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        message = f"front matter is not valid YAML: {err.problem or err.context}"
        fail(message, reader.span(mark), (_YAML_NOTE,))
        return ast.FrontMatter((), span)
    except yaml.YAMLError as err:  # a reader error (a control character): no mark
        fail(f"front matter is not valid YAML: {err}", source.span_at(start, 3), ())
        return ast.FrontMatter((), span)
    return ast.FrontMatter(tuple(entries), span)


class _Reader:
    def __init__(self, body: str, offset: int, source: Source) -> None:
        self.body = body
        self.offset = offset
        self.source = source

    def span(self, mark: Any, end: Any = None) -> Span:
        start = self.offset + (mark.index if mark is not None else 0)
        stop = self.offset + end.index if end is not None else start
        return self.source.span_at(start, max(0, stop - start))

    def entries(self) -> list[ast.FrontMatterEntry]:
        self.screen()
        loader = _Loader(self.body)
        try:
            root = loader.get_single_node()
            if root is None:
                return []
            if not isinstance(root, yaml.MappingNode):
                raise _Refused("front matter must be 'key: value' lines (a YAML mapping)",
                               root.start_mark)
            entries: list[ast.FrontMatterEntry] = []
            for key_node, value_node in root.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != \
                        "tag:yaml.org,2002:str":
                    raise _Refused("a front matter key must be a name", key_node.start_mark)
                entries.append(self.entry(loader, key_node, value_node))
            return entries
        finally:
            loader.dispose()

    def screen(self) -> None:
        """The event pass (yaml_data.py screen): no anchors, aliases or explicit tags;
        bounded nesting."""
        refused = screen(self.body, MAX_FRONT_MATTER_DEPTH)
        if refused is None:
            return
        if refused.kind == "anchor":
            raise _Refused("YAML anchors and aliases are not allowed in front matter",
                           refused.mark, ("write the value out where it is needed",))
        if refused.kind == "tag":
            raise _Refused(f"YAML tags ({refused.tag}) are not allowed in front matter",
                           refused.mark, ("values are JSON's types: strings, numbers, "
                                          "true/false, null, lists and mappings",))
        raise _Refused(f"front matter nests more than {MAX_FRONT_MATTER_DEPTH} levels deep",
                       refused.mark)

    def entry(self, loader: _Loader, key_node: yaml.ScalarNode,
              value_node: yaml.Node) -> ast.FrontMatterEntry:
        spans: dict[tuple[str | int, ...], Span] = {}
        keys: dict[tuple[str | int, ...], Span] = {}
        self.locate(value_node, (), spans, keys)
        data = loader.construct_object(value_node, deep=True)
        value_span = self.span(value_node.start_mark, value_node.end_mark)
        whole = self.span(key_node.start_mark, value_node.end_mark)
        scalar = value_node.value if isinstance(value_node, yaml.ScalarNode) else None
        written = self.body[value_node.start_mark.index:value_node.end_mark.index]
        return ast.FrontMatterEntry(str(key_node.value), written.strip(), whole, value_span,
                                    data, scalar, spans, keys)

    def locate(self, node: yaml.Node, path: tuple[str | int, ...],
               spans: dict[tuple[str | int, ...], Span],
               keys: dict[tuple[str | int, ...], Span]) -> None:
        """Where each value inside the entry is, by its path of keys and indexes; keys must
        be strings (JSON's)."""
        spans[path] = self.span(node.start_mark, node.end_mark)
        if isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.locate(item, (*path, index), spans, keys)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag not in (
                        "tag:yaml.org,2002:str",):
                    raise _Refused("a key in front matter must be a string (quote it)",
                                   key.start_mark)
                where = (*path, key.value)
                if where in keys:
                    raise _Refused(f"key '{key.value}' given twice", key.start_mark,
                                   (f"first given at {keys[where]}",))
                keys[where] = self.span(key.start_mark, key.end_mark)
                self.locate(value, (*path, key.value), spans, keys)
