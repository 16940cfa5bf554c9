"""The boundary where a run's inputs enter (runtime/executor.py check_inputs): inputs become
plain data, copies made only of str, int, float, bool, None, lists and dicts. A template can
then never reach an object with behaviour of its own: no value it sees can be called, and no
operator, comparison or conversion runs code of the caller's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from qrun.errors import UsageError
from qrun.lang.text import surrogate_in

MAX_INPUT_DEPTH = 100
"""Lists and dicts in inputs nest at most this deep."""
MAX_INPUT_ITEMS = 1_000_000
"""All inputs of a run hold at most this many list items, dict entries and scalars together
(a value shared in several places counts each time: it is copied each time)."""
MAX_INPUT_INT_DIGITS = 4000
"""Integers in inputs have at most this many digits, as integer literals (lang/build.py)."""
_INT_BOUND = 10 ** MAX_INPUT_INT_DIGITS
_PLAIN = "inputs hold only str, int, float, bool, None, and lists and dicts of them"


class CheckedInputs(dict[str, Any]):
    """A run's inputs as a program's check_inputs returned them (plain copies). Checked again
    by the same program, they are returned as they are: the CLI, Query.run and the run itself
    each check inputs, and the copy is made once (docs/language.md §5)."""

    checked_by: object = None


def plain_inputs(values: Mapping[str, Any], what: str = "input") -> dict[str, Any]:
    """Plain copies of `values`: Mappings become dicts and Sequences (tuples, ranges...) lists,
    recursively; str, int and float subclasses become the base type. `what` names a value in
    messages ("input", or "fill" for known values).

    Raises:
        UsageError: naming the input and the path inside it, for a value of any other type
            (a function, bytes, a set, an object...), a string with a lone surrogate, an
            integer of more than MAX_INPUT_INT_DIGITS digits, a value that contains itself,
            nesting deeper than MAX_INPUT_DEPTH or more than MAX_INPUT_ITEMS items in all.
    """
    copier = _Copier()
    plain: dict[str, Any] = {}
    for name, value in values.items():
        try:
            plain[name] = copier.copy(value, 0)
        except _Refused as refused:
            raise UsageError(f"{what} '{name}'{_where(refused.path)}: {refused}") from None
    return plain


class _Refused(Exception):
    """A value that is not plain data; `path` (keys and indexes from the input down to it) is
    filled in while the copy unwinds, so the successful path builds no paths at all."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.path: list[Any] = []


class _Copier:
    def __init__(self) -> None:
        self.items = 0
        self.open: set[int] = set()  # ids of the containers being copied (cycle detection)

    def copy(self, value: Any, depth: int) -> Any:
        self.items += 1
        if self.items > MAX_INPUT_ITEMS:
            raise _Refused(f"the inputs hold more than {MAX_INPUT_ITEMS:,} items in all")
        kind = type(value)
        if value is None or kind is bool or kind is float:
            return value
        if isinstance(value, str):
            return _text(value)
        if isinstance(value, int):
            return _integer(value)
        if isinstance(value, float):
            return float.__float__(value)  # a subclass's own __float__ is never called
        if isinstance(value, (bytes, bytearray, memoryview)):
            raise _Refused("bytes are not text (decode them first)")
        if isinstance(value, (Mapping, Sequence)):
            return self.container(value, depth)
        raise _Refused(f"a {type(value).__name__} is not plain data ({_PLAIN})")

    def container(self, value: Mapping[Any, Any] | Sequence[Any], depth: int) -> Any:
        if depth >= MAX_INPUT_DEPTH:
            raise _Refused(f"the value is nested more than {MAX_INPUT_DEPTH} levels deep")
        if id(value) in self.open:
            raise _Refused("the value contains itself")
        self.open.add(id(value))
        try:
            if isinstance(value, Mapping):
                return self.mapping(value, depth)
            return self.sequence(value, depth)
        finally:
            self.open.discard(id(value))

    def mapping(self, value: Mapping[Any, Any], depth: int) -> dict[Any, Any]:
        copied: dict[Any, Any] = {}
        for key, item in value.items():
            try:
                copied[self.key(key)] = self.copy(item, depth + 1)
            except _Refused as refused:
                refused.path.insert(0, key)
                raise
        return copied

    def sequence(self, value: Sequence[Any], depth: int) -> list[Any]:
        copied: list[Any] = []
        for index, item in enumerate(value):
            try:
                copied.append(self.copy(item, depth + 1))
            except _Refused as refused:
                refused.path.insert(0, index)
                raise
        return copied

    def key(self, key: Any) -> Any:
        if key is None or isinstance(key, (str, int, float)):
            return self.copy(key, 0)
        raise _Refused(f"a dict key of type {type(key).__name__} is not plain data ({_PLAIN})")


def _text(value: str) -> str:
    lone = surrogate_in(value)
    if lone is not None:
        raise _Refused(f"the string contains a lone surrogate {lone}, which is not valid "
                       "Unicode text")
    return str.__str__(value)


def _integer(value: int) -> int:
    plain = int.__int__(value)
    if plain.bit_length() > 13_000 and abs(plain) >= _INT_BOUND:
        raise _Refused(f"the integer has more than {MAX_INPUT_INT_DIGITS} digits")
    return plain


def _where(path: list[Any]) -> str:
    """` at [0]['k']`: where in an input a problem is (long paths elided in the middle)."""
    if not path:
        return ""
    steps = [f"[{step!r}]" for step in path]
    if len(steps) > 8:
        steps = [*steps[:4], "…", *steps[-3:]]
    return " at " + "".join(steps)
