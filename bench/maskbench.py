"""MaskBench through `qrun.Matcher`: the public JSON Schema suite of guidance-ai/jsonschemabench
(maskbench/data: 11,305 real schemas, each with valid and invalid instances), checked token by
token with SmolLM2's tokenizer, as the published harnesses do (jsonschemabench
maskbench/maskbench/runner.py, llguidance json_stats/src/json_stats.rs):

- per schema, `Matcher("smollm2", json=schema, formats="known")` (layout "flexible": any
  JSON whitespace, the harnesses' `whitespace_flexible`; `formats="known"`: the standard
  formats asserted and unknown ones such as "int32" ignored, as the suite's validator,
  jsonschema's FormatChecker, does; `--formats assert`, a json= hole's default, refuses a
  schema with an unknown format) is built and its first mask computed; that time is the
  time to first mask (json_stats' `ttfm_us`: compile + first mask). A schema qrun refuses
  (ConstraintError) is "refused", any other exception an "error".
- each test instance is serialized as runner.py does, `json.dumps(data, indent=None,
  ensure_ascii=False)` (`--compact`: without blanks, as json_stats' `serde_json::to_string`),
  tokenized with the tokenizer (no special tokens), and fed token by token: at each step the
  mask is computed (`allowed()`, timed) and the token must be in it, then consumed. After the
  last token the mask must allow EOS (json_stats' `is_accepting` check; runner.py checks no
  end). A valid instance must pass every step; an invalid one must be refused at some token
  or not be complete at the end.
- key order: JSON objects are unordered and llguidance generates properties in the schema's
  order (the "Property order" section of llguidance's JSON Schema documentation), with no
  option to take any order. Each instance is fed with its keys in the schema's order
  (corpus/json_instances.py schema_key_order, a heuristic of llguidance's
  rules; a valid instance it places wrongly is searched for an order the grammar takes,
  corpus/llg_check.py search_order, untimed) and, where that text
  differs, also in the instance's own order (the harnesses' way); both counts are reported,
  the schema order's are the headline.
- a schema passes when it compiles and every test comes out right (schema order), as in the
  published tables (schemas without tests pass when they compile). A test whose text the
  tokenizer cannot spell byte for byte (SmolLM2 has no token for a few bytes) is skipped and
  counted.

Schemas run in `--workers` processes (default 2), each with a per-schema time limit
(`--timeout`, default 60 s; the worker is killed and replaced). Times are wall-clock on
whatever machine runs it: per-token mask times (the step's `allowed()`, a fresh bool array
over the vocabulary), and first-mask times only for schemas the worker had not compiled before
(a repeated schema text hits qrun's cache and would flatter the figures).

Run: python -m bench.maskbench [--data DIR] [--limit N [--spread]] [--match TEXT] [--workers 2]
     [--timeout 60] [--compact] [--formats known|assert|annotation] [--out FILE.jsonl]
     [--json] [--write]
The data: `git clone https://github.com/guidance-ai/jsonschemabench` and pass
`--data jsonschemabench/maskbench/data` (or set QRUN_MASKBENCH); default /work/maskbench/data.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.engine_sections import TARGETS, targets

__all__ = ["SchemaResult", "check_schema_file", "main", "summarize"]

HERE = Path(__file__).parent
DEFAULT_DATA = "/work/maskbench/data"
MODEL = "smollm2"
# Per-schema lists of failures keep at most this many examples.
_EXAMPLES = 3
# Seconds the key-order search may take per instance (Github_ultra---o46322's 5,000-token
# instance exhausts its 3,000 tries in over a minute); past it the instance stays rejected.
_SEARCH_S = 5.0


@dataclass
class SchemaResult:
    """What one schema file gave. `status`: "ok" (compiled), "refused" (ConstraintError),
    "error" (any other exception while compiling), "timeout"."""

    name: str
    status: str = "ok"
    reason: str = ""
    cold: bool = True
    compile_ms: float = 0.0
    first_mask_ms: float = 0.0
    first_mask_cpu_ms: float = 0.0
    valid: int = 0
    invalid: int = 0
    untokenizable: int = 0
    reordered: int = 0
    valid_rejected: int = 0
    invalid_accepted: int = 0
    examples: list[str] = field(default_factory=list)
    own_valid_rejected: int = 0
    own_invalid_accepted: int = 0
    searched: int = 0
    test_errors: list[str] = field(default_factory=list)
    tokens: int = 0
    mask_us: list[float] = field(default_factory=list)

    @property
    def passing(self) -> bool:
        return (self.status == "ok" and not self.valid_rejected and not self.invalid_accepted
                and not self.test_errors)


class _Disagreement(Exception):
    """allowed() and consume()/accepting() disagree: a bug in the Matcher, not a verdict."""


class Runner:
    """One process's Matcher factory and tokenizer (loaded once)."""

    def __init__(self, compact: bool = False, formats: str = "known") -> None:
        from transformers import AutoTokenizer

        from corpus.json_instances import schema_key_order
        from corpus.llg_check import limited, search_order
        from qrun.backends import ensure_converted, locate_model
        from qrun.constraint.grammar import FLEXIBLE
        from qrun.constraint.grammar_index import LlgCache
        from qrun.matcher import Matcher

        self.matcher_class = Matcher
        self.key_order = schema_key_order
        self.search_order, self.limited = search_order, limited
        self.formats = formats
        self.layout = replace(FLEXIBLE, formats=formats)  # the Matcher's, "flexible"
        self._indexes = LlgCache(4)
        hf = AutoTokenizer.from_pretrained(ensure_converted(locate_model(MODEL)))
        self.encode: Callable[[str], list[int]] = (
            lambda text: hf.encode(text, add_special_tokens=False))
        self.separators = (",", ":") if compact else (", ", ": ")
        # Once per process, like the tokenizer: the jsonschema validator that the finite-list
        # rewrite uses (grammar/finite.py) imports its format checkers (with the dev extra's
        # rfc3987-syntax, ~0.9 s) on the first schema that needs it.
        import jsonschema  # noqa: F401

        warm = Matcher(MODEL, json={"type": "object"})  # the tokenizer, llguidance's too
        warm.allowed()
        self.vocab = warm.vocab
        self.eos = sorted(warm.eos_token_ids)
        self.seen: set[str] = set()

    def dumps(self, value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=self.separators)

    def check(self, name: str, data: dict[str, Any]) -> SchemaResult:
        from qrun.errors import ConstraintError

        result = SchemaResult(name)
        schema = data["schema"]
        key = json.dumps(schema, ensure_ascii=False)
        result.cold = key not in self.seen
        self.seen.add(key)
        # CPU time of the worker process: the caller's thread and the thread llguidance
        # builds in (qrun/constraint/grammar/build_thread.py); nothing else runs meanwhile.
        started, started_cpu = time.perf_counter(), time.process_time()
        try:
            matcher = self.matcher_class(MODEL, json=schema, formats=self.formats)
            compiled = time.perf_counter()
            matcher.allowed()
        except ConstraintError as exc:
            result.status, result.reason = "refused", exc.message
            return result
        except Exception as exc:  # a crash of the compile path: reported, never hidden
            result.status, result.reason = "error", f"{type(exc).__name__}: {exc}"[:300]
            return result
        result.compile_ms = (compiled - started) * 1000
        result.first_mask_ms = (time.perf_counter() - started) * 1000
        result.first_mask_cpu_ms = (time.process_time() - started_cpu) * 1000
        for number, test in enumerate(data.get("tests", [])):
            valid = bool(test["valid"])
            own = self.dumps(test["data"])
            try:
                ordered = self.dumps(self.key_order(test["data"], schema))
            except Exception:  # a schema the heuristic cannot follow: the instance's order
                ordered = own
            tokens = self._tokens(ordered)
            if tokens is None:
                result.untokenizable += 1
                continue
            result.valid += valid
            result.invalid += not valid
            try:
                accepted = self._walk(matcher, tokens, result.mask_us)
                own_accepted = accepted  # the same text, unless reordered (below)
                if valid and not accepted:
                    # schema_key_order is a heuristic of llguidance's order: a valid instance
                    # it cannot place is searched for an order the grammar takes.
                    searched = self._searched(schema, test["data"])
                    if searched is not None:
                        searched_tokens = self._tokens(searched)
                        if searched_tokens is not None and self._walk(matcher, searched_tokens,
                                                                      None):
                            accepted = True
                            result.searched += 1
                if accepted != valid:
                    if valid:
                        result.valid_rejected += 1
                    else:
                        result.invalid_accepted += 1
                    if len(result.examples) < _EXAMPLES:
                        verdict = "valid, rejected" if valid else "invalid, accepted"
                        result.examples.append(f"test #{number} ({verdict}): {ordered[:300]}")
                if ordered != own:
                    result.reordered += 1
                    own_tokens = self._tokens(own)
                    if own_tokens is not None:
                        own_accepted = self._walk(matcher, own_tokens, None)
                if own_accepted != valid:
                    if valid:
                        result.own_valid_rejected += 1
                    else:
                        result.own_invalid_accepted += 1
            except Exception as exc:
                result.test_errors.append(f"test #{number}: {type(exc).__name__}: {exc}"[:300])
        result.tokens = len(result.mask_us)
        return result

    def _searched(self, schema: Any, value: Any) -> str | None:
        """`value` as text in a key order the schema's grammar accepts (a bounded search,
        corpus/llg_check.py search_order), or None."""
        try:
            index = self._indexes.schema(schema, self.vocab, self.layout)
            found = self.limited(_SEARCH_S, lambda: self.search_order(index, value))
        except Exception:  # Timeout, GrammarError, RecursionError: no order to offer
            return None
        return None if found is None else self.dumps(found[0])

    def _tokens(self, text: str) -> list[int] | None:
        tokens = self.encode(text)
        spelled = b"".join(self.vocab.token_bytes[t] or b"" for t in tokens)
        return tokens if spelled == text.encode() else None

    def _walk(self, matcher: Any, tokens: list[int], times: list[float] | None) -> bool:
        """Whether `tokens` pass mask by mask and end complete; `times` gets each mask's
        µs (the final one, which must allow EOS, included)."""
        matcher.reset()
        clock = time.perf_counter
        for position, token in enumerate(tokens):
            started = clock()
            mask = matcher.allowed()
            if times is not None:
                times.append((clock() - started) * 1e6)
            if not mask[token]:
                return False
            if not matcher.consume(token):
                raise _Disagreement(f"token {token} at {position} allowed but not consumed")
        started = clock()
        mask = matcher.allowed()
        if times is not None:
            times.append((clock() - started) * 1e6)
        complete = bool(mask[self.eos].any())
        if complete != matcher.accepting():
            raise _Disagreement(f"EOS allowed {complete}, accepting() {not complete}")
        return complete


