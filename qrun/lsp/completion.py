"""Completion: what may be typed at the cursor, from where it is in its tag. The text being
typed rarely parses, so the place is read from the text before the cursor (inside which tag,
after `regex=`, after `|`, among a hole's arguments), and names come from the last analysis
that parsed and from a scan of the current text (a hole or `set` just written is offered at
once)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from qrun.constraint import PATTERNS
from qrun.lang import ast
from qrun.lang.args import GEN_ARGS, SELECT_ARGS
from qrun.lang.builtins import FUNCTIONS, KEYWORDS, TESTS
from qrun.lang.parser import BLOCK_KEYWORDS
from qrun.lsp.analysis import Analysis, analyze, holes, input_names

INPUT, CAPTURE, VARIABLE, PATTERN, FUNCTION, ARGUMENT, KEYWORD = (
    "input", "capture", "variable", "pattern", "function", "argument", "keyword")
MAX_TAG_SCAN = 10_000
"""Characters before the cursor searched for the tag it is in (a tag is rarely longer)."""

_OPENER = re.compile(r"\{[{%#]|[}%#]\}")
_HOLE = re.compile(r"\{\{-?\s*(gen|select)\s+[A-Za-z_]\w*\s(.*)\Z", re.S)
_BOUND = re.compile(r"\b(?:gen|select|set)\s+([A-Za-z_]\w*)|\bfor\s+([A-Za-z_]\w*"
                    r"(?:\s*,\s*[A-Za-z_]\w*)*)\s+in\b")
# `inputs: [a, b]`, or `inputs:` and a mapping of names indented below it.
_FRONT_MATTER_INPUTS = re.compile(
    r"\A---[ \t]*\n(?:.*\n)*?inputs:[ \t]*(?:\[([^\]\n]*)\]|\n((?:[ \t]+.*\n)*))")
_KEY = re.compile(r"^([ \t]+)([A-Za-z_]\w*)[ \t]*:", re.M)
_STRING = re.compile(r""""(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?""")


@dataclass(frozen=True, slots=True)
class Completion:
    """One item: its label, what it is (INPUT, CAPTURE...), a detail line, and the text to
    insert."""

    label: str
    kind: str
    detail: str
    insert: str


def completion(text: str, path: str, line: int, character: int,
               known: Analysis | None = None) -> list[Completion]:
    """The items at 0-based (line, character) of `text`; `known` is the last analysis of the
    document that parsed (by default `text`'s own)."""
    return complete_at(text, line, character, known or analyze(text, path))


def complete_at(text: str, line: int, character: int, known: Analysis) -> list[Completion]:
    before = _before(text, line, character)
    tag = _tag(before)
    if tag is None or tag.startswith("{#") or _in_string(tag):
        return []
    if re.search(r"\bregex\s*=\s*([A-Z][A-Z0-9_]*)?\Z", tag):
        return [Completion(name, PATTERN, regex if len(regex) < 80 else regex[:79] + "…", name)
                for name, regex in PATTERNS.items()]
    if re.search(r"(?<!\|)\|\s*\w*\Z", tag):
        return _functions()
    if re.search(r"\bis\s+(?:not\s+)?\w*\Z", tag):
        return [Completion(name, FUNCTION, "test", name) for name in TESTS]
    hole = _HOLE.match(tag)
    if hole is not None and _at_argument(hole[2]):
        given = set(re.findall(r"([A-Za-z_]\w*)\s*=", hole[2]))
        names = GEN_ARGS if hole[1] == "gen" else SELECT_ARGS
        return [Completion(name, ARGUMENT, f"{hole[1]} argument (docs/language.md §7.1)",
                           name + "=") for name in names if name not in given]
    if re.fullmatch(r"\{%-?\s*\w*", tag):
        return [Completion(word, KEYWORD, "tag", word) for word in BLOCK_KEYWORDS]
    items = _names(text, known)
    if re.fullmatch(r"\{\{-?\s*\w*", tag):
        items = [Completion(word, KEYWORD, "hole", word + " ") for word in ("gen", "select")
                 ] + items
    return items + _functions()


def _before(text: str, line: int, character: int) -> str:
    """The text before the cursor, at most MAX_TAG_SCAN characters of it."""
    offset, start = 0, 0
    for _ in range(line):
        found = text.find("\n", start)
        if found < 0:
            break
        start = found + 1
    offset = min(start + character, len(text))
    newline = text.find("\n", start)
    if newline >= 0:
        offset = min(offset, newline)
    return text[max(0, offset - MAX_TAG_SCAN):offset]


def _tag(before: str) -> str | None:
    """The text of the tag the cursor is in, from its opener, or None outside tags."""
    found = [match for match in _OPENER.finditer(before)][-1:]
    if not found or found[0][0][0] != "{":
        return None
    return before[found[0].start():]


def _in_string(tag: str) -> bool:
    """Whether the cursor is inside a string literal of the tag."""
    for match in _STRING.finditer(tag):
        literal = match[0]
        if match.end() == len(tag) and (len(literal) < 2 or literal[-1] != literal[0]):
            return True
    return False


def _at_argument(rest: str) -> bool:
    """Whether the cursor, after a hole's name and `rest`, is where an argument name goes:
    after whitespace, outside brackets and strings, not after `=`."""
    rest = re.sub(r"\w*\Z", "", rest)
    if rest and not rest[-1].isspace():
        return False
    stripped = _STRING.sub('""', rest)
    depth = sum(stripped.count(c) for c in "([{") - sum(stripped.count(c) for c in ")]}")
    return depth <= 0 and not stripped.rstrip().endswith("=")


def _functions() -> list[Completion]:
    return [Completion(name, FUNCTION, _signature(name), name) for name in FUNCTIONS]


def _signature(name: str) -> str:
    keywords = KEYWORDS.get(name, ())
    return f"{name}(value{''.join(', ' + k + '=' for k in keywords)})"


def _names(text: str, known: Analysis) -> list[Completion]:
    """Inputs, captures and variables: from the last analysis that parsed, then what the
    current text binds."""
    items: dict[str, Completion] = {}
    for name in input_names(known):
        items[name] = Completion(name, INPUT, "input", name)
    if known.template is not None:
        for site in holes(known.template):
            what = "capture (a list: in a loop)" if site.in_loop else "capture"
            items.setdefault(site.node.name, Completion(site.node.name, CAPTURE, what,
                                                        site.node.name))
        for node in ast.walk(known.template.body):
            for name in _bound(node):
                items.setdefault(name, Completion(name, VARIABLE, "variable", name))
    if (declared := _FRONT_MATTER_INPUTS.search(text[:65_536])) is not None:
        keys = _KEY.findall(declared[2] or "")
        listed = re.findall(r"[A-Za-z_]\w*", declared[1] or "")
        for name in listed + [key for indent, key in keys if indent == keys[0][0]]:
            items.setdefault(name, Completion(name, INPUT, "input", name))
    for match in _BOUND.finditer(text):
        if match[1]:
            kind = CAPTURE if not match[0].startswith("set") else VARIABLE
            items.setdefault(match[1], Completion(match[1], kind, kind, match[1]))
        else:
            for name in re.findall(r"[A-Za-z_]\w*", match[2]):
                items.setdefault(name, Completion(name, VARIABLE, "loop variable", name))
    return list(items.values())


def _bound(node: ast.Node) -> tuple[str, ...]:
    match node:
        case ast.Set(name=name) | ast.Macro(name=name):
            return (name,)
        case ast.For(targets=targets) | ast.Fork(targets=targets):
            return targets
        case ast.Try(name=name) if name is not None:
            return (name,)
        case _:
            return ()
