"""Work shared across runs (issue 6): the `batch` workload's template over N inputs, run
sequentially without any cache (the baseline) and batched with the prefix cache, in one process.

    python -m bench.batching [--inputs 16 64] [--batch-size 16]

Prints, per N: wall times and their ratio, total forward_tokens against the bound
prefix + Σ per-input tokens, and whether every batched result equals the sequential one."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import qrun

# ~300 tokens of few-shot prefix, then one question and one hole (max_tokens 12, stop "\n").
PREFIX = "".join(
    f"Q: What is {a} plus {b}?\nA: {a + b}\n" for a, b in
    [(3, 4), (10, 5), (7, 8), (12, 30), (9, 9), (21, 4), (6, 11), (15, 15), (2, 40), (8, 13),
     (14, 3), (5, 27), (33, 6), (19, 2), (11, 11), (4, 44), (25, 5), (16, 7), (1, 9), (30, 12)]
)
TEMPLATE = PREFIX + 'Q: {{ question }}\nA:{{ gen answer max_tokens=12 stop="\\n" }}\n'


def questions(count: int) -> list[dict[str, Any]]:
    return [{"question": f"What is {i % 17 + 2} plus {3 * i % 23 + 1}?"} for i in range(count)]


def measure(count: int, batch_size: int) -> dict[str, Any]:
    query = qrun.Query(TEMPLATE)
    inputs = questions(count)
    plain = qrun.load_model("smollm2", cache_mb=0)
    query.run_many(inputs[:1], model=plain)  # warm-up, not counted
    started = time.perf_counter()
    sequential = query.run_many(inputs, model=plain)
    sequential_s = time.perf_counter() - started
    cached = qrun.load_model("smollm2")
    started = time.perf_counter()
    batched = query.run_many(inputs, model=cached, batch_size=batch_size)
    batched_s = time.perf_counter() - started
    assert all(isinstance(r, qrun.Result) for r in sequential + batched)
    prefix_tokens = len(plain.encode(PREFIX))
    per_input = [r.stats.forward_tokens - prefix_tokens for r in sequential]  # type: ignore[union-attr]
    bound = prefix_tokens + sum(per_input)
    forward = sum(r.stats.forward_tokens for r in batched)  # type: ignore[union-attr]
    return {
        "inputs": count,
        "batch_size": batch_size,
        "prefix_tokens": prefix_tokens,
        "sequential_uncached_s": round(sequential_s, 2),
        "batched_cached_s": round(batched_s, 2),
        "speedup": round(sequential_s / batched_s, 2),
        "sequential_forward_tokens": sum(r.stats.forward_tokens for r in sequential),  # type: ignore[union-attr]
        "batched_forward_tokens": forward,
        "bound_prefix_plus_per_input": bound,
        "within_bound": forward <= bound,
        "same_results": sum(a.text == b.text for a, b in zip(sequential, batched, strict=True)),  # type: ignore[union-attr]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inputs", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    for count in args.inputs:
        print(json.dumps(measure(count, args.batch_size)), flush=True)


if __name__ == "__main__":
    main()
