"""Which MaskBench schemas qrun refuses, by reason, and whether the ones it compiles take
exactly the suite's valid instances (issue #24 item 3's figures).

Each schema goes through `check_schema(schema, JsonFormat(formats=...))` (the rewrite, then
llguidance; --formats, default "known" as bench/maskbench.py reads them);
the refused are counted by reason (the keyword llguidance names, "oneOf", or the reason's
first words) and how many carry no JSON pointer. With --matcher, every test instance of
each compiled schema goes through `qrun.Matcher("smollm2", json=schema)` (flexible layout,
`json.dumps` text) and is compared with the suite's label. --out writes one JSON object per
schema (name, reason, pointer, and with --matcher the wrongly accepted and rejected instance
numbers), so two trees can be compared schema by schema.

Run: .venv/bin/python -m bench.refusals [DIR] [--formats known|assert|annotation] [--matcher]
     [--out FILE]
(DIR: the suite's data/*.json, from guidance-ai/jsonschemabench; default /work/maskbench/data)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from qrun.constraint.grammar import JsonFormat, check_schema


def category(reason: str) -> str:
    """A reason without its particulars: the keywords llguidance names, or its first words."""
    keys = re.match(r"Unimplemented keys: \[(.*)\]", reason)
    if keys:
        return f"keys {keys.group(1)}"
    if reason.startswith("oneOf"):
        return "oneOf"
    if "regex" in reason.lower() or "look-around" in reason or "lookaround" in reason:
        return "regex"
    return re.split(r"[:(']", reason, maxsplit=1)[0].strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.refusals")
    parser.add_argument("data", nargs="?", default="/work/maskbench/data")
    parser.add_argument("--matcher", action="store_true",
                        help="feed each compiled schema's instances through qrun.Matcher")
    parser.add_argument("--out", help="write one JSON line per schema to this file")
    parser.add_argument("--formats", default="known", choices=("known", "assert", "annotation"),
                        help="how schemas' formats are read (JsonFormat.formats)")
    args = parser.parse_args(argv)
    files = sorted(Path(args.data).glob("*.json"))
    if not files:
        print(f"no *.json in {args.data}", file=sys.stderr)
        return 2
    reasons: Counter[str] = Counter()
    unlocated = 0
    accepted = rejected = instances = 0
    out = open(args.out, "w") if args.out else None  # noqa: SIM115 -- closed below
    for path in files:
        suite = json.loads(path.read_text())
        error = check_schema(suite["schema"], JsonFormat(formats=args.formats))
        row: dict[str, Any] = {"name": path.name, "reason": None, "pointer": None}
        if error is not None:
            reasons[category(error.reason)] += 1
            unlocated += error.pointer is None
            row.update(reason=error.reason, pointer=error.pointer)
        elif args.matcher:
            row.update(_instances(suite, args.formats))
            accepted += len(row["wrongly_accepted"])
            rejected += len(row["wrongly_rejected"])
            instances += len(suite["tests"])
        if out is not None:
            out.write(json.dumps(row) + "\n")
    if out is not None:
        out.close()
    print(f"schemas {len(files)}, refused {sum(reasons.values())} "
          f"({unlocated} without a pointer)")
    for reason, count in reasons.most_common():
        print(f"  {count:5d}  {reason}")
    if args.matcher:
        print(f"instances of compiled schemas {instances}: wrongly accepted {accepted}, "
              f"wrongly rejected {rejected}")
    return 0


def _instances(suite: dict[str, Any], formats: str) -> dict[str, list[int]]:
    import qrun

    matcher = qrun.Matcher("smollm2", json=suite["schema"], formats=formats)
    found: dict[str, list[int]] = {"wrongly_accepted": [], "wrongly_rejected": []}
    for number, test in enumerate(suite["tests"]):
        matcher.reset()
        taken = matcher.consume_text(json.dumps(test["data"])) and matcher.accepting()
        if taken != test["valid"]:
            found["wrongly_accepted" if taken else "wrongly_rejected"].append(number)
    return found


if __name__ == "__main__":
    sys.exit(main())
