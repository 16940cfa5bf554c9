"""How far masked sampling is from the model's own conditional distribution, and how close
sampler="exact" and sampler="smc" come (issue #40), on languages small enough to enumerate:

    python -m bench.faithfulness [--draws 300] [--backend llamacpp] [--particles 4 16 64]

For each task the reference is the conditional p(x) ∝ P_model(x | prompt) over the task's
strings, every tokenization of each string summed (_reference; the arithmetic is checked
against plain forwards of the HF model in tests/runtime/test_exact.py). Then, over seeded runs
at temperature 1 (run_many, a seed per item): masked sampling (a `regex=` hole),
`sampler="exact"` at its default bounds, a `select` over the strings (canonical tokenizations),
and `sampler="smc"` at each particle count (fewer runs where a sample costs more). Printed per
task: the total-variation distance to the reference of each method's draws (for particles
also of the mean of the runs' value_probs, the distribution each run's value is drawn from,
less noisy than its draws), of exact's own value_probs, seconds per sample, the greedy masked
value and the likeliest string. With QRUN_BENCH_GENLM_PYTHON naming a Python with genlm-control
installed, its AWRS + SMC (--genlm-particles, default 20; --genlm-runs, default 10) on the
same tasks, prompts and weights, after qrun's runs (bench/genlm_runner.py)."""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import qrun
from qrun.backends import ensure_converted, locate_model
from qrun.runtime import exact
from qrun.runtime import select as select_module

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
    # A likely first word that can only go on one way: " Paris" then, forced, " Hilton".
    Task("city", CHAT.replace("QUESTION", "Name one city in France. The name only."),
         r"(Paris Hilton|Lyon|Marseille|Toulouse)",
         ("Paris Hilton", "Lyon", "Marseille", "Toulouse")),
    Task("yes-no", CHAT.replace("QUESTION", "Is the sky blue? Answer Yes or No."),
         r"(Yes|No)", ("Yes", "No")),
)


