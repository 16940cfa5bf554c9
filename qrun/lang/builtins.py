"""The stdlib of template expressions (docs/language.md §6 and §20): the only functions a template
calls (as `f(x)` or as a filter `x | f`), the tests of `x is NAME`, the dict methods of
`d.NAME()`, and the Undefined value. Pure functions over plain data: lang/evaluate.py charges
their work to the run's budget and bounds what they build. Jinja's filters keep Jinja's meaning,
argument names and defaults (jinja2/filters.py and jinja2/tests.py, Jinja 3.1)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from qrun.limits import LimitExceeded, measure, size_cost

MAX_RANGE = 100_000
"""range() yields at most this many items."""
MAX_SIZE = 10_000_000
"""Strings, lists and dicts built by an operator, a literal or a stdlib function hold at most
this many characters/items, counted through nested containers as if printed (`[[0] * 1000] *
1000` has size 1_001_000 although it shares one inner list). Inputs are not limited."""
MAX_INDENT = 100
"""tojson(indent=N) takes 0 <= N <= MAX_INDENT."""


@dataclass(frozen=True, slots=True)
class Undefined:
    """What a missing variable, a missing key or index, or the first/last item of an empty
    sequence is where only `is defined`, `is undefined` and `default` look (Jinja's
    StrictUndefined): anywhere else the evaluator reports `reason` as the error."""

    reason: str


def text_of(value: Any) -> str:
    """A value as `{{ value }}` writes it (docs/language.md §2): a string as is, none as '',
    true/false, numbers as Python prints them, lists and dicts as JSON (Python's repr where
    JSON cannot say it). Also what `~` and the text filters (trim, title, ...) convert with,
    where Jinja uses Python's str()."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple | Mapping):
        try:
            return json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def type_name(value: Any) -> str:
    """The name of a value's type in messages."""
    return {str: "string", int: "int", float: "float", bool: "bool", list: "list",
            dict: "dict", tuple: "tuple", type(None): "None"}.get(type(value),
                                                                  type(value).__name__)


# ---- qrun's functions (Python's meaning) ---------------------------------------------------------


