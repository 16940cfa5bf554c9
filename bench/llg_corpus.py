"""json= engines over the schema corpus (corpus/schema_corpus.py): `qrun.Matcher`
on llguidance against the `jsonschema` validator (corpus/llg_check.py), and the
old engine (schema -> regex -> DFA: the frozen baseline bench/old_json_schema.py, compared in
bench/llg_check.py) in the same run, both with the default model's vocabulary.

Prints, per engine: schemas compiled (and schemas/s), compile time and time to first mask
p50/p99/max, mask time per token p50/p99 (the old engine's over the same token sequences, up
to where it refuses them), valid instances rejected and invalid ones accepted. With --write,
the summary goes into bench/results.json and its section of bench/RESULTS.md.

Run: .venv/bin/python -m bench.llg_corpus [--limit N] [--match TEXT] [--valid 4] [--invalid 4]
     [--walks 2] [--timeout 20] [--layout flexible|fixed] [--no-old] [--out reports.jsonl]
     [--write]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.llg_check import CorpusReport, OldEngineChecker
from corpus.schema_corpus import load_corpus

__all__ = ["main", "summarize"]

HERE = Path(__file__).parent


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)) * 1000, 4) if values else float("nan")


def _timings(compile_s: list[float], first: list[float], masks: list[float]) \
        -> dict[str, Any]:
    return {
        "compile_ms": {"p50": _pct(compile_s, 50), "p99": _pct(compile_s, 99),
                       "max": round(max(compile_s, default=0) * 1000, 1)},
        "first_mask_ms": {"p50": _pct(first, 50), "p99": _pct(first, 99),
                          "max": round(max(first, default=0) * 1000, 1)},
        "mask_ms": {"p50": _pct(masks, 50), "p99": _pct(masks, 99), "n": len(masks),
                    "mean": round(statistics.fmean(masks) * 1000, 4) if masks else None},
        # Schemas compiled per second of compile time (one at a time, to the first mask).
        "schemas_per_s": round(len(first) / sum(first), 1) if first else 0.0,
    }


def summarize(reports: list[CorpusReport]) -> dict[str, Any]:
    """Counts and timing percentiles over all reports. A generation is "unfinished" when the
    budgeted mask could not close the value in time (a budget miss, not a wrong value)."""
    ok = [r for r in reports if r.status == "ok"]
    errors = Counter(_category(r.reason) for r in reports if r.status == "compile_error")
    llg = {
        "compiled": len(ok),
        "compile_errors": dict(errors.most_common(12)),
        "with_instances": sum(1 for r in ok if r.valid),
        "instance_timeouts": sum(r.no_instances == "timeout" for r in ok),
        "valid": sum(r.valid for r in ok),
        "untokenizable": sum(r.untokenizable for r in ok),
        "valid_rejected": sum(len(r.valid_rejected) for r in ok),
        "reordered": sum(r.reordered for r in ok),
        "invalid": sum(r.invalid for r in ok),
        "invalid_accepted": sum(len(r.invalid_accepted) for r in ok),
        "walks": sum(r.walks for r in ok),
        "walks_invalid": sum(w.startswith("invalid") for r in ok for w in r.walks_bad),
        "walks_unfinished": sum(not w.startswith("invalid") for r in ok for w in r.walks_bad),
        **_timings([r.compile_s for r in ok], [r.first_mask_s for r in ok],
                   [s for r in ok for s in r.mask_s]),
    }
    out: dict[str, Any] = {"schemas": len(reports), "llguidance": llg}
    if any(r.old for r in reports):
        old = [r for r in reports if r.old == "ok"]
        both = [r for r in old if r.status == "ok"]
        out["old"] = {
            "compiled": len(old),
            "timeouts": sum(r.old == "timeout" for r in reports),
            "compiled_by_both": len(both),
            "valid_rejected": sum(r.old_valid_rejected for r in both),
            "invalid_accepted": sum(r.old_invalid_accepted for r in both),
            **_timings([r.old_compile_s for r in old], [r.old_first_mask_s for r in old],
                       [s for r in both for s in r.old_mask_s]),
        }
    return out


def _category(reason: str) -> str:
    reason = reason.removeprefix("JSON Schema: ")
    if reason.startswith("Resource ") or "Invalid URI reference" in reason:
        return "external or invalid $ref"
    if reason.startswith(("Unknown format", "unknown format")):
        return "unknown format"
    return reason.split(" (at ", 1)[0].split("\n", 1)[0][:80]


def _load(path: str) -> list[CorpusReport]:
    """Reports already written to `path` (JSON lines), so an interrupted run resumes."""
    try:
        with open(path) as fp:
            return [CorpusReport(**json.loads(line)) for line in fp if line.strip()]
    except FileNotFoundError:
        return []


def _write(summary: dict[str, Any], command: str, layout: str) -> None:
    from datetime import UTC, datetime

    from bench.report import write_results

    path = HERE / "results.json"
    merged = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    merged["json_corpus"] = {"summary": summary, "command": command, "layout": layout,
                             "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}
    path.write_text(json.dumps(merged, indent=1) + "\n", encoding="utf-8")
    write_results(merged, HERE / "RESULTS.md")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.llg_corpus", description=__doc__)
    p.add_argument("--limit", type=int, default=0, help="first N schemas only")
    p.add_argument("--match", default="", help="only schemas whose name contains this")
    p.add_argument("--valid", type=int, default=4)
    p.add_argument("--invalid", type=int, default=4)
    p.add_argument("--walks", type=int, default=2)
    p.add_argument("--timeout", type=float, default=20.0,
                   help="seconds per schema for instances and walks (default 20)")
    p.add_argument("--layout", choices=("flexible", "fixed"), default="flexible")
    p.add_argument("--no-old", action="store_true", help="skip the old engine")
    p.add_argument("--out", default="",
                   help="append every report here as a JSON line (and resume from it)")
    p.add_argument("--write", action="store_true",
                   help="store the summary in bench/results.json and bench/RESULTS.md")
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    from qrun.backends import ensure_converted, locate_model

    hf = AutoTokenizer.from_pretrained(ensure_converted(locate_model("smollm2")))
    checker = OldEngineChecker("smollm2", lambda text: hf.encode(text, add_special_tokens=False),
                      args.layout, args.valid, args.invalid, args.walks,
                      old_engine=not args.no_old)
    corpus = [(n, s) for n, s in load_corpus() if args.match in n]
    corpus = corpus[: args.limit] if args.limit else corpus
    reports = _load(args.out)
    done = {r.name for r in reports}
    for i, (name, schema) in enumerate(corpus):
        if name in done:
            continue
        report = checker.check(name, schema, args.timeout)
        reports.append(report)
        if args.out:
            with open(args.out, "a") as fp:
                fp.write(json.dumps(asdict(report)) + "\n")
        bad = len(report.valid_rejected) + len(report.invalid_accepted) + len(report.walks_bad)
        print(f"[{i + 1}/{len(corpus)}] {name}: {report.status} {report.reason[:60]} "
              f"old={report.old}{f' BAD={bad}' if bad else ''}", file=sys.stderr)
    summary = summarize(reports)
    print(json.dumps(summary, indent=2))
    if args.write:
        _write(summary, "python -m bench.llg_corpus " + " ".join(argv or sys.argv[1:]),
               args.layout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