def check_schema_file(runner: Runner, path: Path) -> SchemaResult:
    """One suite file through `runner` (a schema file that is not JSON is an "error")."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return SchemaResult(path.name, status="error", reason=f"unreadable: {exc}"[:300])
    return runner.check(path.name, data)


def _worker(conn: Connection, compact: bool, formats: str) -> None:
    runner = Runner(compact, formats)
    conn.send("ready")
    while True:
        path = conn.recv()
        if path is None:
            return
        conn.send(asdict(check_schema_file(runner, Path(path))))


class _Pool:
    """Worker processes fed one file at a time; a worker past the time limit is killed (its
    own process, by its handle) and replaced, and its schema recorded as a timeout."""

    def __init__(self, workers: int, compact: bool, timeout_s: float,
                 formats: str = "known") -> None:
        self.context = multiprocessing.get_context("spawn")
        self.compact, self.timeout_s, self.formats = compact, timeout_s, formats
        self.slots = [self._start() for _ in range(max(1, workers))]

    def _start(self) -> tuple[Any, Connection]:
        parent, child = self.context.Pipe()
        process = self.context.Process(target=_worker, args=(child, self.compact, self.formats),
                                       daemon=True)
        process.start()
        child.close()
        if parent.recv() != "ready":
            raise RuntimeError("a maskbench worker failed to start")
        return process, parent

    def run(self, paths: list[Path]) -> Iterator[SchemaResult]:
        from multiprocessing.connection import wait

        queue = list(reversed(paths))
        busy: dict[int, tuple[Path, float]] = {}
        for slot in range(len(self.slots)):
            if queue:
                busy[slot] = self._send(slot, queue.pop())
        while busy:
            conns = {self.slots[slot][1]: slot for slot in busy}
            deadline = min(started for _, started in busy.values()) + self.timeout_s
            ready = wait(list(conns), timeout=max(0.0, deadline - time.monotonic()))
            for conn in ready:
                slot = conns[conn]  # type: ignore[index]
                path, _ = busy.pop(slot)
                try:
                    reply = conn.recv()  # type: ignore[union-attr]
                except EOFError:  # the worker died (a crash in native code)
                    yield SchemaResult(path.name, status="error", reason="worker process died")
                    self._replace(slot)
                else:
                    yield SchemaResult(**reply)
                if queue:
                    busy[slot] = self._send(slot, queue.pop())
            now = time.monotonic()
            for slot, (path, started) in list(busy.items()):
                if now - started >= self.timeout_s:
                    del busy[slot]
                    yield SchemaResult(path.name, status="timeout",
                                       reason=f"over {self.timeout_s:g} s")
                    self._replace(slot)
                    if queue:
                        busy[slot] = self._send(slot, queue.pop())

    def _send(self, slot: int, path: Path) -> tuple[Path, float]:
        self.slots[slot][1].send(str(path))
        return path, time.monotonic()

    def _replace(self, slot: int) -> None:
        process, conn = self.slots[slot]
        process.kill()
        process.join()
        conn.close()
        self.slots[slot] = self._start()

    def close(self) -> None:
        for process, conn in self.slots:
            try:
                conn.send(None)
            except OSError:
                pass
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


def _pct(values: npt.NDArray[np.float64], q: float, digits: int = 1) -> float | None:
    return round(float(np.percentile(values, q)), digits) if len(values) else None


def _category(reason: str) -> str:
    reason = reason.removeprefix("JSON Schema: ")
    if reason.startswith("Resource ") or "Invalid URI reference" in reason:
        return "external or invalid $ref"
    if reason.startswith("Unknown format"):
        return "unknown format"
    return reason.split(" (at ", 1)[0].split("\n", 1)[0][:80]


def summarize(results: list[SchemaResult]) -> dict[str, Any]:
    """The suite's figures from per-schema results."""
    ok = [r for r in results if r.status == "ok"]
    cold = [r for r in ok if r.cold]
    masks = np.array([t for r in ok for t in r.mask_us], dtype=np.float64)
    first = np.array([r.first_mask_ms for r in cold], dtype=np.float64)
    first_cpu = np.array([r.first_mask_cpu_ms for r in cold], dtype=np.float64)
    compile_ms = np.array([r.compile_ms for r in cold], dtype=np.float64)
    refused = Counter(_category(r.reason) for r in results if r.status == "refused")
    errors = Counter(r.reason[:120] for r in results if r.status == "error")
    return {
        "schemas": len(results),
        "passing": sum(r.passing for r in results),
        "compiled": len(ok),
        "refused": sum(r.status == "refused" for r in results),
        "errors": len([r for r in results if r.status == "error"]),
        "timeouts": sum(r.status == "timeout" for r in results),
        "tests_valid": sum(r.valid for r in ok),
        "tests_invalid": sum(r.invalid for r in ok),
        "untokenizable": sum(r.untokenizable for r in ok),
        "reordered": sum(r.reordered for r in ok),
        "valid_rejected": sum(r.valid_rejected for r in ok),
        "invalid_accepted": sum(r.invalid_accepted for r in ok),
        "schemas_valid_rejected": sum(bool(r.valid_rejected) for r in ok),
        "schemas_invalid_accepted": sum(bool(r.invalid_accepted) for r in ok),
        "own_order_valid_rejected": sum(r.own_valid_rejected for r in ok),
        "own_order_invalid_accepted": sum(r.own_invalid_accepted for r in ok),
        # Valid instances that passed only in a searched key order (schema_key_order, a
        # heuristic, placed their keys otherwise than llguidance does).
        "searched_order": sum(r.searched for r in ok),
        "test_errors": sum(len(r.test_errors) for r in ok),
        "tokens": int(len(masks)),
        "mask_us": {"p50": _pct(masks, 50), "p90": _pct(masks, 90), "p99": _pct(masks, 99),
                    "p999": _pct(masks, 99.9), "max": _pct(masks, 100),
                    "mean": round(float(masks.mean()), 1) if len(masks) else None},
        "first_mask_ms": {"n": len(first), "p50": _pct(first, 50, 3), "p90": _pct(first, 90, 3),
                          "p99": _pct(first, 99, 3), "max": _pct(first, 100, 3)},
        # The same in CPU time of the worker process (its caller and the thread llguidance
        # builds in): without the waits of a shared machine.
        "first_mask_cpu_ms": {"p50": _pct(first_cpu, 50, 3), "p90": _pct(first_cpu, 90, 3),
                              "p99": _pct(first_cpu, 99, 3), "max": _pct(first_cpu, 100, 3)},
        "compile_ms": {"p50": _pct(compile_ms, 50, 3), "p99": _pct(compile_ms, 99, 3)},
        "warm_schemas": len(ok) - len(cold),
        "refused_reasons": dict(refused.most_common(15)),
        "error_reasons": dict(errors.most_common(10)),
    }


