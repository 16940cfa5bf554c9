"""Known values (docs/language.md §16.1, `run(fill=...)`, `qrun --fill NAME=VALUE`): a hole given
its value is not generated; the value is checked against the hole's constraint, stop strings,
max_tokens or options, appended as fixed text (the KV cache is fed with it as with any text,
never as control tokens), and captured typed. A hole in a loop takes a list, one value per
iteration (the iterations past its end are generated); a hole in a fork, a particles block or a
macro cannot be filled."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from qrun.constraint import ConstraintSpec, Cursor
from qrun.constraint.spec import typed_value
from qrun.errors import InputError, UsageError, suggest
from qrun.lang import ir
from qrun.lang.inputs import plain_inputs
from qrun.source import Source


class Fills:
    """A run's known values by hole name, with how many of a loop hole's are used."""

    def __init__(self, program: ir.Program, values: Mapping[str, Any]) -> None:
        self.values = plain_inputs(values, "fill")  # plain data, as inputs (lang/inputs.py)
        self.used: dict[str, int] = {}
        holes = _fillable(program)
        for name, value in self.values.items():
            where = holes.get(name)
            if where is None:
                raise UsageError(f"cannot fill '{name}': the template has no hole of that name "
                                 f"outside macros{_hint(name, holes)}")
            if where == "fork":
                raise UsageError(f"cannot fill hole '{name}': it is inside a fork or a "
                                 "particles block, whose branches run side by side "
                                 "(docs/language.md §16.1)")
            if where == "loop" and not isinstance(value, list):
                raise UsageError(f"hole '{name}' is inside a loop: fill it with a list, one "
                                 "value per iteration")

    def __bool__(self) -> bool:
        return bool(self.values)

    def fresh(self) -> Fills:
        """The same checked values with none used yet: what each run of a request starts
        from (a request may run more than once, qrun/runtime/request.py)."""
        fills = Fills.__new__(Fills)
        fills.values, fills.used = self.values, {}
        return fills

    def take(self, op: ir.Gen | ir.Select) -> tuple[bool, Any]:
        """(True, the known value) for this run of the hole, or (False, None) when it is
        generated."""
        if op.name not in self.values:
            return False, None
        value = self.values[op.name]
        if not op.in_loop:
            return True, value
        if not isinstance(value, list):  # __init__ asks a list of any name with a loop hole
            raise UsageError(f"hole '{op.name}' is inside a loop: fill it with a list, one "
                             "value per iteration")
        index = self.used.get(op.name, 0)
        if index >= len(value):
            return False, None
        self.used[op.name] = index + 1
        return True, value[index]


def _fillable(program: ir.Program) -> dict[str, str]:
    """Hole name -> "" (plain), "loop" or "fork", for the holes outside macros, in source
    order. A name with holes of several kinds takes the strictest: "fork" when any is in a
    fork (it has more holes than the walk that skips forks finds), else "loop" when any is
    in a loop (its value is a list whichever branch runs)."""
    everywhere = Counter(op.name for op, _ in ir.holes(program.ops, program.source))
    outside = Counter[str]()
    looped: set[str] = set()
    for op, _ in ir.holes(program.ops, program.source, forks=False):
        outside[op.name] += 1
        if op.in_loop:
            looped.add(op.name)
    return {name: "fork" if count > outside[name] else "loop" if name in looped else ""
            for name, count in everywhere.items()}


def _hint(name: str, holes: Mapping[str, str]) -> str:
    notes = suggest(name, holes)
    listed = ", ".join(holes) or "none"
    return f" ({notes[0] + '; ' if notes else ''}holes: {listed})"


def fill_text(name: str, value: Any, spec: ConstraintSpec | None) -> str:
    """The text a known value is written as: a string as it is (a json= hole's read as JSON
    and written in the hole's layout), anything else as JSON.

    Raises:
        UsageError: a json= hole's string is not JSON, or a value is not JSON data.
    """
    if spec is not None and spec.value_type == "json" and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise UsageError(f"the value for hole '{name}' (a json= hole) is not JSON: "
                             f"{exc}") from None
    elif isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"the value for hole '{name}' is not JSON data: {exc}") from None


def check_gen_fill(op: ir.Gen, text: str, spec: ConstraintSpec | None, cursor: Cursor | None,
                   stop: tuple[str, ...], keep_stop: bool, max_tokens: int, tokens: int,
                   source: Source) -> Any:
    """The typed value of `text` filled into `op`, after checking it fits the hole.

    Raises:
        InputError: naming the hole and what the value breaks (its constraint, a stop
            string, max_tokens), at the hole.
    """
    def refuse(why: str) -> InputError:
        return InputError(f"the value {_short(text)} for hole '{op.name}' {why}", op.span,
                          source, notes=["a known value must be one the hole could generate"])

    body = text
    if keep_stop:
        body = next((text[: -len(s)] for s in stop if text.endswith(s)), text)
    for string in stop:
        if string in body:
            raise refuse(f"contains its stop string {json.dumps(string)}")
    if tokens > max_tokens:
        raise refuse(f"is {tokens} tokens long, over its max_tokens={max_tokens}")
    if cursor is not None and spec is not None and not cursor.accepts(text.encode("utf-8")):
        raise refuse(f"does not match its constraint {spec.description}")
    if spec is None:
        return text
    try:
        return typed_value(text, spec.value_type)
    except (ValueError, RecursionError) as exc:
        raise refuse(f"cannot be read as {spec.value_type}: {exc}") from None


def check_select_fill(op: ir.Select, value: Any, options: Sequence[str],
                      source: Source) -> str:
    """A select hole's known value, which must be one of its options.

    Raises:
        InputError: it is not.
    """
    if not isinstance(value, str) or value not in options:
        raise InputError(f"the value {_short(value)} for hole '{op.name}' is not one of its "
                         f"options {json.dumps(list(options), ensure_ascii=False)}",
                         op.span, source)
    return value


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


