"""How far masked sampling is from the model's own conditional distribution, and how close
sampler="exact" and sampler="smc" come (issue #40), on languages small enough to enumerate:

    python -m bench.faithfulness [--draws 300] [--backend llamacpp] [--particles 4 16 64]

For each task the reference is the conditional p(x) ∝ P_model(x | prompt) over the task's
strings, every tokenization of each string summed (_reference; the arithmetic is checked
against plain forwards of the HF model in tests/runtime/test_exact.py). Then, over seeded runs
at temperature 1 (run_many, a seed per item): masked sampling (a `regex=` hole),
`sampler="exact"` at its default bounds, a `select` over the strings (canonical tokenizations),
and `sampler="smc"` at each particle count (fewer runs where a sample costs more). Then tasks
of two holes (BLOCK_TASKS): masked, each hole's own particles, and `{% particles N %}` blocks
against the conditional over both holes (_block_reference). Printed per task: the
total-variation distance and the KL divergence KL(method ‖ reference), in nats, of each
method's draws from the reference (for particles also of the mean of the runs' value_probs,
the distribution each run's value is drawn from, less noisy than its draws), of exact's own
value_probs, seconds per sample, the greedy masked value and the likeliest string.

Seconds per sample (`s_per_sample`) are timed apart from the draws, on fresh prompts: the same
template with a request number after the user's question, a new one for each run, `--batch`
runs at a time (run_many's batch_size), so that no run's prompt or value is answered from the
prefix cache of another. The draws repeat one prompt, so masked sampling's later runs read
their logits from the cache and feed nothing (`s_per_sample_repeated`: what repeating a
request costs, not what sampling does). With
QRUN_BENCH_GENLM_PYTHON naming a Python with genlm-control installed, its AWRS + SMC
(--genlm-particles, default 20; --genlm-runs, default 10) on the same tasks, prompts and
weights, after qrun's runs (bench/genlm_runner.py)."""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

import qrun
from qrun.backends import ensure_converted, locate_model
from qrun.runtime import exact
from qrun.runtime import select as select_module

if TYPE_CHECKING:
    from qrun.backends import Backend


@dataclass(frozen=True)
class Task:
    """A prompt (template text before the hole), the language as a regex and as its strings;
    `large`: more strings than sampler="exact" scores (its reference is then a select over
    the strings: their canonical tokenizations only)."""

    name: str
    prompt: str
    pattern: str
    strings: tuple[str, ...]
    large: bool = False


CHAT = "{% user %}QUESTION{% enduser %}\n{% assistant %}"
SENTENCE_SLOTS = (("The", "A", "One", "My"), ("big", "small", "old", "young", "happy", "lazy"),
                  ("cat", "dog", "bird", "fish", "horse"),
                  ("sleeps", "runs", "eats", "sings", "barks"))


def _sentences(name: str, *slots: tuple[str, ...]) -> Task:
    """A large task: a sentence of one word from each slot, then a full stop (the regex and
    every string of it)."""
    return Task(name, CHAT.replace("QUESTION", "Write one short sentence about an animal."),
                " ".join(f"({'|'.join(words)})" for words in slots) + r"\.",
                tuple(" ".join(words) + "." for words in itertools.product(*slots)), large=True)


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
    # More values than sampler="exact" scores (600, 2,400 and 1,440 strings): sentences whose
    # first words are chosen before the later parts' constraints are seen, and a time of day
    # whose hour's first digit decides what may follow.
    _sentences("sentence-600", *SENTENCE_SLOTS),
    # Further past what 16 particles score whole (their trees: 16 × 24 nodes, runtime/
    # particles.py TAIL_NODES; the 600 sentences are 988, scored whole while the bound was
    # 64): a fifth word, so they go by the proposal over more of the first words before the
    # rest is small enough to finish exactly.
    _sentences("sentence-2400", *SENTENCE_SLOTS, ("here", "today", "again", "now")),
    Task("time", CHAT.replace("QUESTION", "At what time does a typical office workday start? "
                                          "Answer as HH:MM."),
         r"([01][0-9]|2[0-3]):[0-5][0-9]",
         tuple(f"{h:02d}:{m:02d}" for h in range(24) for m in range(60)), large=True),
)


