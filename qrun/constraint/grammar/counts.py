"""`minProperties`/`maxProperties` beside optional properties, which llguidance 1.7 takes only
when every listed property is required: the count becomes a choice of which listed properties
are present, an `anyOf` of `required` sets ("at least m of them": every m-subset of the
optional ones, past those required) or of `properties: {k: false}` sets ("at most M": every
set of n - M optional ones absent).

Exact on a closed object (`additionalProperties: false`, no `patternProperties`): its keys are
the listed ones. On an open one, `minProperties` counts unlisted keys too, which no form here
can; the choice of listed ones is a subset of it (fewer values: `{"x": 1}` against
`minProperties: 1` and listed `a`, `b` is left out), and `maxProperties` stays as written.
More than _MAX_CHOICES sets stay as written too (llguidance refuses them with its reason).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

__all__ = ["count_properties"]

# `anyOf` members one count may become.
_MAX_CHOICES = 64


def count_properties(sub: dict[str, Any]) -> list[Any] | None:
    """The schemas that together (`allOf`) replace `sub`'s `minProperties`/`maxProperties`,
    or None to leave them."""
    low, high = sub.get("minProperties"), sub.get("maxProperties")
    props = sub.get("properties")
    if (low is None and high is None) or not isinstance(props, dict):
        return None
    if any(v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0)
           for v in (low, high)):
        return None
    closed = sub.get("additionalProperties") is False and "patternProperties" not in sub
    names = list(props)
    required = sub.get("required", [])
    if not isinstance(required, list):
        return None
    optional = [n for n in names if n not in required and props[n] is not False]
    present = len([n for n in dict.fromkeys(required) if isinstance(n, str)])
    if not closed and (high is not None or any(n not in props for n in required)):
        return None
    members: list[Any] = []
    if low is not None and low > present:
        need = low - present
        if need > len(optional) or math.comb(len(optional), need) > _MAX_CHOICES:
            return None
        members.append({"anyOf": [{"required": list(c)}
                                  for c in itertools.combinations(optional, need)]})
    if high is not None and high < present + len(optional):
        absent = present + len(optional) - high
        if absent > len(optional) or math.comb(len(optional), absent) > _MAX_CHOICES:
            return None
        members.append({"anyOf": [{"properties": {n: False for n in c}}
                                  for c in itertools.combinations(optional, absent)]})
    return members
