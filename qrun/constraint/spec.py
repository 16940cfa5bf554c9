"""What a constraint is, in one place for every part that uses one (the compiler, the runtime,
qrun.Matcher): `lower(kind, value, options)` turns `regex=`, a named pattern, `json=`,
`grammar=`, `tools=` or `options=` into its spec (the text its engine reads, a description,
the type of its values) or a LoweringError saying why not and where inside the constraint's
own text; the cursor interface every engine's state offers; and the reading of a finished
value.

A constraint is lowered once per distinct value per process (an LRU below): the compiler
lowers the literal ones and keeps the spec in the IR (lang/args.py), the runtime the ones a
template computes (runtime/constraints.py), Matcher its own (matcher.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from qrun.constraint.grammar import FIXED, JsonFormat, check_lark, check_schema, json_grammar
from qrun.constraint.grammar import lark_grammar as lark_text
from qrun.constraint.grammar.limits import DEFAULT as DEFAULT_LIMITS
from qrun.constraint.grammar.limits import ConstraintLimits
from qrun.constraint.lru import Lru
from qrun.constraint.patterns import PATTERNS
from qrun.constraint.tools import (
    DEFAULT_KEYS,
    CallKeys,
    ToolsError,
    call_schema,
    pointer_inside,
    read_tools,
)
from qrun.errors import suggest
from qrun.regex import PatternError, compile_dfa, escape

__all__ = ["DFA", "KINDS", "LLGUIDANCE", "PATTERN_TYPES", "ConstraintSpec", "Cursor",
           "LoweringError", "lower", "typed_value"]

# The engines a constraint compiles with: qrun's byte DFA (qrun/regex, regex_index.py) for
# regexes, named patterns and option lists; llguidance (grammar_index.py) for JSON Schemas
# and Lark grammars.
DFA = "dfa"
LLGUIDANCE = "llguidance"
# What a constraint can be given as.
KINDS = ("regex", "pattern", "json", "grammar", "tools", "options")
# Named patterns whose values are read as Python values (docs/language.md §15.2).
PATTERN_TYPES = {"INT": "int", "FLOAT": "float", "BOOL": "bool"}
# Lowered constraints kept per process (a hole in a loop, a Matcher per instance, a schema
# variable that takes a few values: each distinct value is checked and written once).
_LOWERED_MAX = 512


class Cursor(Protocol):
    """A hole's constraint state (regex_index.py MaskCursor, grammar_index.py LlgCursor,
    healing.py HealCursor): what the runtime's holes and qrun.Matcher (matcher.py) read and
    move."""

    def allowed(self, tokens_left: int | None = None) -> npt.NDArray[np.bool_]:
        """Bool mask [V] of tokens that keep a full match reachable within
        `tokens_left` tokens (None: any number), EOS included where the text so far is a
        full match. Shared with the engine's caches: copy it before changing it."""
        ...

    def can_end(self) -> bool:
        """The text so far is a full match."""
        ...

    def can_continue(self) -> bool:
        """Some non-empty continuation is still possible."""
        ...

    def advance(self, token_id: int) -> None:
        """Consume a token (one that allowed() admitted)."""
        ...

    def consume(self, token_id: int) -> bool:
        """Consume `token_id` if allowed() would admit it, an EOS id aside (ending is the
        caller's); False, and no change, if not."""
        ...

    def rollback(self, tokens: int) -> None:
        """Take back the last `tokens` tokens consumed (by advance or consume).

        Raises:
            ValueError: more tokens than were consumed, or a negative count.
        """
        ...

    def copy(self) -> Cursor:
        """An independent cursor in the same state."""
        ...

    def forced_bytes(self) -> bytes:
        """The bytes every continuation must start with (b"" when there is a choice)."""
        ...

    def accepts(self, data: bytes) -> bool:
        """Whether `data`, read from the constraint's start, is a full match."""
        ...


@dataclass(frozen=True, slots=True)
class ConstraintSpec:
    """A hole's constraint as evaluated for this run: its text for its engine (`engine`
    "dfa": a regex for qrun's DFA; "llguidance": a Lark grammar, a JSON Schema already
    written as one, see qrun/llg), a short description for records and traces, and the type
    its values are read as (docs/language.md §15.2): "json" (parsed JSON), "int", "float",
    "bool" (the INT, FLOAT and BOOL patterns), or "text"."""

    pattern: str
    description: str
    value_type: str = "text"
    engine: str = DFA
    limits: ConstraintLimits = DEFAULT_LIMITS  # those it was checked under (llguidance's rows)


