"""`contains` as an `anyOf` over where the first match stands. llguidance 1.7 refuses
`contains`; "some item of the array matches S" has no form it takes, but "item i matches S"
does (a tuple position), so

    {items: I, contains: S}  ⊇  anyOf[i < k]{prefix I × i, then I ∧ S; minItems i + 1; items I}

keeps exactly the valid arrays whose first match stands in the first k positions: fewer
values (an array whose only matches come later is refused), never more (each branch puts a
match at position i and I on every item). Values that are not arrays pass every branch, as
they pass `contains`. The positions are `prefixItems` (2020-12) or the `items` list with
`additionalItems` (drafts 4 to 2019-09), as the document's draft reads them; a subschema
that already has a tuple form, `maxContains`, or a `minContains` other than 0 or 1 stays as
written (and is refused).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["contains_positions"]

# Positions the first match may take, and fewer where the item schemas are big (position i
# copies I i times: k(k+1)/2 copies in all).
_POSITIONS = 8
_FEW_POSITIONS = 3
_BIG = 2_000


def contains_positions(sub: dict[str, Any], draft: int) -> dict[str, Any] | None:
    """The `anyOf` that stands for `sub`'s `contains` (module docstring), with `contains`,
    `minContains` and `items` taken out of `sub`; None (and `sub` unchanged) where there is
    none. With `minContains: 0`, or before draft-06, the `contains` says nothing and is
    dropped (an empty schema comes back: nothing to add)."""
    if "contains" not in sub or "maxContains" in sub:
        return None
    if any(key in sub for key in ("prefixItems", "additionalItems", "unevaluatedItems")):
        return None
    matching, items = sub["contains"], sub.get("items", True)
    least = sub.get("minContains", 1) if draft >= 2019 else 1
    if isinstance(least, bool) or least not in (0, 1):
        return None
    if not isinstance(items, dict | bool) or not isinstance(matching, dict | bool):
        return None
    if least == 0 or draft < 6:  # `contains` is a keyword from draft-06 on
        sub.pop("contains")
        sub.pop("minContains", None)
        return {}
    size = len(json.dumps(items)) + len(json.dumps(matching))
    count = _POSITIONS if size <= _BIG else _FEW_POSITIONS
    both = matching if items is True else {"allOf": [items, matching]}
    branches = []
    for i in range(count):
        tuple_ = [items] * i + [both]
        if draft >= 2020:
            branches.append({"prefixItems": tuple_, "items": items, "minItems": i + 1})
        else:
            branches.append({"items": tuple_, "additionalItems": items, "minItems": i + 1})
    for key in ("contains", "minContains", "items"):
        sub.pop(key, None)
    return {"anyOf": branches}