def _files(data: Path, match: str, limit: int, spread: bool) -> list[Path]:
    paths = sorted(p for p in data.glob("*.json") if match in p.name)
    if not limit or limit >= len(paths):
        return paths
    if spread:  # every k-th file: a sample of every split
        return [paths[i * len(paths) // limit] for i in range(limit)]
    return paths[:limit]


def _text(summary: dict[str, Any]) -> str:
    s, verdict = summary, targets(summary)
    mask, first = s["mask_us"], s["first_mask_ms"]

    def mark(name: str) -> str:
        op, bound = TARGETS[name]
        return f"  (target {op} {bound:,}: {'PASS' if verdict[name] else 'MISS'})"

    return "\n".join([
        f"schemas {s['schemas']:,}: passing {s['passing']:,}{mark('passing')}",
        f"  compiled {s['compiled']:,}, refused {s['refused']:,}{mark('refused')}, "
        f"errors {s['errors']}, timeouts {s['timeouts']}",
        f"tests: {s['tests_valid']:,} valid, {s['tests_invalid']:,} invalid "
        f"({s['untokenizable']} untokenizable, skipped; {s['reordered']:,} reordered)",
        f"  valid rejected {s['valid_rejected']} on {s['schemas_valid_rejected']} schemas"
        f"{mark('valid_rejected')}",
        f"  invalid accepted {s['invalid_accepted']} on {s['schemas_invalid_accepted']} "
        f"schemas{mark('invalid_accepted')}",
        f"  in the instances' own key order: valid rejected "
        f"{s['own_order_valid_rejected']}, invalid accepted "
        f"{s['own_order_invalid_accepted']}; valid accepted only in a searched order "
        f"{s['searched_order']}; test errors {s['test_errors']}",
        f"mask us ({s['tokens']:,} masks): p50 {mask['p50']} p90 {mask['p90']} p99 "
        f"{mask['p99']}{mark('mask_us_p99')} p99.9 {mask['p999']} max {mask['max']}",
        f"first mask ms ({first['n']:,} schemas): p50 {first['p50']} p90 {first['p90']} p99 "
        f"{first['p99']}{mark('first_mask_ms_p99')} max {first['max']}",
        f"  in the worker's CPU time: p50 {s['first_mask_cpu_ms']['p50']} p90 "
        f"{s['first_mask_cpu_ms']['p90']} p99 {s['first_mask_cpu_ms']['p99']}",
        f"wall {s['wall_s']} s on {s['workers']} worker(s)",
        "refused: " + "; ".join(f"{k} {v}" for k, v in s["refused_reasons"].items()),
    ])


def _write(summary: dict[str, Any], command: str) -> None:
    from datetime import UTC, datetime
    from importlib.metadata import version

    from bench.report import write_results

    path = HERE / "results.json"
    merged = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    merged["maskbench"] = {"summary": summary, "command": command,
                           "llguidance": version("llguidance"),
                           "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}
    path.write_text(json.dumps(merged, indent=1) + "\n", encoding="utf-8")
    write_results(merged, HERE / "RESULTS.md")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.maskbench",
                                description=__doc__.split("\n\n", 1)[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", default=os.environ.get("QRUN_MASKBENCH", DEFAULT_DATA),
                   help="the suite's data folder (jsonschemabench/maskbench/data)")
    p.add_argument("--limit", type=int, default=0, help="the first N files (name order) only")
    p.add_argument("--spread", action="store_true",
                   help="--limit N takes N files evenly spaced in name order")
    p.add_argument("--match", default="", help="only files whose name contains this")
    p.add_argument("--workers", type=int, default=2, help="processes")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per schema")
    p.add_argument("--formats", default="known", choices=("known", "assert", "annotation"),
                   help="how schemas' formats are read (qrun.Matcher formats=)")
    p.add_argument("--compact", action="store_true",
                   help="serialize instances without blanks (json_stats' serde_json)")
    p.add_argument("--out", default="", help="write every schema's result here (JSON lines)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--write", action="store_true",
                   help="store the summary in bench/results.json and bench/RESULTS.md")
    args = p.parse_args(argv)
    data = Path(args.data)
    paths = _files(data, args.match, args.limit, args.spread)
    if not paths:
        print(f"no *.json schema files in {data} (get the suite: git clone "
              "https://github.com/guidance-ai/jsonschemabench, then --data "
              "jsonschemabench/maskbench/data)", file=sys.stderr)
        return 2
    started = time.monotonic()
    pool = _Pool(args.workers, args.compact, args.timeout, args.formats)
    results: list[SchemaResult] = []
    out = open(args.out, "w", encoding="utf-8") if args.out else None  # noqa: SIM115
    try:
        for result in pool.run(paths):
            results.append(result)
            if out is not None:
                row = asdict(result)
                del row["mask_us"]
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
            if len(results) % 250 == 0 or result.status in ("error", "timeout"):
                print(f"[{len(results)}/{len(paths)}] {result.name}: {result.status} "
                      f"{result.reason[:80]}", file=sys.stderr)
    finally:
        pool.close()
        if out is not None:
            out.close()
    summary = summarize(results)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    summary["workers"] = args.workers
    summary["formats"] = args.formats
    summary["targets"] = targets(summary)
    print(json.dumps(summary, indent=2) if args.json else _text(summary))
    if args.write:
        _write(summary, "python -m bench.maskbench " + " ".join(
            argv if argv is not None else sys.argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