def typed_value(text: str, value_type: str) -> Any:
    """The value of a hole's text, read as its constraint's type.

    Raises:
        ValueError: the text cannot be read so (the constraint guarantees it can, but Python
            refuses integers of more than 4,300 digits, and a number past a float's range,
            `1e400`, would be infinity, which JSON cannot carry: the result would give null).
    """
    match value_type:
        case "json":
            return json.loads(text, parse_float=_finite, parse_constant=_no_constant)
        case "int":
            return int(text)
        case "float":
            return _finite(text)
        case "bool":
            return text == "true"
    return text


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is beyond a float's range (JSON has no infinity)")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not a JSON number")


class LoweringError(ValueError):
    """Why a constraint cannot be lowered. Where inside the constraint's own text, when known:
    `offset` (a character of a regex pattern), `line`/`column` (1-based, in a Lark grammar);
    a schema's JSON pointer is in the message. `wrong_type` is set when the value is not of
    the kind at all (a number given as a regex): the caller's own type error, not a
    constraint's. `limit` names the ConstraintLimits field that refused it, when raising it
    would let it through. `notes` are hints such as "did you mean ...?"."""

    def __init__(self, message: str, *, offset: int | None = None, line: int | None = None,
                 column: int | None = None, wrong_type: bool = False,
                 limit: str | None = None, notes: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset
        self.line = line
        self.column = column
        self.wrong_type = wrong_type
        self.limit = limit
        self.notes = tuple(notes)

    def again(self) -> LoweringError:
        """A fresh error with the same content (a remembered refusal is raised anew, so
        tracebacks do not pile up on one object)."""
        return LoweringError(self.message, offset=self.offset, line=self.line,
                             column=self.column, wrong_type=self.wrong_type, limit=self.limit,
                             notes=self.notes)


def lower(kind: str, value: Any, options: JsonFormat = FIXED,
          limits: ConstraintLimits = DEFAULT_LIMITS, *,
          keys: CallKeys = DEFAULT_KEYS) -> ConstraintSpec:
    """The spec of a constraint given as `kind` (one of KINDS) with `value`: a regex pattern,
    a pattern name ("EMAIL"), a JSON Schema (a dict, a bool or its JSON text), a Lark
    grammar, a list of tools in OpenAI's function format (tools.py; the spec is that of one
    call, its object written with `keys`: the model's own tool-call format), or a list of
    option strings. `options` is the JSON layout, closedness and format policy of a schema
    or of the tools' parameters (ignored by the other kinds); `limits` bound the size of a
    grammar or schema (grammar/limits.py). Checked as its engine will compile it, so every
    error shows here; remembered per process.

    Raises:
        LoweringError: the value is of the wrong type, or its engine refuses it (why, and
            where inside it when known).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown constraint kind {kind!r}")
    key = _key(kind, value, options)
    if key is None:  # unhashable and not JSON: only a type error can come of it
        return _lower(kind, value, options, limits, keys)
    key = (*key, limits, keys if kind == "tools" else None)
    found = _LOWERED.get(key)
    if found is None:  # lowered outside the cache's lock: a schema may take seconds
        try:
            found = _lower(kind, value, options, limits, keys)
        except LoweringError as exc:
            found = exc
        _LOWERED.put(key, found)
    if isinstance(found, LoweringError):
        raise found.again()
    return found


_LOWERED: Lru[tuple[Any, ...], ConstraintSpec | LoweringError] = Lru(_LOWERED_MAX)


def _key(kind: str, value: Any, options: JsonFormat) -> tuple[Any, ...] | None:
    """What identifies a lowered constraint: the value itself when it is text, a schema's (or
    a tools list's) JSON text in its own key order (llguidance keeps the schema's property
    order, and a call schema the tools' order)."""
    schema = kind in ("json", "tools")
    if isinstance(value, str):
        return (kind, value, options if schema else None)
    if schema:
        try:
            return (kind, "", json.dumps(value, ensure_ascii=False, allow_nan=True), options)
        except (TypeError, ValueError, RecursionError):
            return None
    if kind == "options" and isinstance(value, list | tuple) and all(
            isinstance(o, str) for o in value):
        return (kind, tuple(value), None)
    return None


def _lower(kind: str, value: Any, options: JsonFormat, limits: ConstraintLimits,
           keys: CallKeys) -> ConstraintSpec:
    match kind:
        case "regex":
            if not isinstance(value, str):
                raise LoweringError(f"regex must be a string, got {type(value).__name__}",
                                    wrong_type=True)
            _check_regex(value)
            return ConstraintSpec(value, f"regex={json.dumps(value)}")
        case "pattern":
            if not isinstance(value, str):
                raise LoweringError(f"a pattern name must be a string, got "
                                    f"{type(value).__name__}", wrong_type=True)
            if value not in PATTERNS:
                raise LoweringError(f"unknown pattern '{value}'", notes=[
                    *suggest(str(value), PATTERNS), "patterns: " + ", ".join(sorted(PATTERNS))])
            _check_regex(PATTERNS[value])
            return ConstraintSpec(PATTERNS[value], f"regex={value}",
                                  PATTERN_TYPES.get(value, "text"))
        case "options":
            if (isinstance(value, str) or not isinstance(value, list | tuple) or not value
                    or not all(isinstance(o, str) and o for o in value)):
                raise LoweringError("options must be a non-empty list of non-empty strings",
                                    wrong_type=True)
            pattern = "(?:" + "|".join(escape(o) for o in value) + ")"
            _check_regex(pattern)
            return ConstraintSpec(pattern, "options=" + json.dumps(list(value),
                                                                   ensure_ascii=False))
        case "grammar":
            if not isinstance(value, str) or not value.strip():
                raise LoweringError(f"grammar must be a non-empty string (a Lark grammar), "
                                    f"got {type(value).__name__}", wrong_type=True)
            error = check_lark(value, limits)
            if error is not None:
                raise LoweringError(f"grammar: {error}", line=error.line, column=error.column,
                                    limit=error.limit)
            return ConstraintSpec(lark_text(value), "grammar=" + json.dumps(
                value, ensure_ascii=False), "text", LLGUIDANCE, limits)
        case "tools":
            return _lower_tools(value, options, limits, keys)
        case _:
            return _lower_schema(value, options, limits)


def _lower_schema(schema: Any, options: JsonFormat, limits: ConstraintLimits) -> ConstraintSpec:
    if isinstance(schema, str | bytes):
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError) as exc:
            raise LoweringError(f"the JSON Schema is not valid JSON: {exc}") from None
    if not isinstance(schema, dict | bool):
        raise LoweringError(f"json must be a JSON Schema object, got {type(schema).__name__}",
                            wrong_type=True)
    try:
        text = json.dumps(schema, sort_keys=True, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError, RecursionError) as exc:
        raise LoweringError(f"JSON Schema: {exc}") from None
    error = check_schema(schema, options, limits)
    if error is not None:
        raise LoweringError(f"JSON Schema: {error}", limit=error.limit)
    description = f"json={text}" + (" closed=true" if options.closed else "") + (
        f' formats="{options.formats}"' if options.formats != "assert" else "")
    return ConstraintSpec(json_grammar(schema, options), description, "json", LLGUIDANCE,
                          limits)


