"""JSON at qrun's edges, the one wire format of the command line (qrun/cli/command.py) and the
server (qrun/serve/application.py): run inputs read strictly, one value or one line at a time, so a
hostile line fails alone with a message instead of an internal error; and rows written so that
every line is valid JSON that qrun reads back line by line (docs/language.md §16.2)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from qrun.errors import QrunError

if TYPE_CHECKING:
    from qrun.runtime.result import Result

FIELDS = ("text", "vars", "stats", "holes", "output", "particle_blocks")
"""What a result row may hold (`--fields`, and a server request's "fields")."""
DEFAULT_FIELDS = ("text", "vars", "stats")

MAX_DEPTH = 100
"""The deepest nesting of lists and objects an input value may have. Deeper values are refused
up front: Python's JSON reader and printer recurse, and fail near 1,000 levels."""

BOM = b"\xef\xbb\xbf"
# JSON allows these three raw inside strings, but str.splitlines() (and readers built on it)
# breaks lines at them: qrun's own output escapes them. Everything below U+0020 json.dumps
# escapes already.
_LINE_BREAKS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


class BadInput(ValueError):
    """A value that cannot be a run's input; the message says why, without a location."""


def parse_value(text: str) -> Any:
    """Strict JSON (RFC 8259): no NaN or Infinity, numbers that fit in a float or in Python's
    integer digit limit, at most MAX_DEPTH levels, strings that UTF-8 can carry (no lone
    surrogate such as "\\ud800").

    Raises:
        BadInput: the text is not such a value.
    """
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise BadInput(f"nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}" if "\n" in text else f"column {exc.colno}"
        raise BadInput(f"invalid JSON: {exc.msg} at {where}") from None
    except ValueError as exc:  # Python's limit on the digits of an int, or _finite_float
        raise BadInput(_number_message(exc)) from None
    check_value(value)
    return value


def check_value(value: Any) -> None:
    """Refuse values no run can use: nesting deeper than MAX_DEPTH, strings (keys included)
    with a lone surrogate. Iterative, so a deep value cannot exhaust the stack.

    Raises:
        BadInput: the first such problem found.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                raise BadInput(f"nested deeper than {MAX_DEPTH} levels")
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def check_text(text: str, what: str) -> None:
    """Refuse a string input UTF-8 cannot carry (from a command line that was not UTF-8).

    Raises:
        BadInput: naming `what`.
    """
    try:
        _check_text(text)
    except BadInput as exc:
        raise BadInput(f"{what}: {exc}") from None


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise BadInput(f"a string holds the lone surrogate \\u{ord(bad):04x}, which no UTF-8 "
                       "text can carry (invalid UTF-8 in the input, or a JSON escape of half "
                       "a surrogate pair)") from None


def _refuse_constant(name: str) -> Any:
    raise BadInput(f"invalid JSON: {name} is not a JSON number (use null or a string)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadInput(f"the number {text[:20]}{'...' if len(text) > 20 else ''} is too large "
                       "for a float")
    return value


def _number_message(exc: ValueError) -> str:
    if isinstance(exc, BadInput):
        return str(exc)
    limit = sys.get_int_max_str_digits()
    return f"an integer with more than {limit} digits (Python's limit for reading one)"


def split_lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """The lines of a JSON Lines file with their 1-based numbers in the file: split at b"\\n"
    only (U+2028, U+0085 and form feeds inside a line stay in it), a CR before the newline
    dropped, a UTF-8 byte order mark at the start skipped, and blank lines (spaces, tabs)
    left out."""
    if data.startswith(BOM):
        data = data[len(BOM):]
    for number, line in enumerate(data.split(b"\n"), start=1):
        line = line.removesuffix(b"\r")
        if line.strip(b" \t\r"):
            yield number, line


def parse_line(line: bytes) -> dict[str, Any]:
    """One JSON Lines line as a run's inputs: UTF-8, strict JSON (parse_value), an object.

    Raises:
        BadInput: why the line cannot be a run's inputs.
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"invalid UTF-8 at byte {exc.start + 1} of the line") from None
    value = parse_value(text)
    if not isinstance(value, dict):
        raise BadInput(f"each line must be a JSON object, not {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return "a number"


def dumps_line(value: Any) -> str:
    """`value` as one line of JSON that reads back with any line splitter: non-ASCII text
    kept, U+0085/U+2028/U+2029 escaped, and every non-finite float (NaN, ±Infinity: not
    JSON) written as null."""
    text = json.dumps(finite(value), ensure_ascii=False, allow_nan=False)
    return text.translate(_LINE_BREAKS)


def finite(value: Any) -> Any:
    """`value` with every non-finite float inside it replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


class Rows:
    """The JSON rows of runs, as `qrun --json` and `--inputs` print them and `qrun serve`
    answers (docs/serve.md §2.2, §2.5): a result's chosen `fields`, or an error with the number
    of its input line (and its stable `code` over HTTP); "id" first, that input's value, when
    `id_field` names one. `hint` may add to a run's error before it is written."""

    def __init__(self, fields: tuple[str, ...], id_field: str | None = None,
                 hint: Callable[[QrunError], QrunError] | None = None) -> None:
        self.fields = fields
        self.id_field = id_field
        self.hint = hint

    def start(self, inputs: Any) -> dict[str, Any]:
        """What a row of `inputs` starts with: {"id": ...} when an id field is named."""
        if self.id_field is None:
            return {}
        return {"id": inputs.get(self.id_field) if isinstance(inputs, dict) else None}

    def result(self, result: Result, inputs: Any = None) -> dict[str, Any]:
        return {**self.start(inputs), **result.row(self.fields)}

    def error(self, message: str, line: int, inputs: Any = None,
              code: str | None = None) -> dict[str, Any]:
        row = {**self.start(inputs), "error": message, "line": line}
        return row if code is None else {**row, "code": code}

    def outcome(self, outcome: Result | QrunError, inputs: Any, line: int) -> dict[str, Any]:
        """A run's row: its result's, or its error's (hinted) with its line."""
        if isinstance(outcome, QrunError):
            return self.error(str(self.hint(outcome) if self.hint else outcome), line, inputs)
        return self.result(outcome, inputs)
