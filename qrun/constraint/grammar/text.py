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

from qrun.collector import collector_paused
from qrun.constraint.grammar.build_thread import built
from qrun.constraint.grammar.formats import MODES, assertion
from qrun.constraint.grammar.lark_ends import never_ending_rule
from qrun.constraint.grammar.lark_size import grammar_size_error
from qrun.constraint.grammar.limits import DEFAULT, ConstraintLimits
from qrun.constraint.grammar.pattern_escapes import open_pattern_property
from qrun.constraint.grammar.rewrite import rewrite
from qrun.constraint.grammar.schema import (
    close_objects,
    draft_of,
    escape,
    non_finite,
    pointer_target,
    schema_positions,
    survey,
)
from qrun.constraint.grammar.schema_size import crowded_place

__all__ = [
    "FIXED",
    "FLEXIBLE",
    "LIMITS",
    "GrammarError",
    "JsonFormat",
    "JsonFormatError",
    "LAYOUTS",
    "check_lark",
    "check_schema",
    "clean_reason",
    "json_grammar",
    "lark_grammar",
    "schema_grammar",
    "validate",
    "with_prefix",
]

HEADER = '%llguidance {"no_forcing": true}\n'
_LARK_POSITION = re.compile(r"^(?:at )?(\d+)\((\d+)\): ")
_OPTIONS_LINE = re.compile(r"(?m)^[ \t]*%llguidance\b")
LIMITS = DEFAULT.parser_limits()
"""llguidance's parser limits under the default ConstraintLimits (limits.py)."""
LAYOUTS = ("flexible", "fixed")
"""The layouts of JSON text (JsonFormat): any JSON whitespace, or Python's `json.dumps`."""


class GrammarError(ValueError):
    """llguidance (or a qrun limit) refused a grammar. `pointer` is the JSON pointer of the
    subschema at fault ("" for the root) in the user's schema; `line`/`column` are 1-based
    positions in a Lark grammar's text; each is None when not known. `limit` names the
    ConstraintLimits field (qrun.Limits field of the same name) that would let it through,
    None when no limit would."""

    def __init__(self, reason: str, pointer: str | None = None, line: int | None = None,
                 column: int | None = None, limit: str | None = None) -> None:
        self.reason = reason
        self.pointer = pointer
        self.line = line
        self.column = column
        self.limit = limit
        where = ""
        if pointer is not None:
            where = f" (at {pointer or '/'})"
        elif line is not None:
            at = f"line {line}" if column is None else f"line {line}, column {column}"
            where = f" ({at} of the grammar)"
        super().__init__(f"{reason}{where}")


class JsonFormatError(ValueError):
    """An option of a JsonFormat that is not one of its values: `name` ("closed", "formats"
    or "layout"), what it must be (`wanted`) and the value given. The message is the same
    wherever the option was given (a hole's argument at --check or at run time,
    qrun.Matcher)."""

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.value = value
        self.wanted = _WANTED[name]
        shown = f'"{value}"' if isinstance(value, str) else repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        super().__init__(f"{name} must be {self.wanted}, got {shown}")


def _one_of(values: tuple[str, ...]) -> str:
    return ", ".join(f'"{v}"' for v in values[:-1]) + f' or "{values[-1]}"'


_WANTED = {"closed": "true or false", "formats": _one_of(MODES), "layout": _one_of(LAYOUTS)}


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
            raise JsonFormatError("formats", self.formats)

    @classmethod
    def checked(cls, closed: Any = False, formats: Any = "assert",
                layout: Any = "fixed") -> JsonFormat:
        """The format of options a user gave, each checked: the one check of `closed=` and
        `formats=` (a hole's literal ones at --check, lang/args.py; computed ones when the
        hole runs, runtime/constraints.py) and of qrun.Matcher's `closed`, `formats` and
        `layout` (one of LAYOUTS).

        Raises:
            JsonFormatError: an option is not one of its values (the first in that order).
        """
        if not isinstance(closed, bool):
            raise JsonFormatError("closed", closed)
        if formats not in MODES:
            raise JsonFormatError("formats", formats)
        if layout not in LAYOUTS:
            raise JsonFormatError("layout", layout)
        return cls(whitespace_flexible=layout == "flexible", closed=closed, formats=formats)

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
    return f"{HEADER}start: {json_rule(schema, fmt)}\n"


def json_rule(schema: Any, fmt: JsonFormat = FIXED) -> str:
    """The body of a Lark rule matching JSON valid against `schema` as a json= hole reads it
    (rewritten, `fmt`'s layout): `%json {...}`, for a grammar that puts it beside others."""
    return f"%json {_schema_text(schema, fmt)}"


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


def validate(grammar: str, tokenizer: llguidance.LLTokenizer | None = None,
             limits: ConstraintLimits = DEFAULT) -> str | None:
    """llguidance's reason for refusing `grammar` (cleaned), or None when it compiles."""
    reason = _refusal(grammar, tokenizer, limits)
    return None if reason is None else clean_reason(reason)


