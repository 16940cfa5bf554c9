"""Measuring one workload: qrun's wall time and split, the ideal replay of its final tokens, the
naive re-encoding baseline, and the ratios against the issue's targets. All in this process,
one after another, each after one warm-up that is not counted."""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import qrun
from bench.ideal import (
    Replay,
    decisions_of,
    healed_resampled,
    replay,
    replay_runs,
    replay_shared_prefix,
)
from bench.naive import NaiveRun, NaiveRunner, values_agree
from bench.workloads import Gen, Select, Workload
from qrun.errors import QrunError

# (key, label, workloads it applies to, comparison, bound)
TARGETS: tuple[tuple[str, str, tuple[str, ...], str, float], ...] = (
    ("forward_over_context", "forward/context", ("rpg", "longdoc", "regex"), "<=", 1.02),
    ("qrun_over_ideal", "qrun/ideal", ("rpg", "longdoc", "batch", "regex"), "<=", 1.15),
    ("naive_over_qrun", "naive/qrun", ("longdoc",), ">=", 3.0),
    # issue #13, with speculation (qrun's default): below the ideal's one forward per decision
    ("qrun_over_ideal", "qrun/ideal (#13)", ("longdoc", "regex"), "<=", 0.6),
    ("qrun_over_ideal", "qrun/ideal (#13)", ("rpg",), "<=", 0.8),
)

Progress = Callable[[str], None]


