"""What keeps each corpus schema from compiling with llguidance, all of it: the keyword (or
unknown format, oneOf...) llguidance names is removed everywhere in the schema and the schema
recompiled, until it compiles or the reason is not a removable keyword. Prints how many
schemas each set of blockers holds back, i.e. what supporting a keyword (by a rewrite before
llguidance) would gain. The removals are for counting only: they change what a schema means.

Run: .venv/bin/python -m bench.llg_blockers
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from typing import Any

from corpus.schema_corpus import load_corpus
from qrun.constraint.grammar import JsonFormat, check_schema
from qrun.constraint.grammar.schema import schema_positions

_MAX_ROUNDS = 8


def blockers(schema: Any, fmt: JsonFormat) -> tuple[list[str], str | None]:
    """The removable blockers found in order, and the final reason (None: compiles then)."""
    found: list[str] = []
    for _ in range(_MAX_ROUNDS):
        error = check_schema(schema, fmt)
        if error is None:
            return found, None
        removal = _removal(error.reason)
        if removal is None:
            return found, _category(error.reason)
        label, drop = removal
        found.append(label)
        schema = json.loads(json.dumps(schema))
        for _, sub in list(schema_positions(schema)):
            drop(sub)
    return found, "too many rounds"


def _removal(reason: str) -> tuple[str, Any] | None:
    keys = re.match(r"Unimplemented keys: \[(.*)\]", reason)
    if keys:
        names = json.loads(f"[{keys.group(1)}]")

        def drop_keys(sub: dict[str, Any]) -> None:
            for name in names:
                sub.pop(name, None)
        return "+".join(names), drop_keys
    fmt = re.match(r"Unknown format: (.*)", reason)
    if fmt:
        def drop_format(sub: dict[str, Any]) -> None:
            if sub.get("format") == fmt.group(1):
                del sub["format"]
        return "unknown format", drop_format
    if reason.startswith("oneOf"):
        def to_any_of(sub: dict[str, Any]) -> None:
            if "oneOf" in sub:
                sub["anyOf"] = sub.pop("oneOf")
        return "oneOf", to_any_of
    return None


def _category(reason: str) -> str:
    if reason.startswith("Resource ") or "Invalid URI reference" in reason:
        return "external or invalid $ref"
    return re.sub(r"/[^/]+/", "/../", reason.split("\n", 1)[0])[:70]


def main() -> int:
    fmt = JsonFormat()
    total = compiled = 0
    gains: Counter[str] = Counter()
    single: Counter[str] = Counter()
    final: Counter[str] = Counter()
    for name, schema in load_corpus():
        total += 1
        found, reason = blockers(schema, fmt)
        if not found and reason is None:
            compiled += 1
            continue
        if reason is None:
            gains[" + ".join(sorted(set(found)))] += 1
            for label in set(found):
                single[label] += 1
        else:
            final[reason] += 1
        print(f"{name}: {found} -> {reason or 'compiles'}", file=sys.stderr)
    print(f"{total} schemas, {compiled} compile as they are")
    print("compile once these are handled (set: schemas):")
    for label, n in gains.most_common():
        print(f"  {n:4d}  {label}")
    print("schemas each blocker holds back (alone or with others):")
    for label, n in single.most_common():
        print(f"  {n:4d}  {label}")
    print("other reasons (not removable):")
    for label, n in final.most_common():
        print(f"  {n:4d}  {label}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
