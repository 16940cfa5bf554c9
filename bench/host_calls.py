"""What a host function call costs qrun (issue #25: at most 1 ms): a template that calls a
no-op host function N times in a `for` loop against the same loop calling a builtin, on a
model-free run (the tiny model's tokenizer; no hole, so no forward). The difference per call is
qrun's overhead: checking arguments and result as plain data, the thread or event loop hop,
the trace record and the Stats counters.

    .venv/bin/python -m bench.host_calls [--calls 1000] [--runs 5] [--json]

Reported for a sync function with the default timeout (on a thread of its own), a sync
function with call_timeout_s=None (on the run's thread) and an async function (on qrun's
private event loop); each the median of --runs runs."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import qrun
from qrun.backends.tiny import load_tiny

LOOP = "{% for i in range(n) %}{% set y = CALL %}{% endfor %}"


def _noop(x: int) -> int:
    return x


async def _anoop(x: int) -> int:
    return x


def _seconds(query: qrun.Query, model: object, n: int, limits: qrun.Limits, runs: int
             ) -> float:
    options = qrun.RunOptions(limits=limits)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        query.run({"n": n}, model=model, options=options)  # type: ignore[arg-type]
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(calls: int, runs: int) -> dict[str, float]:
    """Microseconds of qrun overhead per host call, per way of calling."""
    model = load_tiny(seed=0)
    functions = qrun.Functions({"noop": _noop, "anoop": _anoop})
    limits = qrun.Limits(steps=100_000_000)
    builtin = qrun.Query(LOOP.replace("CALL", "abs(i)"), functions=functions)
    base = _seconds(builtin, model, calls, limits, runs)
    out = {"builtin_us": base / calls * 1e6}
    cases = {"sync_thread": ("noop", limits),
             "sync_inline": ("noop", qrun.Limits(steps=100_000_000, call_timeout_s=None)),
             "async": ("anoop", limits)}
    for label, (name, case_limits) in cases.items():
        query = qrun.Query(LOOP.replace("CALL", f"{name}(i)"), functions=functions)
        total = _seconds(query, model, calls, case_limits, runs)
        out[f"{label}_overhead_us"] = (total - base) / calls * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.calls, args.runs)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.calls} calls, median of {args.runs} runs:")
    for key, value in result.items():
        print(f"  {key:24} {value:9.1f} us")


if __name__ == "__main__":
    main()
