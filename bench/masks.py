"""Benchmark of the constraint engine on the SmolLM2 vocabulary (not a test).

For DATE, EMAIL, INT and a 6-field JSON schema (made a regex by the frozen baseline
bench/old_json_schema.py, the engine json= holes had before llguidance): DFA compile time,
TokenIndex build time, and the per-token cost of a hole step (mask for the current state with
the remaining budget + advance) while replaying the canonical tokenization of real valid
values. "first" = the first replay on a fresh index (lazily built states pay their vocabulary
walk here), "cached" = a second replay.
The "lazy" rows force per-state first-visit computation (EAGER_MAX_STATES = 0) to show its cost.

Run: .venv/bin/python bench/masks.py [--values 40]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.old_json_schema import schema_to_regex
from qrun.backends import ensure_converted, locate_model
from qrun.backends.hf_tokenizer import vocabulary_of
from qrun.constraint.patterns import PATTERNS
from qrun.constraint.regex_index import EAGER_MAX_STATES, TokenIndex
from qrun.regex.dfa import compile_dfa

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "format": "email"},
        "city": {"type": "string"},
        "active": {"type": "boolean"},
        "score": {"type": "number"},
    },
    "required": ["name", "age", "email", "city", "active", "score"],
}
NAMES = ["Ada Lovelace", "Grace Hopper", "Alan Turing", "Émilie du Châtelet", "李雷", "Bob"]
CITIES = ["London", "Paris", "New York", "São Paulo", "Zürich", "Tokyo 東京"]


def _date(rng: random.Random) -> str:
    return f"{rng.randint(1900, 2099)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _email(rng: random.Random) -> str:
    user = rng.choice(["john.doe", "a.b+news", "grace", "x_y-z", "support"])
    return f"{user}{rng.randint(0, 99)}@{rng.choice(['example.com', 'mail.co.uk', 'hf.co'])}"


def _int(rng: random.Random) -> str:
    return str(rng.choice([rng.randint(-99, 99), rng.randint(-(10**9), 10**9)]))


def _document(rng: random.Random) -> str:
    doc = {
        "name": rng.choice(NAMES),
        "age": rng.randint(0, 130),
        "email": _email(rng),
        "city": rng.choice(CITIES),
        "active": rng.random() < 0.5,
        "score": round(rng.uniform(-100, 100), rng.randint(0, 4)),
    }
    return json.dumps(doc, ensure_ascii=False, separators=(", ", ": "))


CASES: list[tuple[str, str, Callable[[random.Random], str]]] = [
    ("DATE", PATTERNS["DATE"], _date),
    ("EMAIL", PATTERNS["EMAIL"], _email),
    ("INT", PATTERNS["INT"], _int),
    ("JSON 6 fields", schema_to_regex(SCHEMA), _document),
]


def _replay(index: TokenIndex, sequences: list[list[int]], budget: int) -> list[float]:
    """Seconds per token for: mask with remaining budget, then advance."""
    times: list[float] = []
    for ids in sequences:
        cursor = index.start()
        for step, token_id in enumerate(ids):
            started = time.perf_counter()
            mask = cursor.allowed(budget - step)
            cursor.advance(token_id)
            times.append(time.perf_counter() - started)
            assert mask[token_id]
        assert cursor.can_end()
    return times


def _ms(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values) * 1000, q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--values", type=int, default=40, help="valid values replayed per case")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(ensure_converted(locate_model("smollm2")))
    started = time.perf_counter()
    vocab = vocabulary_of(tokenizer)
    print(f"vocabulary: {vocab.size} ids, built in {time.perf_counter() - started:.2f} s\n")
    rng = random.Random(0)
    header = (
        f"{'case':<16}{'mode':<7}{'states':>7}{'dfa ms':>9}{'build ms':>10}{'tokens':>8}"
        f"{'first p50':>11}{'first p99':>11}{'cached p50':>12}{'cached p99':>12}"
    )
    print(header)
    print("-" * len(header))
    compile_dfa(PATTERNS["INT"])  # warm imports
    for name, pattern, make in CASES:
        values = [make(rng) for _ in range(args.values)]
        sequences = [tokenizer.encode(v, add_special_tokens=False) for v in values]
        budget = max(len(s) for s in sequences) + 8
        for mode, limit in (("eager", EAGER_MAX_STATES), ("lazy", 0)):
            dfa_times, build_times = [], []
            for _ in range(3):
                t0 = time.perf_counter()
                dfa = compile_dfa(pattern)
                t1 = time.perf_counter()
                index = TokenIndex.build(dfa, vocab, eager_max_states=limit)
                t2 = time.perf_counter()
                dfa_times.append(t1 - t0)
                build_times.append(t2 - t1)
            first = _replay(index, sequences, budget)
            cached = _replay(index, sequences, budget)
            print(
                f"{name:<16}{mode:<7}{dfa.num_states:>7}"
                f"{statistics.median(dfa_times) * 1000:>9.1f}"
                f"{statistics.median(build_times) * 1000:>10.1f}{len(first):>8}"
                f"{_ms(first, 50):>11.4f}{_ms(first, 99):>11.4f}"
                f"{_ms(cached, 50):>12.4f}{_ms(cached, 99):>12.4f}"
            )
    print(
        "\nper-token times in ms (mask with remaining budget + advance); build = TokenIndex.build"
        " on a compiled DFA (eager: all masks); dfa = compile_dfa"
    )


if __name__ == "__main__":
    main()