def _refusal(grammar: str, tokenizer: llguidance.LLTokenizer | None,
             limits: ConstraintLimits) -> str | None:
    """llguidance's own message refusing `grammar`, or None; checked in the thread where
    llguidance builds (build_thread.py)."""
    is_error, messages = built(lambda: llguidance.LLMatcher.validate_grammar_with_warnings(
        grammar, tokenizer, limits=limits.parser_limits()))
    return messages[0] if is_error else None


def check_lark(text: str, limits: ConstraintLimits = DEFAULT) -> GrammarError | None:
    """Why a user's Lark grammar is refused (with its line and column when known), or None
    when it compiles: %llguidance options, a grammar over `limits` (lark_size.py), what
    llguidance refuses, and a rule that can never end (lark_ends.py), in that order."""
    if _OPTIONS_LINE.search(text):
        return GrammarError("a grammar cannot set %llguidance options: qrun sets them")
    too_large = grammar_size_error(text, limits)
    if too_large is not None:
        reason, line, field = too_large
        return GrammarError(reason, line=line, column=None if line is None else 1, limit=field)
    refused = _refusal(lark_grammar(text), None, limits)
    if refused is not None:
        return _lark_error(refused)
    endless = never_ending_rule(text)
    if endless is not None:
        return GrammarError(endless[0], line=endless[1], column=1)
    return None


def check_schema(schema: Any, fmt: JsonFormat = FIXED,
                 limits: ConstraintLimits = DEFAULT) -> GrammarError | None:
    """Why llguidance refuses `schema` after the rewrite, located in the user's schema (see
    `_locate`), or None when it compiles. A few ms for most schemas. An object with more
    optional properties than `limits` allows is refused first (schema_size.py)."""
    early = _early_error(schema, fmt, limits)
    if early is not None:
        return early
    reason = _schema_reason(schema, fmt, limits)
    return None if reason is None else _locate(schema, reason, fmt, limits)


def schema_grammar(schema: Any, fmt: JsonFormat = FIXED,
                   limits: ConstraintLimits = DEFAULT) -> str:
    """`json_grammar` after check_schema's checks that need no llguidance compile (the
    schema is an object or a boolean of JSON data, with finite numbers, not too many optional
    properties in one place, not nested too deeply), for a caller that compiles the text
    with a tokenizer anyway and so checks it once (grammar_index.py LlgCache.schema); where
    llguidance then refuses it, `check_schema` locates the fault.

    Raises:
        GrammarError: one of those checks failed (located as check_schema locates it).
    """
    with collector_paused():
        try:
            early = _early_error(schema, fmt, limits)
        except RecursionError:  # nested too deeply, or a list inside itself
            early = _not_json(schema)
        if early is None:
            try:
                return json_grammar(schema, fmt)
            except RecursionError:
                early = GrammarError("the schema is nested too deeply", pointer="")
            except (TypeError, ValueError):  # json.dumps: a set, a date, a list inside itself
                early = _not_json(schema)
    raise early


def _early_error(schema: Any, fmt: JsonFormat, limits: ConstraintLimits) -> GrammarError | None:
    """What is wrong with `schema` before llguidance reads it, or None. A check added here
    holds for check_schema and schema_grammar alike. One survey of the document (schema.py)
    skips the checks that cannot find anything in it."""
    if not isinstance(schema, dict | bool):
        return GrammarError(f"a JSON Schema is an object or a boolean, not "
                            f"{type(schema).__name__}", pointer="")
    found = survey(schema)
    bad = non_finite(schema) if found is None or found.non_finite else None
    if bad is not None:
        return GrammarError("JSON has no Infinity or NaN: use a finite number", pointer=bad)
    crowded = crowded_place(schema, limits.optional_properties) \
        if found is None or found.optional_properties > limits.optional_properties else None
    if crowded is not None:
        pointer, count = crowded
        return GrammarError(
            f"{count:,} optional properties may come at one place of the value, more than the "
            f"{limits.optional_properties:,} qrun accepts (llguidance's parser holds about 4 "
            "items per such property while it reads a key)", pointer=pointer,
            limit="optional_properties")
    if fmt.formats == "assert" and (found is None or "format" in found.keys):
        unknown = _unknown_format(schema)
        if unknown is not None:
            return unknown
    if found is not None and "patternProperties" not in found.keys:
        return None
    return _open_pattern_error(schema)


