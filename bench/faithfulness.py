"""How far masked sampling is from the model's own conditional distribution (issue #40), on
languages small enough to enumerate:

    python -m bench.faithfulness [--draws 300] [--backend llamacpp] [--model smollm2]

For each task, the conditional p(x) ∝ P_model(x | prompt) over the task's strings comes from a
`select` over them (each string scored whole in context, docs/language.md §14.7: its canonical
tokenization only, where the issue's reference sums every tokenization), and masked sampling's
distribution from `--draws` seeded runs of a `regex=` hole over the same language at temperature
1 (run_many, a seed per item). Printed per task: both distributions, their total-variation
distance, the greedy masked value and the likeliest string. A first step of the issue's
bench: particles (N = 4, 16, 64) and genlm-control are not measured yet."""

from __future__ import annotations

import argparse
import collections
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import qrun

if TYPE_CHECKING:
    from qrun.backends import Backend


@dataclass(frozen=True)
class Task:
    """A prompt (template text before the hole), the language as a regex and as its strings."""

    name: str
    prompt: str
    pattern: str
    strings: tuple[str, ...]


CHAT = "{% user %}QUESTION{% enduser %}\n{% assistant %}"
TASKS = (
    # The subject is chosen before the verbs are seen: masking cannot know that after
    # "A bird" only unlikely endings remain.
    Task("sentence", CHAT.replace("QUESTION", "Write one short sentence about an animal."),
         r"(The cat|The dog|A bird) (sleeps|runs)\.",
         tuple(f"{s} {v}." for s in ("The cat", "The dog", "A bird") for v in ("sleeps", "runs"))),
    # Options that share their first letters (Grey, Green): the first token's mass is split
    # by what could follow it, not by the words.
    Task("colour", CHAT.replace("QUESTION", "What colour is the sky on a clear day? One word."),
         r"(Blue|Grey|Green|Red)", ("Blue", "Grey", "Green", "Red")),
    # The control: one token per value, one decision: masking is exact (the distance is the
    # draws' noise).
    Task("yes-no", CHAT.replace("QUESTION", "Is the sky blue? Answer Yes or No."),
         r"(Yes|No)", ("Yes", "No")),
)


def measure(task: Task, model: Backend, draws: int) -> dict[str, object]:
    scored = qrun.Query(task.prompt + "{{ select s options=opts }}{% endassistant %}").run(
        model=model, opts=list(task.strings))
    conditional = scored.holes["s"].option_probs  # type: ignore[attr-defined]
    query = qrun.Query(task.prompt + "{{ gen s regex=pattern }}{% endassistant %}")
    runs = query.run_many([{"pattern": task.pattern}] * draws, model=model, temperature=1.0,
                          seed=1)
    counts = collections.Counter(run["s"] for run in runs)  # type: ignore[index]
    masked = {s: counts[s] / draws for s in task.strings}
    greedy = query.run(model=model, pattern=task.pattern)["s"]
    return {"task": task.name, "draws": draws,
            "tv": round(0.5 * sum(abs(masked[s] - conditional[s]) for s in task.strings), 3),
            "conditional": {s: round(conditional[s], 3) for s in task.strings},
            "masked": masked, "greedy_masked": greedy,
            "likeliest": max(conditional, key=conditional.__getitem__)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--backend", default="llamacpp")
    parser.add_argument("--model", default="smollm2")
    args = parser.parse_args()
    model = qrun.load_model(args.model, backend=args.backend)
    for task in TASKS:
        print(json.dumps(measure(task, model, args.draws)), flush=True)


if __name__ == "__main__":
    main()