def _lower_tools(value: Any, options: JsonFormat, limits: ConstraintLimits,
                 keys: CallKeys) -> ConstraintSpec:
    """The spec of a call to one of the tools `value` lists (tools.py call_schema, lowered as
    json= is): each tool's parameters are lowered alone first, so a refusal names the tool
    and points into the list (`tool "search": JSON Schema: ... (at
    /0/function/parameters/...)`). The description lists the names (`tools=["search",
    "calc"]`); the values are JSON."""
    try:
        tools = read_tools(value)
    except ToolsError as error:
        raise LoweringError(str(error), wrong_type=True) from None
    for tool in tools:
        try:
            lower("json", tool.parameters, options, limits)
        except LoweringError as error:
            message = pointer_inside(error.message, tool.pointer)
            raise LoweringError(f'tool "{tool.name}": {message}', limit=error.limit,
                                notes=error.notes) from None
    spec = lower("json", call_schema(tools, keys), options, limits)
    names = json.dumps([t.name for t in tools])
    return replace(spec, description=f"tools={names}")


def _check_regex(pattern: str) -> None:
    """Compile the DFA now (kept by compile_dfa's cache for the token index), so a pattern's
    every error shows when it is lowered."""
    try:
        compile_dfa(pattern)
    except PatternError as exc:
        raise LoweringError(str(exc), offset=exc.pos) from None
    except RecursionError:
        raise LoweringError("invalid regex: pattern nested too deeply") from None