@dataclass(frozen=True)
class BlockTask:
    """Two holes in a row (docs/language.md §23.5): the first's language, the text between,
    the second's language as a template expression that may read the first (`a`), the text
    after."""

    name: str
    prompt: str
    first: str
    between: str
    second: str
    after: str

    def template(self, particles: int | None, sampler: str = "", second: str = "") -> str:
        """The task's template: both holes masked (or drawn by `sampler`), or in a
        `{% particles %}` block of that many particles; `second`: the second hole's own
        arguments."""
        body = (f'{{{{ gen a regex="{self.first}" {sampler}}}}}{self.between}'
                f"{{{{ gen b regex=({self.second}) {sampler}{second}}}}}{self.after}")
        if particles is not None:
            body = f"{{% particles {particles} %}}{body}{{% endparticles %}}"
        return self.prompt + body + "{% endassistant %}"


BLOCK_TASKS = (
    # The sentence task's two parts as two holes: the subject is written before the verb's
    # hole and its constraint come.
    BlockTask("sentence-2", CHAT.replace("QUESTION", "Write one short sentence about an animal."),
              "(The cat|The dog|A bird)", " ", '"(sleeps|runs)"', "."),
    # A likely first value after which the second hole allows only an unlikely ending.
    BlockTask("city-2", CHAT.replace("QUESTION", "Name one city in France and say one thing "
                                                 "about it."),
              "(Paris|Lyon|Marseille)", "", r'" Hilton\\." if a == "Paris" else " is lovely\\."',
              ""),
)


