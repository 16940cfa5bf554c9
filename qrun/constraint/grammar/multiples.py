"""Negative multiples of `multipleOf`. llguidance 1.7 writes a `multipleOf` number without a
minus sign: `{"type": "integer", "multipleOf": 16, "minimum": -2032}` takes 64 but not -64
(fewer values than the schema's, so sound, but valid values lost). Where the schema bounds
the negative side to a few multiples, the rewrite

    {multipleOf m, minimum L < 0, ...}  ->  anyOf[{multipleOf m, minimum 0, ...},
                                                 {enum: the multiples in [L, 0) valid here}]

gives them back: the first branch is what llguidance took anyway (the non-negative
multiples, and every value that is not a number), the enum lists the negative ones, each
checked against the whole subschema with the `jsonschema` validator (a float multiple the
validator does not count as one is left out: fewer values, never more).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any, TypeGuard

__all__ = ["negative_multiples"]

# Negative multiples enumerated at most (an enum of this many numbers compiles in well under
# a millisecond).
_MAX_MULTIPLES = 256
# The keywords the first branch takes from the subschema (the bounds and the step).
_NUMERIC = ("multipleOf", "minimum", "maximum", "exclusiveMaximum")


def negative_multiples(sub: dict[str, Any], validator: Any) -> dict[str, Any] | None:
    """The `anyOf` above for `sub` with its numeric keywords taken out of it, or None (and
    `sub` unchanged). `validator(schema)` gives a `jsonschema` validator of the document's
    draft for `schema`."""
    step, low = sub.get("multipleOf"), sub.get("minimum")
    if not (_number(step) and _number(low)) or step <= 0 or low >= 0:
        return None
    if "exclusiveMinimum" in sub:  # a draft-04 flag or a second bound: left as written
        return None
    high = sub.get("maximum", sub.get("exclusiveMaximum", 0))
    if not _number(high) or high < 0:  # no non-negative multiple: the first branch is empty
        return None
    try:
        exact = Decimal(str(step))
        count = int(Decimal(str(-low)) / exact)
    except (InvalidOperation, ValueError, OverflowError):
        return None
    if not 0 < count <= _MAX_MULTIPLES:
        return None
    check = validator(sub)
    values = []
    for k in range(1, count + 1):
        value = -k * exact
        number: int | float = int(value) if value == value.to_integral_value() else float(value)
        if check.is_valid(number):
            values.append(number)
    if not values:
        return None
    kept = {key: sub.pop(key) for key in _NUMERIC if key in sub}
    kept["minimum"] = 0
    return {"anyOf": [kept, {"enum": values}]}


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
