"""Grammar text for llguidance (json= and grammar= holes): a JSON Schema (after the sound rewrite,
rewrite.py) or a user's Lark grammar as one Lark text, the healed prefix put in front, and
llguidance's refusals turned into positions: a JSON pointer into the user's schema, a line and
column in the user's grammar. Compiles without a tokenizer, so `qrun --check` needs neither torch
nor a model (tests/test_structure.py).

Every text starts with `%llguidance {"no_forcing": true}`: masks are then byte-level (a token is
allowed iff its bytes keep the text in the language), as qrun's own engine's are
(qrun/constraint/regex_index.py), instead of allowing only the canonical tokenization of forced
text; qrun fast-forwards forced text itself (runtime/generate.py). That line is also what only
llguidance reads, so a vLLM server in its default "auto" mode routes these grammars to its
llguidance backend (runtime/remote.py)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import llguidance

from qrun.constraint.grammar.formats import MODES, assertion
from qrun.constraint.grammar.lark_size import grammar_size_error
from qrun.constraint.grammar.rewrite import rewrite
from qrun.constraint.grammar.schema import (
    close_objects,
    draft_of,
    escape,
    non_finite,
    schema_positions,
)

__all__ = [
    "FIXED",
    "FLEXIBLE",
    "LIMITS",
    "GrammarError",
    "JsonFormat",
    "check_lark",
    "check_schema",
    "clean_reason",
    "json_grammar",
    "lark_grammar",
    "validate",
    "with_prefix",
]

HEADER = '%llguidance {"no_forcing": true}\n'
_LARK_POSITION = re.compile(r"^(?:at )?(\d+)\((\d+)\): ")
_OPTIONS_LINE = re.compile(r"(?m)^[ \t]*%llguidance\b")
# llguidance's Earley rows hold at most 2,000 items by default; an object with ~1,000
# optional properties (SchemaStore's MegaLinter schema) needs ~5,900 after `{"`, and the
# matcher then stops with an error in the middle of a value. 20,000 costs nothing where
# rows stay small.
LIMITS = llguidance.LLParserLimits(max_items_in_row=20_000)


class GrammarError(ValueError):
    """llguidance refused a grammar. `pointer` is the JSON pointer of the subschema at fault
    ("" for the root) in the user's schema; `line`/`column` are 1-based positions in a Lark
    grammar's text; each is None when not known."""

    def __init__(self, reason: str, pointer: str | None = None, line: int | None = None,
                 column: int | None = None) -> None:
        self.reason = reason
        self.pointer = pointer
        self.line = line
        self.column = column
        where = ""
        if pointer is not None:
            where = f" (at {pointer or '/'})"
        elif line is not None:
            at = f"line {line}" if column is None else f"line {line}, column {column}"
            where = f" ({at} of the grammar)"
        super().__init__(f"{reason}{where}")


