"""Benchmark of regex holes end to end on the default model (not a test).

One template with 20 regex holes from qrun.stdlib (5 each of DATE, EMAIL, PHONE_US, INT), each
after a short label line, run greedily: one warm-up run (token indexes are built and cached
on the Query), then `--reps` timed runs. Prints, per run and as medians: mask_s (computing
token masks), model_s (forwards), wall_s, mask_s / model_s (target <= 5%), forward_tokens /
context_tokens (1.0 = every context token fed once, nothing reworked) and forced_tokens.

The model's prefix cache is cleared before each timed run (an identical greedy run would
otherwise be served from it without a forward); --keep-cache shows that case.

Run: .venv/bin/python bench/regex_holes.py [--reps 3] [--threads N] [--keep-cache]
"""

from __future__ import annotations

import argparse
import statistics
import time

import regex
import torch

import qrun
from qrun.constraint.patterns import PATTERNS

LABELS = {
    "DATE": ["Date of birth", "Start date", "Invoice date", "Due date", "Shipped on"],
    "EMAIL": ["Work email", "Personal email", "Billing contact", "Support address", "Manager"],
    "PHONE_US": ["Office phone", "Mobile", "Fax", "Emergency contact", "Front desk"],
    "INT": ["Age", "Employees", "Order quantity", "Floor", "Years of service"],
}
MAX_TOKENS = {"DATE": 12, "EMAIL": 24, "PHONE_US": 16, "INT": 6}


def build_template() -> tuple[str, list[tuple[str, str]]]:
    """The template text and (hole name, pattern name) per hole, kinds interleaved."""
    lines = ["Contact record for Jane Smith, Acme Corp (Springfield, IL).\n"]
    holes: list[tuple[str, str]] = []
    for i in range(5):
        for kind, labels in LABELS.items():
            name = f"{kind.lower()}{i}"
            lines.append(f"{labels[i]}:\n{{{{ gen {name} regex={kind} "
                         f"max_tokens={MAX_TOKENS[kind]} }}}}\n")
            holes.append((name, kind))
    return "".join(lines), holes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3, help="timed runs after the warm-up")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--keep-cache", action="store_true",
                        help="keep the prefix cache between timed runs (then they cost ~0)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    backend = qrun.load_model("smollm2")
    print(f"model {backend.name} loaded in {time.perf_counter() - started:.1f} s, "
          f"torch threads {torch.get_num_threads()}")
    text, holes = build_template()
    query = qrun.Query(text)

    started = time.perf_counter()
    warm = query.run(model=backend, temperature=0)
    print(f"warm-up run (builds the token indexes): {time.perf_counter() - started:.2f} s")
    for name, kind in holes:
        assert regex.fullmatch(PATTERNS[kind], warm[name], flags=regex.ASCII), (name, warm[name])
    print("values:", ", ".join(f"{name}={warm[name]!r}" for name, _ in holes[:8]), "...")
    ws = warm.stats
    print(f"warm-up: mask_s {ws.mask_s:.3f}, model_s {ws.model_s:.3f}, wall_s {ws.wall_s:.3f}")

    header = (f"{'run':<6}{'mask_s':>9}{'model_s':>9}{'wall_s':>9}{'mask/model':>12}"
              f"{'fwd/ctx':>9}{'forced':>8}{'generated':>11}{'context':>9}")
    print("\n" + header + "\n" + "-" * len(header))
    rows = []
    for rep in range(args.reps):
        if not args.keep_cache:
            # The prefix cache would serve an identical greedy run without a single forward:
            # clear it so every timed run pays its own forwards (token indexes stay built).
            backend.clear_cache()
        result = query.run(model=backend, temperature=0)
        assert all(result[name] == warm[name] for name, _ in holes), "greedy runs differ"
        s = result.stats
        row = (s.mask_s, s.model_s, s.wall_s, s.mask_s / max(s.model_s, 1e-9),
               s.forward_tokens / s.context_tokens, s.forced_tokens, s.generated_tokens,
               s.context_tokens)
        rows.append(row)
        print(f"{rep + 1:<6}{row[0]:>9.3f}{row[1]:>9.3f}{row[2]:>9.3f}{row[3]:>11.2%}"
              f"{row[4]:>9.3f}{row[5]:>8d}{row[6]:>11d}{row[7]:>9d}")
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    print(f"{'median':<6}{med[0]:>9.3f}{med[1]:>9.3f}{med[2]:>9.3f}{med[3]:>11.2%}"
          f"{med[4]:>9.3f}{med[5]:>8.0f}{med[6]:>11.0f}{med[7]:>9.0f}")
    verdict = "OK" if med[3] <= 0.05 else "ABOVE TARGET"
    print(f"\nmask_s / model_s median {med[3]:.2%} (target <= 5%): {verdict}")


if __name__ == "__main__":
    main()