def check_targets(name: str, row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The targets that apply to workload `name`, each with its value and verdict."""
    out = []
    for key, label, names, op, bound in TARGETS:
        if name not in names:
            continue
        value = row.get(key)
        ok = value is not None and (value <= bound if op == "<=" else value >= bound)
        out.append({"name": label, "target": f"{op} {bound:g}", "value": value,
                    "pass": bool(ok)})
    return out


def _clear_prefix_cache(backend: Any) -> None:
    # The backend's prefix cache would serve a repeated run with no forward at all; every
    # timed pass starts from an empty one (runs within a pass still share it: batch's prefix).
    backend.clear_cache()


def _run_qrun(
    query: qrun.Query, backend: Any, inputs: Sequence[Mapping[str, Any]], speculate: bool = True
) -> list[qrun.Result]:
    results = query.run_many(list(inputs), model=backend, speculate=speculate)
    for r in results:
        if isinstance(r, QrunError):
            raise r
    return [r for r in results if isinstance(r, qrun.Result)]


def measure_workload(
    workload: Workload, backend: Any, naive: NaiveRunner, repeat: int = 2,
    naive_repeat: int = 1, progress: Progress = lambda s: None, profile: bool = False,
    plain_model: Any = None,
) -> dict[str, Any]:
    """Measure one workload: `repeat` passes of qrun and the ideal replays (alternating
    their order), then `naive_repeat` naive passes; the fastest pass of each is kept. Raises
    whatever fails (the caller records it).

    The ideal replays `plain_model`: the backend's weights as plain transformers runs them
    (default: the backend's own model). When qrun runs a model of its own making (packed
    linear layers, qrun/backends/packed_linear.py), the ideal is also replayed on that model,
    so the report can tell what the layers bring from what the runtime brings."""
    plain_model = backend.model if plain_model is None else plain_model
    own_layers = plain_model is not backend.model
    row: dict[str, Any] = {
        "description": workload.description,
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "load_avg_before": [round(x, 2) for x in os.getloadavg()],
        "runs": len(workload.inputs),
        "repeat": repeat,
        "naive_repeat": naive_repeat,
    }
    inputs = list(workload.inputs)
    warm = inputs[: workload.warmup_inputs or len(inputs)]
    query = qrun.Query(workload.template(), f"<bench:{workload.name}>")

    progress(f"{workload.name}: qrun warm-up ({len(warm)} run(s))")
    _run_qrun(query, backend, warm)

    qrun_passes: list[tuple[float, list[qrun.Result]]] = []
    ideal_walls: list[float] = []
    runs: list[tuple[list[int], list[int]]] = []
    ideal = Replay()

    def time_qrun() -> None:
        _clear_prefix_cache(backend)
        started = time.perf_counter()
        results = _run_qrun(query, backend, inputs)
        qrun_passes.append((time.perf_counter() - started, results))
        if not runs:  # the first pass: where the model decided, for the ideal
            runs[:] = [(list(r.token_ids), decisions_of(r)) for r in results]
            row["healed_tokens_resampled"] = sum(healed_resampled(r) for r in results)
            progress(f"{workload.name}: ideal warm-up")
            ids, dec = runs[0]
            replay(plain_model, ids, dec[:3])
            if own_layers:
                replay(backend.model, ids, dec[:3])

    plain_passes: list[tuple[float, list[qrun.Result]]] = []

    def time_plain() -> None:  # qrun without speculation: the same output, more forwards
        _clear_prefix_cache(backend)
        started = time.perf_counter()
        results = _run_qrun(query, backend, inputs, speculate=False)
        plain_passes.append((time.perf_counter() - started, results))

    def time_ideal() -> None:
        nonlocal ideal
        ideal = replay_runs(plain_model, runs)
        ideal_walls.append(ideal.wall_s)

    own_walls: list[float] = []

    def time_own_layers() -> None:  # the ideal on qrun's own model (packed layers)
        own_walls.append(replay_runs(backend.model, runs).wall_s)

    # Several runs (batch): also the ideal that computes their common prefix once.
    shared_walls: list[float] = []
    shared, shared_prefix = Replay(), 0

    def time_shared() -> None:
        nonlocal shared, shared_prefix
        shared, shared_prefix = replay_shared_prefix(plain_model, runs)
        shared_walls.append(shared.wall_s)

    for attempt in range(repeat):
        progress(f"{workload.name}: qrun and ideal replays, pass {attempt + 1}/{repeat}")
        # Alternate the order, so a drift in the machine's load does not favour one side.
        order: tuple[Callable[[], None], ...] = (time_qrun, time_ideal, time_plain)
        if len(inputs) > 1:
            order += (time_shared,)
        if own_layers:
            order += (time_own_layers,)
        for measure in order if attempt % 2 == 0 else reversed(order):
            measure()

    progress(f"{workload.name}: naive warm-up")
    _naive_warmup(workload, naive, inputs[0])
    naive_walls: list[float] = []
    naive_runs: list[NaiveRun] = []
    for attempt in range(naive_repeat):
        progress(f"{workload.name}: naive ({len(inputs)} run(s)), pass "
                 f"{attempt + 1}/{naive_repeat}")
        naive_runs = [naive.run(workload.steps(inp)) for inp in inputs]
        naive_walls.append(sum(n.wall_s for n in naive_runs))

    qrun_wall, results = min(qrun_passes, key=lambda p: p[0])
    qrun_walls = [w for w, _ in qrun_passes]
    plain_wall, plain_results = min(plain_passes, key=lambda p: p[0])
    stats = [r.stats for r in results]
    model_s = sum(s.model_s for s in stats)
    mask_s = sum(s.mask_s for s in stats)
    context = sum(s.context_tokens for s in stats)
    forward = sum(s.forward_tokens for s in stats)
    row["context_tokens"] = context
    row["forward_tokens"] = forward
    # Encoding every position once is a property of the run without guesses: speculation adds
    # the guessed positions the model did not choose (drafted - accepted, reported apart).
    plain_forward = sum(r.stats.forward_tokens for r in plain_results)
    row["forward_over_context"] = round(plain_forward / context, 4)
    row["speculation"] = {
        "off_wall_s": round(plain_wall, 4),
        "off_walls_s": [round(w, 4) for w, _ in plain_passes],
        "off_forward_calls": sum(r.stats.forward_calls for r in plain_results),
        "on_forward_calls": sum(s.forward_calls for s in stats),
        "drafted_tokens": sum(s.drafted_tokens for s in stats),
        "accepted_tokens": sum(s.accepted_tokens for s in stats),
        "same_text": sum(a.text == b.text for a, b in zip(results, plain_results, strict=True)),
        "off_over_ideal": 0.0,
    }
    row["qrun"] = {
        "wall_s": round(qrun_wall, 4),
        "walls_s": [round(w, 4) for w in qrun_walls],
        "model_s": round(model_s, 4),
        "mask_s": round(mask_s, 4),
        "rest_s": round(qrun_wall - model_s - mask_s, 4),
        **{k: sum(getattr(s, k) for s in stats) for k in (
            "forward_calls", "prompt_tokens", "generated_tokens", "forced_tokens",
            "rollback_tokens", "healed_tokens", "boundary_kept", "cached_tokens")},
    }
    row["ideal"] = {**ideal.to_dict(), "wall_s": round(min(ideal_walls), 4),
                    "walls_s": [round(w, 4) for w in ideal_walls]}
    if own_walls:
        row["ideal_own_layers"] = {"wall_s": round(min(own_walls), 4),
                                   "walls_s": [round(w, 4) for w in own_walls]}
    row["naive"] = {
        "wall_s": round(min(naive_walls), 4),
        "walls_s": [round(w, 4) for w in naive_walls],
        "forward_calls": sum(n.forward_calls for n in naive_runs),
        "forward_tokens": sum(n.forward_tokens for n in naive_runs),
        "generate_calls": sum(n.generate_calls for n in naive_runs),
    }
    if shared_walls:
        row["ideal_shared_prefix"] = {**shared.to_dict(), "prefix_tokens": shared_prefix,
                                      "wall_s": round(min(shared_walls), 4),
                                      "walls_s": [round(w, 4) for w in shared_walls]}
        row["qrun_over_ideal_shared_prefix"] = round(qrun_wall / min(shared_walls), 3)
    row["qrun_over_ideal"] = round(qrun_wall / row["ideal"]["wall_s"], 3)
    row["speculation"]["off_over_ideal"] = round(plain_wall / row["ideal"]["wall_s"], 3)
    row["naive_over_qrun"] = round(row["naive"]["wall_s"] / qrun_wall, 3)
    agree = [values_agree(n.values, r.vars) for n, r in zip(naive_runs, results, strict=True)]
    row["naive_values_agree"] = f"{sum(a for a, _ in agree)}/{sum(b for _, b in agree)}"
    row["template_consistent"] = all(
        workload.render(inp, r.vars) == r.text for inp, r in zip(inputs, results, strict=True))
    row["sample"] = {k: v for k, v in results[0].vars.items() if not k.endswith("__logprobs")}
    row["targets"] = check_targets(workload.name, row)
    row["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    if profile:
        progress(f"{workload.name}: qrun under cProfile (not timed)")
        _clear_prefix_cache(backend)
        profiler = cProfile.Profile()
        profiler.enable()
        _run_qrun(query, backend, inputs)
        profiler.disable()
        row["profile"] = _profile_summary(profiler)
    return row


def _naive_warmup(workload: Workload, naive: NaiveRunner, inputs: Mapping[str, Any]) -> None:
    # Up to and including the first hole, and every regex index built (qrun's warm-up built
    # its own).
    steps = workload.steps(inputs)
    first = next(i for i, s in enumerate(steps) if isinstance(s, Gen | Select))
    naive.run(steps[: first + 1])
    for step in steps:
        if isinstance(step, Gen) and step.pattern is not None:
            naive.indexes.get(step.pattern, naive.backend.vocabulary)


def _profile_summary(profiler: cProfile.Profile, limit: int = 30) -> str:
    buffer = io.StringIO()
    stats = pstats.Stats(profiler, stream=buffer)
    stats.sort_stats("tottime").print_stats(limit)
    return buffer.getvalue()