def _string(value: Any, func: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{func}() expects a string, got {type_name(value)}")
    return value


def _range(*args: Any) -> list[int]:
    if not all(isinstance(a, int) for a in args):
        raise TypeError("range() expects integers")
    items = range(*args)
    # Counted with Python's integers: len() of a range past sys.maxsize items raises
    # OverflowError ("Python int too large to convert to C ssize_t").
    step = items.step
    count = max(0, (items.stop - items.start + step - (1 if step > 0 else -1)) // step)
    if count > MAX_RANGE:
        raise LimitExceeded(f"range() would have {count} items (at most {MAX_RANGE})")
    return list(items)


def _join(items: Any, sep: Any = "") -> str:
    parts = [str(item) for item in items]
    glue = _string(sep, "join")
    if sum(map(len, parts)) + len(glue) * max(0, len(parts) - 1) > MAX_SIZE:
        raise LimitExceeded(f"join() result would exceed {MAX_SIZE} characters")
    return glue.join(parts)


def _split(value: Any, sep: Any = None, maxsplit: Any = -1) -> list[str]:
    return _string(value, "split").split(sep, maxsplit)


def _strip(value: Any, chars: Any = None) -> str:
    return _string(value, "strip").strip(chars)


def _min(*args: Any) -> Any:
    return min(*args)


def _max(*args: Any) -> Any:
    return max(*args)


# ---- Jinja's filters -------------------------------------------------------------------------


def _default(value: Any, default_value: Any = "", boolean: Any = False) -> Any:
    """Jinja's default: `default_value` when `value` is undefined, or (with boolean=true) false."""
    if isinstance(value, Undefined) or (boolean and not value):
        return default_value
    return value


def _replace(value: Any, old: Any, new: Any, count: Any = None) -> str:
    """Jinja's replace: every occurrence, or the first `count`; the arguments as text."""
    text, before, after = text_of(value), text_of(old), text_of(new)
    if count is None:
        count = -1
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"replace() count must be an integer, got {type_name(count)}")
    hits = text.count(before) if before else len(text) + 1
    if count >= 0:
        hits = min(hits, count)
    if len(text) + hits * (len(after) - len(before)) > MAX_SIZE:
        raise LimitExceeded(f"replace() result would exceed {MAX_SIZE} characters")
    return text.replace(before, after, count)


def _trim(value: Any, chars: Any = None) -> str:
    if chars is not None and not isinstance(chars, str):
        raise TypeError(f"trim() chars must be a string, got {type_name(chars)}")
    return text_of(value).strip(chars)


_WORD_START = re.compile(r"([-\s({\[<]+)")  # jinja2/filters.py _word_beginning_split_re


def _title(value: Any) -> str:
    """Jinja's title: each word's first character upper case, the rest lower case; words start
    after whitespace, '-', '(', '{', '[' and '<' (not after an apostrophe, unlike str.title)."""
    parts = _WORD_START.split(text_of(value))
    return "".join(part[0].upper() + part[1:].lower() for part in parts if part)


def _round(value: Any, precision: Any = 0, method: Any = "common") -> Any:
    """Jinja's round: Python's round() ("common": to even on a tie), or math.ceil/floor at
    `precision` digits; a float comes back a float even at precision 0."""
    if method not in ("common", "ceil", "floor"):
        raise ValueError("round() method must be 'common', 'ceil' or 'floor'")
    if isinstance(precision, bool) or not isinstance(precision, int):
        raise TypeError(f"round() precision must be an integer, got {type_name(precision)}")
    if abs(precision) > 100:
        raise LimitExceeded("round() takes at most 100 digits")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"round() expects a number, got {type_name(value)}")
    if method == "common":
        return round(value, precision)
    scale = 10 ** precision
    rounded = math.ceil(value * scale) if method == "ceil" else math.floor(value * scale)
    return rounded / scale


def _sequence(value: Any, func: str) -> list[Any]:
    """The items `func` works on: a list's or tuple's, a string's characters, a dict's keys."""
    if isinstance(value, list | tuple | str | Mapping):
        return list(value)
    raise TypeError(f"{func}() expects a list, a string or a dict, got {type_name(value)}")


def _first(value: Any) -> Any:
    if isinstance(value, list | tuple | str | Mapping):
        return next(iter(value), Undefined("first(): no first item, the sequence is empty"))
    raise TypeError(f"first() expects a list, a string or a dict, got {type_name(value)}")


def _last(value: Any) -> Any:
    if isinstance(value, list | tuple | str | Mapping):
        return next(reversed(value), Undefined("last(): no last item, the sequence is empty"))
    raise TypeError(f"last() expects a list, a string or a dict, got {type_name(value)}")


def _attribute_parts(attribute: Any, func: str) -> list[str | int]:
    """Jinja's attribute path: 'a.b.0' is key 'a', key 'b', index 0; an integer is an index."""
    if attribute is None:
        return []
    if isinstance(attribute, str):
        return [int(part) if part.isdigit() else part for part in attribute.split(".")]
    if isinstance(attribute, int) and not isinstance(attribute, bool):
        return [attribute]
    raise TypeError(f"{func}() attribute must be a string or an integer, got "
                    f"{type_name(attribute)}")


def _lookup(item: Any, parts: list[str | int], fold: bool, func: str) -> Any:
    """`item` followed down `parts` (dict keys and list indexes only: never an attribute of a
    Python object), lower-cased when `fold` and a string (Jinja's ignore_case)."""
    for part in parts:
        if isinstance(item, Mapping):
            if part not in item:
                raise KeyError(f"{func}(): key {part!r} not found in an item")
            item = item[part]
        elif isinstance(item, list | tuple) and isinstance(part, int) and part < len(item):
            item = item[part]
        else:
            raise TypeError(f"{func}(): cannot look up {part!r} in a {type_name(item)}")
    return item.lower() if fold and isinstance(item, str) else item


