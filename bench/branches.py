"""Branches after a shared prefix (issue 25): one template that forks N branches after a ~1k-token
prefix (`{% fork %}`, docs/language.md §23.1) against the same program without the fork run N
times, as N independent `Query.run` calls (what a user would write without branches), on
transformers and llama.cpp in one process.

    python -m bench.branches [--branches 8] [--threads 1] [--backend transformers llamacpp]

Per backend, after one untimed warm-up of each: the fork run, then the N separate runs twice,
with the model's prefix cache as loaded (the default: the runs after the first are served the
prefix) and emptied before each run (each run feeds its whole context); the prefix cache is
emptied before every timed pass. Greedy. Prints one JSON object per backend: wall times and
their ratios, forward tokens, forward/context over all branches (the fork run's forward tokens
against the prefix plus every branch's own tokens, read off the separate runs' contexts), and
how many branches wrote what their separate run wrote. Targets: forward/context <= 1.02, fork
wall time <= 0.5 x the separate runs' (both ways)."""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import time
from typing import Any

import qrun
from qrun.backends import Backend

# ~1k tokens of shared context: a numbered list of facts, then one question per branch.
PLACES = (("Oak", "apples", "Monday"), ("Mill", "bolts", "Tuesday"), ("King", "paper", "Friday"),
          ("Bridge", "salt", "Sunday"), ("Hill", "glass", "Wednesday"),
          ("Lake", "rope", "Thursday"), ("Park", "tiles", "Saturday"))
FACTS = [f"Fact {i}: the {colour} warehouse on {street} Street stores {10 + 7 * i} crates of "
         f"{item}, checked every {day}."
         for i, (colour, (street, item, day)) in enumerate(itertools.product(
             ("red", "blue", "green", "grey", "white", "black"), PLACES))]
PREFIX = "Inventory notes.\n" + "\n".join(FACTS) + "\n\n"
QUESTION = ("Question {{ i }}: in one short sentence, what does fact {{ i * 4 }} say?\n"
            'Answer:{{ gen answer max_tokens=24 stop="\\n" }}\n')
FORK = PREFIX + "{% fork i in range(n) %}" + QUESTION + "{% endfork %}"
SEPARATE = PREFIX + QUESTION


def load(name: str) -> Backend:
    if name == "llamacpp":
        return qrun.load_model("smollm2", backend="llamacpp")
    return qrun.load_model("smollm2")


def clear(backend: Backend) -> None:
    backend.clear_cache()


def fork_pass(backend: Backend, n: int) -> tuple[float, qrun.Result]:
    query = qrun.Query(FORK)
    clear(backend)
    started = time.perf_counter()
    result = query.run({"n": n}, model=backend, temperature=0.0)
    return time.perf_counter() - started, result


def separate_pass(backend: Backend, n: int, cached: bool) -> tuple[float, list[qrun.Result]]:
    query = qrun.Query(SEPARATE)
    clear(backend)
    results = []
    started = time.perf_counter()
    for i in range(n):
        if not cached:
            clear(backend)
        results.append(query.run({"i": i}, model=backend, temperature=0.0))
    return time.perf_counter() - started, results


def measure(name: str, n: int) -> dict[str, Any]:
    backend = load(name)
    fork_pass(backend, 2)  # warm-ups, not counted
    separate_pass(backend, 2, cached=True)
    fork_s, fork = fork_pass(backend, n)
    cached_s, cached = separate_pass(backend, n, cached=True)
    cold_s, cold = separate_pass(backend, n, cached=False)
    prefix = fork.stats.context_tokens  # the fork leaves the run's context at the prefix
    own = [r.stats.context_tokens - prefix for r in cold]
    all_context = prefix + sum(own)
    stats = fork.stats
    return {
        "backend": name,
        "model": backend.name,
        "branches": n,
        "prefix_tokens": prefix,
        "branch_tokens_each": own,
        "fork_wall_s": round(fork_s, 2),
        "separate_cached_wall_s": round(cached_s, 2),
        "separate_uncached_wall_s": round(cold_s, 2),
        "fork_vs_separate_cached": round(fork_s / cached_s, 3),
        "fork_vs_separate_uncached": round(fork_s / cold_s, 3),
        "fork_forward_tokens": stats.forward_tokens,
        "fork_forward_calls": stats.forward_calls,
        "fork_branch_tokens": stats.branch_tokens,
        "context_over_all_branches": all_context,
        "forward_over_context": round(stats.forward_tokens / all_context, 4),
        # Speculation (docs/language.md §14.10) feeds guesses with a step's forward and counts
        # those the model did not take; without them, what the branches and the prefix cost:
        "unaccepted_drafts": stats.drafted_tokens - stats.accepted_tokens,
        "forward_over_context_without_unaccepted_drafts": round(
            (stats.forward_tokens - stats.drafted_tokens + stats.accepted_tokens)
            / all_context, 4),
        "separate_cached_forward_tokens": sum(r.stats.forward_tokens for r in cached),
        "separate_uncached_forward_tokens": sum(r.stats.forward_tokens for r in cold),
        "same_answers": sum(a == r["answer"] for a, r in zip(fork["answer"], cold, strict=True)),
        "targets_met": {
            "forward_over_context_le_1.02": stats.forward_tokens <= 1.02 * all_context,
            "without_unaccepted_drafts_le_1.02": stats.forward_tokens - stats.drafted_tokens
            + stats.accepted_tokens <= 1.02 * all_context,
            "fork_le_half_separate_cached": fork_s <= 0.5 * cached_s,
            "fork_le_half_separate_uncached": fork_s <= 0.5 * cold_s,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--branches", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1 on the shared 2-core VM)")
    parser.add_argument("--backend", nargs="+", default=["transformers", "llamacpp"],
                        choices=["transformers", "llamacpp"])
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    print(json.dumps({"machine": platform.processor() or platform.machine(),
                      "torch_threads": args.threads}), flush=True)
    for name in args.backend:
        print(json.dumps(measure(name, args.branches)), flush=True)


if __name__ == "__main__":
    main()