def measure(task: Task, model: Backend, draws: int, particles: tuple[int, ...]
            ) -> dict[str, object]:
    reference, reference_s = _reference(task, model)
    exact_query = qrun.Query(task.prompt + "{{ gen s regex=pattern sampler='exact' }}"
                             "{% endassistant %}")
    at_bound = exact_query.run(model=model, pattern=task.pattern).holes["s"]
    row: dict[str, object] = {
        "task": task.name, "reference": _rounded(reference), "reference_s": round(reference_s, 2),
        "exact_probs_tv": _tv(at_bound.value_probs, reference),  # type: ignore[attr-defined]
    }
    select = qrun.Query(task.prompt + "{{ select s options=opts }}{% endassistant %}")
    methods: dict[str, tuple[qrun.Query, dict[str, object], int]] = {
        "masked": (qrun.Query(task.prompt + "{{ gen s regex=pattern }}{% endassistant %}"),
                   {"pattern": task.pattern}, draws),
        "exact": (exact_query, {"pattern": task.pattern}, draws),
        "select": (select, {"opts": list(task.strings)}, draws),
    }
    for n in particles:
        hole = f"{{{{ gen s regex=pattern sampler='smc' particles={n} }}}}{{% endassistant %}}"
        # Fewer draws where a sample costs more: the mean of the runs' value_probs (the
        # distribution each run's value is drawn from) has less noise than its draws.
        methods[f"smc{n}"] = (qrun.Query(task.prompt + hole), {"pattern": task.pattern},
                              max(30, draws * 4 // max(n, 4)))
    for name, (query, inputs, count) in methods.items():
        started = time.perf_counter()
        results = query.run_many([inputs] * count, model=model, temperature=1.0, seed=1)
        seconds = time.perf_counter() - started
        counts = collections.Counter(run["s"] for run in results)  # type: ignore[index]
        drawn = {s: counts[s] / count for s in task.strings}
        entry: dict[str, object] = {"draws": count, "tv": _tv(drawn, reference),
                                    "s_per_sample": round(seconds / count, 4)}
        if name.startswith("smc"):
            probs = [run.holes["s"].value_probs for run in results]  # type: ignore[union-attr]
            mean = {s: sum((p or {}).get(s, 0.0) for p in probs) / count for s in task.strings}
            entry["tv_of_mean_probs"] = _tv(mean, reference)
        row[name] = entry
    row["greedy_masked"] = methods["masked"][0].run(model=model, pattern=task.pattern)["s"]
    row["likeliest"] = max(reference, key=reference.__getitem__)
    return row


def genlm_rows(python: str, tasks: list[tuple[Task, dict[str, float], list[int], str]],
               particles: int, runs: int) -> list[dict[str, object]]:
    """genlm-control's AWRS + SMC on the tasks (bench/genlm_runner.py in `python`, genlm's own
    environment), on qrun's HF conversion of the same GGUF and the same context ids; per task
    its mean posterior's distance from the reference (the transformers backend's, on the same
    weights in float32 as genlm-control's) and its seconds per sample."""
    job = {"model": str(ensure_converted(locate_model("smollm2"))), "eos": ["<|im_end|>"],
           "particles": particles, "runs": runs,
           "tasks": [{"name": task.name, "prompt_ids": ids,
                      "pattern": re.escape(healed) + task.pattern,
                      "strings": list(task.strings)} for task, _, ids, healed in tasks]}
    runner = Path(__file__).with_name("genlm_runner.py")
    done = subprocess.run([python, str(runner)], input=json.dumps(job), capture_output=True,
                          text=True, check=False)
    rows: list[dict[str, object]] = []
    answers = {}
    for line in done.stdout.splitlines():
        answer = json.loads(line)
        answers[answer["name"]] = answer
    for task, reference, _, _ in tasks:
        answer = answers.get(task.name, {"error": done.stderr[-2000:]})
        if "error" in answer:
            rows.append({"task": task.name, "genlm": {"error": answer["error"]}})
            continue
        rows.append({"task": task.name, "reference_transformers": _rounded(reference),
                     f"genlm{particles}": {
            "runs": runs, "tv_of_mean_probs": _tv(answer["mean_posterior"], reference),
            "s_per_sample": round(answer["s_per_sample"], 3)}})
    return rows


def _reference(task: Task, model: Backend, tree_nodes: int = 24
               ) -> tuple[dict[str, float], float]:
    """The conditional over every tokenization of every string, and the seconds it took: a
    `sampler="exact"` hole whose tree bound is past the task's whole token tree, scored in
    trees of at most 24 nodes. On llama.cpp a row's log-probabilities move with the size of
    the batch it is computed in (measured: -7.844 against -7.878 for one token of "The cat
    sleeps." in 256-node trees and alone; the six sentences' distribution 0.086 apart), and
    small trees give the numbers a decode of one row gives, which sampling reads."""
    limits = exact.TREE_LIMIT, select_module.TREE_NODES
    exact.TREE_LIMIT, select_module.TREE_NODES = 100_000, tree_nodes
    try:
        started = time.perf_counter()
        whole = qrun.Query(task.prompt + "{{ gen s regex=pattern sampler='exact' }}"
                           "{% endassistant %}").run(model=model, pattern=task.pattern)
        seconds = time.perf_counter() - started
    finally:
        exact.TREE_LIMIT, select_module.TREE_NODES = limits
    record = whole.holes["s"]
    reference = record.value_probs  # type: ignore[attr-defined]
    assert set(reference) == set(task.strings), (reference, task.strings)
    CONTEXTS[task.name] = (whole.token_ids[: record.start], record.healed)  # type: ignore[attr-defined]
    return reference, seconds


CONTEXTS: dict[str, tuple[list[int], str]] = {}
"""Per task, the context's token ids before the hole and the healed text, from the reference
run: what genlm-control is prompted with."""


def _tv(p: dict[str, float], q: dict[str, float]) -> float:
    return round(0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in {*p, *q}), 4)


def _rounded(p: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in p.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--backend", default="llamacpp")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--particles", type=int, nargs="*", default=[4, 16, 64])
    parser.add_argument("--tasks", nargs="*", default=[task.name for task in TASKS])
    parser.add_argument("--genlm-particles", type=int, default=20)
    parser.add_argument("--genlm-runs", type=int, default=10)
    args = parser.parse_args()
    model = qrun.load_model(args.model, backend=args.backend)
    done = []
    for task in TASKS:
        if task.name in args.tasks:
            row = measure(task, model, args.draws, tuple(args.particles))
            print(json.dumps(row), flush=True)
            done.append((task, row["reference"]))
    python = os.environ.get("QRUN_BENCH_GENLM_PYTHON")
    if python:  # after qrun's runs, so the two never share the CPU
        model.close()  # type: ignore[attr-defined]
        # genlm-control runs the HF weights in float32: its reference is the transformers
        # backend's (the same weights; llama.cpp's kernels move the log-probabilities a little).
        hf = qrun.load_model(args.model, backend="transformers")
        tasks = []
        for task, _ in done:
            reference, _ = _reference(task, hf, tree_nodes=select_module.TREE_NODES)
            tasks.append((task, reference, *CONTEXTS[task.name]))
        del hf
        for row in genlm_rows(python, tasks, args.genlm_particles, args.genlm_runs):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