def _sort(value: Any, reverse: Any = False, case_sensitive: Any = False,
          attribute: Any = None) -> list[Any]:
    """Jinja's sort: stable, strings compared lower-cased unless case_sensitive; `attribute`
    is a key path, or several separated by commas ('age,name')."""
    items = _sequence(value, "sort")
    paths = [_attribute_parts(a, "sort") for a in (
        attribute.split(",") if isinstance(attribute, str) else [attribute])]
    fold = not case_sensitive

    def key(item: Any) -> list[Any]:
        return [_lookup(item, path, fold, "sort") for path in paths]

    return sorted(items, key=key, reverse=bool(reverse))


def _hashable(value: Any) -> Any:
    """A hashable stand-in equal where the values are equal (`unique` of lists and dicts,
    which Jinja refuses)."""
    if isinstance(value, list | tuple):
        return ("[]", tuple(_hashable(item) for item in value))
    if isinstance(value, Mapping):
        return ("{}", frozenset((k, _hashable(v)) for k, v in value.items()))
    return value


def _unique(value: Any, case_sensitive: Any = False, attribute: Any = None) -> list[Any]:
    """Jinja's unique: the items in order of first occurrence, strings compared lower-cased
    unless case_sensitive, by `attribute` (one key path) when given."""
    path = _attribute_parts(attribute, "unique")
    seen: set[Any] = set()
    kept: list[Any] = []
    for item in _sequence(value, "unique"):
        key = _hashable(_lookup(item, path, not case_sensitive, "unique"))
        if key not in seen:
            seen.add(key)
            kept.append(item)
    return kept


_HTML_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "'": "\\u0027"})


def _tojson(value: Any, indent: Any = None) -> str:
    """Jinja's tojson: json.dumps with sorted keys (Jinja's default policy), non-ASCII and
    `< > & '` escaped as \\uXXXX (jinja2/utils.py htmlsafe_json_dumps). Encoded piece by
    piece, so a value too large to write stops at MAX_SIZE characters."""
    if indent is not None and (isinstance(indent, bool) or not isinstance(indent, int)
                               or not 0 <= indent <= MAX_INDENT):
        raise ValueError(f"tojson() indent must be an integer from 0 to {MAX_INDENT}")
    pieces: list[str] = []
    size = 0
    for piece in json.JSONEncoder(sort_keys=True, indent=indent).iterencode(value):
        size += len(piece)
        if size > MAX_SIZE:
            raise LimitExceeded(f"tojson() result would exceed {MAX_SIZE} characters")
        pieces.append(piece)
    return "".join(pieces).translate(_HTML_SAFE)


# ---- the tables --------------------------------------------------------------------------------

FUNCTIONS: dict[str, Callable[..., Any]] = {
    "len": len,
    "range": _range,
    "int": int,
    "float": float,
    "str": str,
    "lower": lambda value: text_of(value).lower(),
    "upper": lambda value: text_of(value).upper(),
    "strip": _strip,
    "join": _join,
    "replace": _replace,
    "split": _split,
    "min": _min,
    "max": _max,
    "abs": abs,
    "round": _round,
    "default": _default,
    "length": len,
    "tojson": _tojson,
    "trim": _trim,
    "title": _title,
    "capitalize": lambda value: text_of(value).capitalize(),
    "first": _first,
    "last": _last,
    "sort": _sort,
    "unique": _unique,
}
"""The only functions a template can call, as `f(x, ...)` or as a filter `x | f(...)`. min and
max take positional arguments only: Python's `key=` would call a value."""
KEYWORDS: dict[str, tuple[str, ...]] = {
    "strip": ("chars",),
    "join": ("sep",),
    "replace": ("count",),
    "split": ("sep", "maxsplit"),
    "round": ("precision", "method"),
    "default": ("default_value", "boolean"),
    "tojson": ("indent",),
    "trim": ("chars",),
    "sort": ("reverse", "case_sensitive", "attribute"),
    "unique": ("case_sensitive", "attribute"),
}
"""The keyword arguments each function documents (docs/language.md §6); no other is accepted."""
CONSTANT_TIME = frozenset({"len", "length", "first", "last", "default"})
"""Functions whose work does not grow with their arguments (the evaluator charges the others
by the size of their arguments)."""
PASS_THROUGH = frozenset({"first", "last", "default"})
"""Functions that return an argument or an item of one: they compute no value to bound."""