def _open_pattern_error(schema: Any) -> GrammarError | None:
    """A `patternProperties` name llguidance 1.7 would read as also matching names with `"`
    or `\\`, beside an `additionalProperties` schema such names must meet instead
    (pattern_escapes.py), or None."""
    for pointer, sub in schema_positions(schema):
        name = open_pattern_property(sub)
        if name is not None:
            return GrammarError(
                f"llguidance would let property names with '\"' or '\\' match the "
                f"patternProperties pattern {name!r} and so skip additionalProperties: give "
                "the pattern's class U+0000 only with both of them, or make "
                "additionalProperties false", pointer=f"{pointer}/patternProperties/{escape(name)}")
    return None


def _not_json(schema: Any) -> GrammarError:
    """The error for a schema json.dumps refuses: the first value that is not JSON data (a
    set, a date...), or a container that holds itself."""
    try:
        found = _non_json_value(schema, "", set())
    except RecursionError:
        return GrammarError("the schema is nested too deeply", pointer="")
    if found is None:
        return GrammarError("the schema is not JSON data", pointer="")
    pointer, what = found
    return GrammarError(f"the schema is not JSON data: {what}", pointer=pointer)


def _non_json_value(value: Any, pointer: str, open_ids: set[int]) -> tuple[str, str] | None:
    if value is None or isinstance(value, str | int | float):
        return None
    if not isinstance(value, dict | list | tuple):
        return pointer, f"a {type(value).__name__}"
    if id(value) in open_ids:
        return pointer, "a container inside itself"
    open_ids.add(id(value))
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        if isinstance(value, dict) and not (key is None or isinstance(key, str | int | float)):
            return pointer, f"a key of type {type(key).__name__}"
        found = _non_json_value(item, f"{pointer}/{escape(str(key))}", open_ids)
        if found is not None:
            return found
    open_ids.discard(id(value))
    return None


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
            return GrammarError(f"{what}: qrun asserts the standard formats "
                                f'(docs/language.md §7.4); formats="annotation" ignores formats',
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


def _schema_reason(schema: Any, fmt: JsonFormat, limits: ConstraintLimits) -> str | None:
    try:
        text = json_grammar(schema, fmt)
    except RecursionError:
        return "the schema is nested too deeply"
    return validate(text, limits=limits)


def _lark_error(message: str) -> GrammarError:
    """A Lark compile error with the position llguidance prints (`at 3(7): ...`)."""
    found = _LARK_POSITION.match(message)
    if found is None:
        return GrammarError(clean_reason(message))
    return GrammarError(clean_reason(message[found.end():]), line=int(found.group(1)),
                        column=int(found.group(2)))


def _locate(schema: Any, reason: str, fmt: JsonFormat, limits: ConstraintLimits
            ) -> GrammarError:
    """llguidance names the problem but not where it is. Candidates are the keywords the
    reason names (a keyword, format, regex, $ref), else every constraining keyword, deepest
    first. For a reason that names none, each is removed in turn (oneOf made anyOf) and the
    first removal that changes the reason is the culprit; where that finds none (several
    culprits), and for a named reason, the culprit is found by halving: the shortest run of
    candidates whose removal changes the reason ends with one. The pointer is the
    keyword's."""
    keys_of, named = _named_keys(reason)
    candidates = [(p, k) for p, sub in schema_positions(schema) for k in keys_of(sub)]
    if not named:
        candidates.reverse()
    if named and len(candidates) == 1:
        return GrammarError(reason, pointer=_pointer(*candidates[0]))
    if not named:
        for pointer, key in candidates[:_MAX_TRIES]:
            if _schema_reason(_without(schema, [(pointer, key)]), fmt, limits) != reason:
                return GrammarError(reason, pointer=_pointer(pointer, key))
    found = _bisect(schema, reason, fmt, limits, candidates)
    if found is None:
        return GrammarError(reason, pointer=None if candidates else "")
    return GrammarError(reason, pointer=_pointer(*found))


def _bisect(schema: Any, reason: str, fmt: JsonFormat, limits: ConstraintLimits,
            candidates: list[tuple[str, str]]) -> tuple[str, str] | None:
    """A candidate whose removal, after those before it, changes the reason (about log2 of
    their number compiles), or None when removing them all keeps it."""
    low, high = 0, len(candidates)  # removing `low` keeps the reason; removing `high` not
    if not candidates or _schema_reason(_without(schema, candidates), fmt, limits) == reason:
        return None
    while high - low > 1:
        middle = (low + high) // 2
        if _schema_reason(_without(schema, candidates[:middle]), fmt, limits) == reason:
            low = middle
        else:
            high = middle
    return candidates[high - 1]


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


def _without(schema: Any, removals: list[tuple[str, str]]) -> Any:
    """A copy of `schema` with each (pointer, key) removed, in order (oneOf becomes anyOf);
    one below a key removed before is gone already."""
    out = copy.deepcopy(schema)
    for pointer, key in removals:
        node = pointer_target(out, pointer.split("/")[1:])
        if isinstance(node, dict) and key in node:
            value = node.pop(key)
            if key == "oneOf":
                node["anyOf"] = value
    return out