@dataclass(frozen=True, slots=True)
class JsonFormat:
    """How JSON text is laid out, and whether objects are closed.

    The fixed layout (`FIXED`, every json= hole's: `{"a": 1, "b": [1, 2]}`, Python's
    `json.dumps` default) lets separators fast-forward and keeps small models from writing
    blanks forever. `FLEXIBLE` accepts any JSON whitespace between tokens (compact and
    pretty-printed text too): qrun.Matcher's default. `closed` forbids properties an
    object schema does not list (schema.py close_objects). `formats` says how `format`
    keywords are read (formats.py MODES): "assert" (every format asserted; one qrun does
    not know is an error), "known" (unknown ones ignored, as jsonschema's FormatChecker
    does) or "annotation" (all ignored).
    """

    whitespace_flexible: bool = False
    closed: bool = False
    formats: str = "assert"

    def __post_init__(self) -> None:
        if self.formats not in MODES:
            raise ValueError(f"formats must be one of {', '.join(MODES)}, got "
                             f"{self.formats!r}")

    def options(self) -> dict[str, Any]:
        """llguidance's `x-guidance` options for this layout (they replace any the schema
        carries: `lenient` or `coerce_one_of` there would accept invalid values)."""
        if self.whitespace_flexible:
            return {"whitespace_flexible": True}
        return {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


FIXED = JsonFormat()
FLEXIBLE = JsonFormat(whitespace_flexible=True)


def json_grammar(schema: Any, fmt: JsonFormat = FIXED) -> str:
    """The Lark text of JSON valid against `schema` (a dict or a bool), rewritten
    (rewrite.py). Check it with `check_schema` first for a located error."""
    return f"{HEADER}start: %json {_schema_text(schema, fmt)}\n"


def lark_grammar(text: str) -> str:
    """The Lark text of a user's grammar: the text itself, options line after it, so that
    llguidance's line numbers are the user's."""
    return f"{text}\n{HEADER}"


def with_prefix(grammar: str, prefix: str, follow: str = "") -> str:
    """`grammar` (json_grammar or lark_grammar text) after the literal `prefix` (the healed
    text a hole must produce first), and optionally followed by any beginning of the literal
    `follow` (the text after a hole, which may end it: a server's grammar). The grammar
    becomes a nested `%lark { ... }` block, so its own `start` rule and names stay as
    written."""
    if not prefix and not follow:
        return grammar
    head = json.dumps(prefix, ensure_ascii=False) + " " if prefix else ""
    tail = ""
    if follow:
        tail = " " + "".join("(" + json.dumps(c, ensure_ascii=False) + " " for c in follow)
        tail += ")?" * len(follow)
    return f"{HEADER}start: {head}%lark {{\n{grammar}\n}}{tail}\n"


def validate(grammar: str, tokenizer: llguidance.LLTokenizer | None = None) -> str | None:
    """llguidance's reason for refusing `grammar` (cleaned), or None when it compiles."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        grammar, tokenizer, limits=LIMITS)
    return clean_reason(messages[0]) if is_error else None


def check_lark(text: str) -> GrammarError | None:
    """Why a user's Lark grammar is refused (with its line and column when llguidance gives
    one), or None when it compiles."""
    if _OPTIONS_LINE.search(text):
        return GrammarError("a grammar cannot set %llguidance options: qrun sets them")
    too_large = grammar_size_error(text)
    if too_large is not None:
        line = too_large[1]
        return GrammarError(too_large[0], line=line, column=None if line is None else 1)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        lark_grammar(text), None, limits=LIMITS)
    return _lark_error(messages[0]) if is_error else None


def check_schema(schema: Any, fmt: JsonFormat = FIXED) -> GrammarError | None:
    """Why llguidance refuses `schema` after the rewrite, located in the user's schema (see
    `_locate`), or None when it compiles. A few ms for most schemas."""
    if not isinstance(schema, dict | bool):
        return GrammarError(f"a JSON Schema is an object or a boolean, not "
                            f"{type(schema).__name__}", pointer="")
    bad = non_finite(schema)
    if bad is not None:
        return GrammarError("JSON has no Infinity or NaN: use a finite number", pointer=bad)
    if fmt.formats == "assert":
        unknown = _unknown_format(schema)
        if unknown is not None:
            return unknown
    reason = _schema_reason(schema, fmt)
    return None if reason is None else _locate(schema, reason, fmt)


def clean_reason(message: str) -> str:
    """llguidance's error message on one line: without its debugging tail (parser state,
    grammar dump, the excerpt of the generated Lark text) and its position in that text; a
    regex error keeps its explanation ("invalid regex "[a-": unclosed character class")."""
    message = message.split("\n<state>", 1)[0]
    message = re.split(r"\n\s+\d+ \| ", message, maxsplit=1)[0]
    message = re.sub(r"^(at )?\d+\(\d+\): (failed to compile JSON schema: )?", "", message)
    first, _, rest = message.strip().partition("\n")
    explained = re.search(r"^error: (.*)$", rest, re.M)
    if explained:
        if first == "regex parse error:":  # a JSON Schema pattern: the regex comes next
            first = f"invalid regex {json.dumps(rest.split(chr(10), 1)[0].strip())}"
        first = re.sub(r"\s*\(in regex\): regex parse error:$", "", first)
        first = f"{first}: {explained.group(1).strip()}"
    if first.startswith("oneOf constraints are not supported"):
        first = ("oneOf is supported only where its branches cannot overlap (different "
                 "types, different constants, or a required property with disjoint values); "
                 "write anyOf where one value may match several branches")
    return first.strip()


def _unknown_format(schema: Any) -> GrammarError | None:
    """The first `format` qrun cannot assert (formats.py), at its JSON pointer."""
    draft = draft_of(schema)
    for pointer, sub in schema_positions(schema):
        name = sub.get("format")
        if "format" in sub and (not isinstance(name, str) or assertion(name, draft) is None):
            what = (f"unknown format {json.dumps(name, ensure_ascii=False)}"
                    if isinstance(name, str) else "a format is a string")
            return GrammarError(f'{what}: qrun asserts the standard formats (docs/language.md '
                                f'§7.4); formats="annotation" ignores formats',
                                pointer=_pointer(pointer, "format"))
    return None


def _schema_text(schema: Any, fmt: JsonFormat) -> str:
    body = rewrite(close_objects(schema) if fmt.closed else schema, fmt.formats)
    if body is True:
        body = {}
    if isinstance(body, dict):
        body = {**body, "x-guidance": fmt.options()}
    # As text: llguidance's own dict conversion refuses integers outside 64 bits.
    return json.dumps(body, ensure_ascii=False)


def _schema_reason(schema: Any, fmt: JsonFormat) -> str | None:
    try:
        text = json_grammar(schema, fmt)
    except RecursionError:
        return "the schema is nested too deeply"
    return validate(text)


def _lark_error(message: str) -> GrammarError:
    """A Lark compile error with the position llguidance prints (`at 3(7): ...`)."""
    found = _LARK_POSITION.match(message)
    if found is None:
        return GrammarError(clean_reason(message))
    return GrammarError(clean_reason(message[found.end():]), line=int(found.group(1)),
                        column=int(found.group(2)))


def _locate(schema: Any, reason: str, fmt: JsonFormat) -> GrammarError:
    """llguidance names the problem but not where it is. Candidates are the keywords the
    reason names (a keyword, format, regex, $ref), else every constraining keyword, deepest
    first; each is removed in turn (oneOf made anyOf), and the first removal that changes
    the reason is the culprit. The pointer is the keyword's."""
    keys_of, named = _named_keys(reason)
    candidates = [(p, k) for p, sub in schema_positions(schema) for k in keys_of(sub)]
    if not named:
        candidates.reverse()
    if named and len(candidates) == 1:
        return GrammarError(reason, pointer=_pointer(*candidates[0]))
    for pointer, key in candidates[:_MAX_TRIES]:
        if _schema_reason(_without(schema, pointer, key), fmt) != reason:
            return GrammarError(reason, pointer=_pointer(pointer, key))
    return GrammarError(reason, pointer=None if candidates else "")


def _pointer(pointer: str, key: str) -> str:
    return f"{pointer}/{escape(key)}"


# Keywords that constrain values: where an unnamed reason ("Unsatisfiable schema: ...") is
# looked for.
_CONSTRAINING = ("type", "enum", "const", "minimum", "maximum", "exclusiveMinimum",
                 "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "pattern",
                 "minItems", "maxItems", "items", "prefixItems", "required", "properties",
                 "additionalProperties", "not", "allOf", "anyOf", "oneOf", "$ref")
# Removals tried per refused schema (each is one llguidance compile).
_MAX_TRIES = 64


def _named_keys(reason: str) -> tuple[Callable[[dict[str, Any]], list[str]], bool]:
    """A function listing the keys of a subschema that llguidance's `reason` may be about,
    and whether the reason names them."""
    unimplemented = re.match(r"Unimplemented keys: \[(.*)\]", reason)
    if unimplemented:
        try:
            names = set(json.loads(f"[{unimplemented.group(1)}]"))
        except ValueError:
            names = set()
        return (lambda sub: [k for k in sub if k in names]), True
    fmt = re.match(r"Unknown format: (.*)", reason)
    if fmt:
        return (lambda sub: ["format"] if sub.get("format") == fmt.group(1) else []), True
    if reason.startswith("oneOf"):
        return (lambda sub: ["oneOf"] if "oneOf" in sub else []), True
    if "min/maxProperties" in reason:
        return (lambda sub: [k for k in ("minProperties", "maxProperties") if k in sub]), True
    if "regex" in reason.lower() or "look-around" in reason:
        return (lambda sub: [k for k in ("pattern", "patternProperties", "propertyNames")
                             if k in sub]), True
    pointer = re.match(r"Pointer '([^']*)' does not exist", reason)
    if pointer:
        target = f"#{pointer.group(1)}"
        return (lambda sub: ["$ref"] if sub.get("$ref") == target else []), True
    if reason.startswith("Resource ") or "URI" in reason:
        return (lambda sub: ["$ref"] if isinstance(sub.get("$ref"), str) else []), True
    invalid = re.match(r"Invalid type: (.*)", reason)
    if invalid:
        return (lambda sub: ["type"] if "type" in sub else []), False
    return (lambda sub: [k for k in _CONSTRAINING if k in sub]), False


def _without(schema: Any, pointer: str, key: str) -> Any:
    """A copy of `schema` with `key` removed at `pointer` (oneOf becomes anyOf)."""
    out = copy.deepcopy(schema)
    node = out
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    value = node.pop(key)
    if key == "oneOf":
        node["anyOf"] = value
    return out