def sort_cost(args: list[Any]) -> int:
    """Steps for sort() beyond reading its argument: its key is computed per item in Python
    (~1 us each) and items are compared ~log2(n) times each (measured: 100,000 shuffled
    integers sort in ~0.4 s on the 2-core CI machine; long strings compare by characters)."""
    items, chars = measure(args[0]) if args else (0, 0)
    count = len(args[0]) if args and isinstance(args[0], list | tuple | str | Mapping) else 0
    halvings = max(1, count.bit_length())
    return items + count * halvings // 8 + size_cost(0, chars) * halvings


def per_item_cost(args: list[Any]) -> int:
    """Steps for tojson() and unique(), which visit every list item and dict entry in Python
    (json's C encoder takes no size bound; unique() hashes a copy of lists and dicts): a step,
    about a microsecond, per item (measured as for sort_cost). A string is one piece for
    tojson but len(s) items for unique."""
    items, _ = measure(args[0]) if args else (0, 0)
    return items


def unique_cost(args: list[Any]) -> int:
    if args and isinstance(args[0], str):
        return len(args[0])
    return per_item_cost(args)


EXTRA_COSTS: dict[str, Callable[[list[Any]], int]] = {
    "sort": sort_cost, "tojson": per_item_cost, "unique": unique_cost}
"""Steps charged before a call, on top of the size of its arguments."""


def keyword_error(func: str, name: str) -> str | None:
    """Why `func(name=...)` is refused, or None when `name` is one of its keywords (shared by
    the compile-time check in lang/compiler.py and the evaluator)."""
    allowed = KEYWORDS.get(func, ())
    if name in allowed:
        return None
    takes = ", ".join(allowed) if allowed else "no keyword arguments"
    return f"{func}() has no keyword argument '{name}' (it takes {takes})"


def _is_sequence(value: Any) -> bool:
    return isinstance(value, str | list | tuple | Mapping)


TESTS: dict[str, Callable[[Any], bool]] = {
    "defined": lambda value: not isinstance(value, Undefined),
    "undefined": lambda value: isinstance(value, Undefined),
    "none": lambda value: value is None,
    "true": lambda value: value is True,
    "false": lambda value: value is False,
    "boolean": lambda value: isinstance(value, bool),
    "number": lambda value: isinstance(value, int | float),  # Jinja's Number: bools too
    "integer": lambda value: isinstance(value, int) and not isinstance(value, bool),
    "float": lambda value: isinstance(value, float),
    "string": lambda value: isinstance(value, str),
    "mapping": lambda value: isinstance(value, Mapping),
    "sequence": _is_sequence,
    "iterable": _is_sequence,
}
"""`x is NAME` (Jinja's tests of the same names); none takes arguments. Only `defined` and
`undefined` see an undefined value: any other test of one is an error."""
UNDEFINED_TESTS = frozenset({"defined", "undefined"})


def _mapping(value: Any, method: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{method}() needs a dict, got {type_name(value)}")
    return value


METHODS: dict[str, Callable[[Any], list[Any]]] = {
    "items": lambda value: [[k, v] for k, v in _mapping(value, "items").items()],
    "keys": lambda value: list(_mapping(value, "keys")),
    "values": lambda value: list(_mapping(value, "values").values()),
}
"""The only methods a template calls: a dict's items() ([key, value] pairs), keys() and
values(), as lists, with no arguments."""