def measure_block(task: BlockTask, model: Backend, draws: int, particles: tuple[int, ...],
                  batch: int = 8, timed: int = 64) -> dict[str, object]:
    """Masked sampling, each hole's own 16 particles, and `{% particles N %}` blocks against
    the model's conditional over both holes (_block_reference)."""
    reference = _block_reference(task, model)
    row: dict[str, object] = {"task": task.name, "reference": _rounded(reference)}
    methods: dict[str, tuple[str, int]] = {
        "masked": (task.template(None), draws),
        "smc16 per hole": (task.template(None, "sampler='smc' particles=16 "), max(30, draws // 4)),
    }
    for n in particles:
        methods[f"block{n}"] = (task.template(n), max(30, draws * 4 // max(n, 4)))
    for name, (template, count) in methods.items():
        started = time.perf_counter()
        results = qrun.Query(template).run_many([{}] * count, model=model, temperature=1.0,
                                                seed=1, batch_size=batch)
        seconds = time.perf_counter() - started
        counts = collections.Counter(f"{r['a']}|{r['b']}" for r in results)  # type: ignore[index]
        drawn = {k: c / count for k, c in counts.items()}
        entry: dict[str, object] = {
            "draws": count, "tv": _tv(drawn, reference), "kl": _kl(drawn, reference),
            "s_per_sample": round(_fresh_seconds(template, {}, model, timed, batch), 4),
            "s_per_sample_repeated": round(seconds / count, 4)}
        if name.startswith("block"):
            mean: collections.Counter[str] = collections.Counter()
            for result in results:
                (block,) = result.particle_blocks  # type: ignore[union-attr]
                for values, weight in zip(block.values, block.weights, strict=True):
                    mean[f"{values['a']}|{values['b']}"] += weight / count
            entry["tv_of_mean_weights"] = _tv(dict(mean), reference)
            entry["kl_of_mean_weights"] = _kl(dict(mean), reference)
        row[name] = entry
    return row


def _block_reference(task: BlockTask, model: Backend) -> dict[str, float]:
    """p(a, b) ∝ P_model(a + between + b | prompt) over every pair the two holes allow: one
    exact hole over the whole strings (sampler="exact": every tokenization summed, as far as
    exact.TREE_LIMIT; the canonical ones past it), the pairs listed by the holes' own exact
    runs. Not P(a) times P(b | a given as text): a known value is fixed text, which the next
    hole heals into (docs/language.md §14.3), so after "Lyon" given as text the second hole
    takes back "yon" and counts its probability twice (measured, llama.cpp: city-2's
    Marseille 0.80 so, 0.24 by whole strings)."""
    exact_both = qrun.Query(task.template(None, "sampler='exact' "))
    first = exact_both.run(model=model).holes["a"].value_probs  # type: ignore[attr-defined]
    pairs = {}
    for a in first:
        second = exact_both.run(model=model, fill={"a": a}).holes["b"]
        for b in second.value_probs:  # type: ignore[attr-defined]
            pairs[a + task.between + b] = f"{a}|{b}"
    pattern = "(" + "|".join(re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", text)
                             for text in pairs) + ")"
    whole = qrun.Query(task.prompt + "{{ gen s regex=pattern sampler='exact' }}" + task.after
                       + "{% endassistant %}").run(model=model, pattern=pattern)
    probs = whole.holes["s"].value_probs  # type: ignore[attr-defined]
    assert set(probs) == set(pairs), "every pair is one string of the whole language"
    return {pairs[text]: prob for text, prob in probs.items()}


REQUESTS: Iterator[int] = itertools.count(1)
"""The request numbers that make each timed run's prompt fresh (_fresh_seconds)."""


def _fresh_seconds(template: str, inputs: dict[str, object], model: Backend, runs: int,
                   batch: int) -> float:
    """Seconds per run of `template` with `inputs`, each of `runs` runs with its own request
    number after the user's question (so nothing after it is answered from the prefix cache:
    every run feeds the end of its prompt and its value), `batch` at a time."""
    fresh = qrun.Query(template.replace("{% enduser %}", " (Request {{ request }}.){% enduser %}",
                                        1))
    rows = [{**inputs, "request": next(REQUESTS)} for _ in range(runs)]
    # From an empty prefix cache, and left empty: each method is timed from the same state
    # and leaves none to the next (what one method's runs cached would serve another's
    # prompts). Before the llama.cpp cache kept its snapshots in host memory (backends/
    # llamacpp.py HostSnapshot), this also kept a forward there from slowing as snapshots
    # filled the KV cells (16 particle runs of the city task 45 ms a run on an empty cache,
    # 100-130 ms after 50-200 fresh prompts).
    model.clear_cache()
    started = time.perf_counter()
    results = fresh.run_many(rows, model=model, temperature=1.0, seed=2, batch_size=batch)
    seconds = time.perf_counter() - started
    model.clear_cache()
    failed = [r for r in results if not isinstance(r, qrun.Result)]
    assert not failed, failed[0]
    return seconds / runs


def measure(task: Task, model: Backend, draws: int, particles: tuple[int, ...],
            batch: int = 8, timed: int = 64) -> dict[str, object]:
    select_text = task.prompt + "{{ select s options=opts }}{% endassistant %}"
    select = qrun.Query(select_text)
    if task.large:
        reference, reference_s = _select_reference(task, select, model)
    else:
        reference, reference_s = _reference(task, model)
    exact_text = (task.prompt + "{{ gen s regex=pattern sampler='exact' }}"
                  "{% endassistant %}")
    exact_query = qrun.Query(exact_text)
    row: dict[str, object] = {"task": task.name, "strings": len(task.strings),
                              "reference": _rounded(_top(reference)),
                              "reference_s": round(reference_s, 2),
                              "noise_tv": _noise(reference, draws)}
    methods: dict[str, tuple[str, dict[str, object], int]] = {
        "masked": (task.prompt + "{{ gen s regex=pattern }}{% endassistant %}",
                   {"pattern": task.pattern}, draws),
    }
    if not task.large:  # sampler="exact" refuses the large ones (more values than it scores)
        at_bound = exact_query.run(model=model, pattern=task.pattern).holes["s"]
        row["exact_probs_tv"] = _tv(at_bound.value_probs, reference)  # type: ignore[attr-defined]
        row["exact_probs_kl"] = _kl(at_bound.value_probs, reference)  # type: ignore[attr-defined]
        methods["exact"] = (exact_text, {"pattern": task.pattern}, draws)
        methods["select"] = (select_text, {"opts": list(task.strings)}, draws)
    for n in particles:
        hole = f"{{{{ gen s regex=pattern sampler='smc' particles={n} }}}}{{% endassistant %}}"
        # Fewer draws where a sample costs more: the mean of the runs' value_probs (the
        # distribution each run's value is drawn from) has less noise than its draws. Not on
        # the large tasks, whose hundreds of strings leave that mean noisy at 75 runs.
        count = draws if task.large else max(30, draws * 4 // max(n, 4))
        methods[f"smc{n}"] = (task.prompt + hole, {"pattern": task.pattern}, count)
    for name, (template, inputs, count) in methods.items():
        started = time.perf_counter()
        results = qrun.Query(template).run_many([inputs] * count, model=model, temperature=1.0,
                                                seed=1, batch_size=batch)
        seconds = time.perf_counter() - started
        counts = collections.Counter(run["s"] for run in results)  # type: ignore[index]
        drawn = {s: counts[s] / count for s in task.strings}
        entry: dict[str, object] = {
            "draws": count, "tv": _tv(drawn, reference), "kl": _kl(drawn, reference),
            "s_per_sample": round(_fresh_seconds(template, inputs, model, timed, batch), 4),
            "s_per_sample_repeated": round(seconds / count, 4)}
        if name.startswith("smc"):
            probs = [run.holes["s"].value_probs for run in results]  # type: ignore[union-attr]
            mean = {s: sum((p or {}).get(s, 0.0) for p in probs) / count for s in task.strings}
            entry["tv_of_mean_probs"] = _tv(mean, reference)
            entry["kl_of_mean_probs"] = _kl(mean, reference)
            # The estimate's own noise: the distance between the means of the two halves of
            # the runs; the whole mean's distance from its expectation is about half of it.
            halves = [{s: sum((p or {}).get(s, 0.0) for p in part) / len(part)
                       for s in task.strings} for part in (probs[::2], probs[1::2])]
            entry["tv_between_halves"] = _tv(*halves)
        row[name] = entry
    row["greedy_masked"] = qrun.Query(methods["masked"][0]).run(model=model,
                                                                pattern=task.pattern)["s"]
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
            "kl_of_mean_probs": _kl(answer["mean_posterior"], reference),
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


def _select_reference(task: Task, select: qrun.Query, model: Backend
                      ) -> tuple[dict[str, float], float]:
    """A large task's reference: a select over its strings (each in its canonical
    tokenization; on the small tasks that spelling holds all but 0.3 % of a string's mass),
    scored in trees of at most 24 nodes (see _reference)."""
    nodes = select_module.TREE_NODES
    select_module.TREE_NODES = 24
    try:
        started = time.perf_counter()
        record = select.run(model=model, opts=list(task.strings)).holes["s"]
        seconds = time.perf_counter() - started
    finally:
        select_module.TREE_NODES = nodes
    return record.option_probs, seconds  # type: ignore[attr-defined]


def _noise(reference: dict[str, float], draws: int) -> float:
    """The mean distance of `draws` draws from the reference itself (20 trials): below it a
    method's draws cannot be told from the reference."""
    generator = np.random.default_rng(0)
    keys = list(reference)
    probs = np.array([reference[k] for k in keys])
    trials = [generator.multinomial(draws, probs / probs.sum()) / draws for _ in range(20)]
    return round(float(np.mean([0.5 * np.abs(t - probs).sum() for t in trials])), 4)


def _top(p: dict[str, float], count: int = 10) -> dict[str, float]:
    return dict(sorted(p.items(), key=lambda kv: -kv[1])[:count])


def _tv(p: dict[str, float], q: dict[str, float]) -> float:
    return round(0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in {*p, *q}), 4)


def _kl(p: dict[str, float], q: dict[str, float]) -> float:
    """KL(p ‖ q) in nats, p a method's draws or estimate and q the reference: finite, since
    the reference gives every string of the language some probability (the other direction
    is infinite whenever draws miss a string, as 300 draws of 1,440 times do)."""
    return round(sum(v * math.log(v / max(q.get(k, 0.0), 1e-300)) for k, v in p.items()
                     if v > 0), 4)


def _rounded(p: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in p.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--backend", default="llamacpp")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--particles", type=int, nargs="*", default=[4, 16, 64])
    parser.add_argument("--tasks", nargs="*",
                        default=[task.name for task in (*TASKS, *BLOCK_TASKS)])
    parser.add_argument("--genlm-particles", type=int, default=20)
    parser.add_argument("--genlm-runs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8,
                        help="runs at a time (run_many's batch_size), for draws and timing")
    # 16 timed runs of masked sampling are ~2.4 s in all on transformers here, and moved by
    # +-20 % between passes of one sitting (sentence-600's ratio 6.8-9.0x); on 64, 7.3-7.5x.
    parser.add_argument("--timed", type=int, default=64,
                        help="runs on fresh prompts timed for each method's s_per_sample")
    args = parser.parse_args()
    model = qrun.load_model(args.model, backend=args.backend)
    done = []
    for task in TASKS:
        if task.name in args.tasks:
            row = measure(task, model, args.draws, tuple(args.particles), args.batch,
                          args.timed)
            print(json.dumps(row), flush=True)
            if not task.large:  # genlm's reference is computed anew; the large ones: not run
                done.append((task, row["reference"]))
    for block in BLOCK_TASKS:
        if block.name in args.tasks:
            print(json.dumps(measure_block(block, model, args.draws, tuple(args.particles),
                                           args.batch, args.timed)), flush=True)
    python = os.environ.get("QRUN_BENCH_GENLM_PYTHON")
    if python:  # after qrun's runs, so the two never share the CPU
        # genlm-control runs the HF weights in float32: its reference is the transformers
        # backend's (the same weights; llama.cpp's kernels move the log-probabilities a little).
        hf = model
        if args.backend != "transformers":  # only llama.cpp's backend has a close()
            model.close()  # type: ignore[attr-defined]
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
