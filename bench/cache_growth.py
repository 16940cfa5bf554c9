"""Whether runs slow down as the prefix cache fills (issue #37): two timed tasks on an empty
cache, then again after each round of fresh short prompts has left its snapshots in the cache.

    .venv/bin/python -m bench.cache_growth [--backend llamacpp] [--rounds 3] [--prompts 70]

- `city`: 16 runs of a four-city hole with `sampler="smc" particles=16` at temperature 1 (a
  particle block's forks and tree scoring), after one that is not timed, so that the prompt
  comes from the cache: milliseconds a run.
- `document`: 4 runs of a question on a ~660-token shared document, each question new (the
  document comes from the cache once a run has fed it): milliseconds a run, and the tokens
  each run took from the cache.
- a round: `--prompts` runs of a short prompt, each new, 8 at a time (what a server's stream
  of distinct requests leaves in the cache); its milliseconds a prompt are printed too.

Why: on llama.cpp the attention of every forward spans the KV cells up to the highest in use,
and before the prefix cache kept its snapshots in host memory (backends/llamacpp.py
HostSnapshot) they stayed in the cells; they also held one of llama.cpp's 256 sequence ids
each, so a round of fresh prompts evicted the document's snapshot. A line of JSON per
measurement."""

from __future__ import annotations

import argparse
import json
import time
from itertools import count
from typing import TYPE_CHECKING

import qrun

if TYPE_CHECKING:
    from qrun.backends import Backend

CITY = ("{% user %}Name one city in France. The name only.{% enduser %}\n{% assistant %}"
        "{{ gen s regex=\"(Paris Hilton|Lyon|Marseille|Toulouse)\" sampler='smc' particles=16 }}"
        "{% endassistant %}")
DOCUMENT = "The committee met on Tuesday to discuss the budget. " * 60
QUESTION = ("{% user %}{{ d }} Question {{ r }}: what did the committee discuss?{% enduser %}\n"
            "{% assistant %}{{ gen x max_tokens=8 }}{% endassistant %}")
SHORT = ("{% user %}Tell me about request {{ r }}, briefly.{% enduser %}\n"
         "{% assistant %}{{ gen x max_tokens=4 }}{% endassistant %}")


def measure(model: Backend, label: str, questions: count[int]) -> dict[str, object]:
    """The two tasks' milliseconds a run, as the cache is now."""
    city = qrun.Query(CITY)
    city.run(model=model, temperature=1.0, seed=1)  # its prompt in the cache, as after a round
    started = time.perf_counter()
    city.run_many([{}] * 16, model=model, temperature=1.0, seed=1)
    city_ms = (time.perf_counter() - started) / 16 * 1000
    rows = [{"d": DOCUMENT, "r": next(questions)} for _ in range(4)]
    started = time.perf_counter()
    results = qrun.Query(QUESTION).run_many(rows, model=model, temperature=1.0, seed=1)
    document_ms = (time.perf_counter() - started) / 4 * 1000
    cached = [r.stats.cached_tokens for r in results if isinstance(r, qrun.Result)]
    assert len(cached) == 4, results
    return {"when": label, "city_ms": round(city_ms, 1), "document_ms": round(document_ms),
            "document_cached_tokens": cached}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="llamacpp")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=70, help="fresh short prompts a round")
    args = parser.parse_args()
    model = qrun.load_model(args.model, backend=args.backend)
    questions, requests = count(1), count(1)
    print(json.dumps(measure(model, "empty cache", questions)), flush=True)
    for round_ in range(1, args.rounds + 1):
        rows = [{"r": next(requests)} for _ in range(args.prompts)]
        started = time.perf_counter()
        qrun.Query(SHORT).run_many(rows, model=model, temperature=1.0, seed=round_,
                                   batch_size=8)
        prompt_ms = (time.perf_counter() - started) / args.prompts * 1000
        row = measure(model, f"after {round_ * args.prompts} fresh prompts", questions)
        print(json.dumps({**row, "fresh_prompt_ms": round(prompt_ms)}), flush=True)


if __name__ == "__main__":
    main()
