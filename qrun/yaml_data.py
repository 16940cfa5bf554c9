"""YAML read as JSON's data (docs/language.md §4, docs/testing.md §5): the one YAML loader of
front matter (lang/front_matter.py) and case files (testing/cases.py). PyYAML implements YAML
1.1, whose implicit types surprise a template's author: `enum: [yes, no]` gives booleans,
`0123` an octal 83, `1:30` the sexagesimal 90, `.nan` and `.inf` floats JSON cannot carry,
and `1e3` a string. DataLoader resolves plain scalars as YAML 1.2's JSON schema does (its core
schema, less the forms JSON lacks): `true`/`false` are booleans, `null`/`~`/nothing null,
decimal integers without leading zeros are integers, decimals with a fraction or an exponent
(`1.5`, `1e3`) floats; everything else (`yes`, `0123`, `1:30`, `.inf`, `0x1F`, dates) is a
string. Built on SafeLoader (never PyYAML's full loader).

`screen` is the pass both run before loading: the first anchor, alias or explicit tag, or
collection nested too deeply, which each words as its own error."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent, NodeEvent

_RESOLVERS = (
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^[-+]?(?:0|[1-9][0-9]*)$", list("-+0123456789")),
    ("tag:yaml.org,2002:float",
     r"^[-+]?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?)$",
     list("-+.0123456789")),
)


class DataLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no type hints
    """SafeLoader whose plain scalars are read as YAML 1.2's JSON-like schema reads them (the
    module's docstring); no dates, no `<<` merge keys, no `=` value keys."""


DataLoader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in _RESOLVERS:
    DataLoader.add_implicit_resolver(_tag, re.compile(_pattern), _first)


def load_data(text: str) -> object:
    """The YAML document `text` as data, read by DataLoader.

    Raises:
        yaml.YAMLError: it is not YAML.
    """
    return yaml.load(text, Loader=DataLoader)  # noqa: S506  # DataLoader is a SafeLoader


@dataclass(frozen=True)
class Refused:
    """What `screen` found first: `kind` "anchor" (an anchor or an alias), "tag" (`tag` says
    which) or "depth" (a collection nested deeper than allowed), at `mark` (PyYAML's, 0-based
    line and column)."""

    kind: Literal["anchor", "tag", "depth"]
    mark: Any
    tag: str | None = None


def screen(text: str, max_depth: int) -> Refused | None:
    """The first anchor, alias or explicit tag of the YAML document `text`, or its first
    collection more than `max_depth` levels deep; None when it has none. One pass over
    PyYAML's events: nothing is built, so a bomb of aliases costs nothing.

    Raises:
        yaml.YAMLError: it is not YAML.
    """
    depth = 0
    for event in yaml.parse(text, Loader=DataLoader):
        if isinstance(event, AliasEvent) or (isinstance(event, NodeEvent)
                                             and event.anchor is not None):
            return Refused("anchor", event.start_mark)
        tag = getattr(event, "tag", None)
        if isinstance(event, NodeEvent) and tag is not None:
            return Refused("tag", event.start_mark, tag)
        if isinstance(event, CollectionStartEvent):
            depth += 1
            if depth > max_depth:
                return Refused("depth", event.start_mark)
        elif isinstance(event, CollectionEndEvent):
            depth -= 1
    return None
