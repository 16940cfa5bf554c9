"""`python -m bench --backend vllm`: the four workloads on the in-process vLLM backend, against
raw vLLM `generate` on the same token sequences and against the transformers backend, all in
one process, one after another.

- **qrun on vLLM**: wall time of `Query.run_many(inputs)` on `load_model(backend="vllm")`.
- **raw vLLM**: qrun's final token ids replayed as a template tool on bare vLLM would run
  them: for every stretch of consecutive positions where the model chose the token (traced
  from the qrun run, bench/ideal.py), one `LLM.generate` on the token ids before it with
  `max_tokens` = the stretch's length (greedy, `ignore_eos`), vLLM's prefix cache on. No
  masks, no template machinery. A token the model wrote inside a healed prefix counts as
  generated (qrun asked the model for it): the same tokens generated, so qrun/raw is qrun's
  own overhead. **raw, healed as prompt** feeds those tokens as prompt text instead (a tool
  without token healing): the difference is what healing costs on vLLM (one step each).
- **qrun on transformers**: the same workload on the transformers backend (same dtype),
  measured first, before vLLM starts (vLLM binds OpenMP threads when it starts).

Each after one warm-up that is not counted; vLLM's prefix cache (and qrun's) emptied before
every timed pass; fastest of `--repeat` passes kept."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import qrun
from bench.ideal import decisions_of
from bench.workloads import Workload
from qrun.errors import QrunError

OVERHEAD_TARGET = 0.10  # qrun on vLLM at most 10 % slower than raw vLLM

Progress = Callable[[str], None]


def run_all(query: qrun.Query, backend: Any,
            inputs: Sequence[Mapping[str, Any]]) -> list[qrun.Result]:
    """`query.run_many(inputs)` on `backend`, raising the first run's error."""
    results = query.run_many(list(inputs), model=backend)
    for r in results:
        if isinstance(r, QrunError):
            raise r
    return [r for r in results if isinstance(r, qrun.Result)]


def row_header(workload: Workload, backend: Any, repeat: int) -> dict[str, Any]:
    """The first keys of a backend suite's row: what ran, when, under what load."""
    return {
        "description": workload.description,
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "load_avg_before": [round(x, 2) for x in os.getloadavg()],
        "runs": len(workload.inputs), "repeat": repeat, "dtype": backend.dtype,
    }


def time_transformers(workload: Workload, backend: Any, repeat: int) -> dict[str, Any]:
    """qrun's wall time on the transformers backend (fastest of `repeat` passes)."""
    query = qrun.Query(workload.template(), f"<bench:{workload.name}>")
    inputs = list(workload.inputs)
    run_all(query, backend, inputs[: workload.warmup_inputs or len(inputs)])
    walls = []
    for _ in range(repeat):
        backend.clear_cache()
        started = time.perf_counter()
        results = run_all(query, backend, inputs)
        walls.append(time.perf_counter() - started)
    return {"wall_s": round(min(walls), 4), "walls_s": [round(w, 4) for w in walls],
            "texts": [r.text for r in results]}


def qrun_figures(wall: float, results: Sequence[qrun.Result], walls: Sequence[float]
                 ) -> dict[str, Any]:
    """A backend suite's "qrun" row: the fastest pass's wall time and summed stats
    (`results`), and every pass's wall time."""
    stats = [r.stats for r in results]
    return {
        "wall_s": round(wall, 4), "walls_s": [round(w, 4) for w in walls],
        "model_s": round(sum(s.model_s for s in stats), 4),
        "mask_s": round(sum(s.mask_s for s in stats), 4),
        **{k: sum(getattr(s, k) for s in stats) for k in (
            "context_tokens", "forward_tokens", "cached_tokens", "forward_calls",
            "generated_tokens")},
    }


def compare(row: dict[str, Any], wall: float, raw: float, results: Sequence[qrun.Result],
            transformers: Mapping[str, Any] | None, backend: str) -> dict[str, Any]:
    """The end of a backend suite's row: qrun against the raw replay (OVERHEAD_TARGET) and
    against qrun on transformers (`transformers_over_BACKEND`, same text), load after."""
    row["qrun_over_raw"] = round(wall / raw, 3)
    row["overhead_target"] = f"<= {1 + OVERHEAD_TARGET:g}"
    row["overhead_pass"] = wall / raw <= 1 + OVERHEAD_TARGET
    if transformers is not None:
        row["transformers"] = {k: v for k, v in transformers.items() if k != "texts"}
        row[f"transformers_over_{backend}"] = round(transformers["wall_s"] / wall, 3)
        texts = transformers["texts"]
        row["same_text_as_transformers"] = (
            f"{sum(a == r.text for a, r in zip(texts, results, strict=True))}/{len(results)}")
    row["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    return row


def stretches(decisions: Sequence[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive decision positions, as (start, length)."""
    out: list[tuple[int, int]] = []
    for position in decisions:
        if out and out[-1][0] + out[-1][1] == position:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((position, 1))
    return out


def replay_raw(backend: Any, runs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> float:
    """Raw vLLM generate calls for every run's stretches; returns the wall time."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def one_pass(llm: Any) -> float:
        started = time.perf_counter()
        for token_ids, decisions in runs:
            for start, length in stretches(decisions):
                params = SamplingParams(max_tokens=length, temperature=0.0, ignore_eos=True,
                                        detokenize=False)
                llm.generate([TokensPrompt(prompt_token_ids=list(token_ids[:start]))],
                             params, use_tqdm=False)
        return time.perf_counter() - started

    # In the engine's own thread, as qrun's requests run (vLLM binds that thread's OpenMP).
    wall: float = backend.hub.call(one_pass)
    return wall


def measure_vllm(workload: Workload, backend: Any, transformers: Mapping[str, Any] | None,
                 repeat: int = 2, progress: Progress = lambda s: None) -> dict[str, Any]:
    """qrun on vLLM and raw vLLM (alternating, fastest of `repeat` passes each)."""
    row = row_header(workload, backend, repeat)
    query = qrun.Query(workload.template(), f"<bench:{workload.name}>")
    inputs = list(workload.inputs)
    progress(f"{workload.name}: qrun on vLLM, warm-up")
    run_all(query, backend, inputs[: workload.warmup_inputs or len(inputs)])
    qrun_passes: list[tuple[float, list[qrun.Result]]] = []
    raw_walls: list[float] = []
    unhealed_walls: list[float] = []
    runs: list[tuple[list[int], list[int]]] = []
    unhealed: list[tuple[list[int], list[int]]] = []

    def time_qrun() -> None:
        backend.clear_cache()
        started = time.perf_counter()
        results = run_all(query, backend, inputs)
        qrun_passes.append((time.perf_counter() - started, results))
        if not runs:
            runs[:] = [(list(r.token_ids), decisions_of(r, healed=True)) for r in results]
            unhealed[:] = [(list(r.token_ids), decisions_of(r)) for r in results]
            replay_raw(backend, runs[:1])  # the raw replay's own warm-up

    def time_raw() -> None:
        backend.clear_cache()
        raw_walls.append(replay_raw(backend, runs))
        backend.clear_cache()
        unhealed_walls.append(replay_raw(backend, unhealed))

    for attempt in range(repeat):
        progress(f"{workload.name}: qrun on vLLM and raw vLLM, pass {attempt + 1}/{repeat}")
        for measure in (time_qrun, time_raw) if attempt % 2 == 0 else (time_raw, time_qrun):
            measure()
    wall, results = min(qrun_passes, key=lambda p: p[0])
    raw = min(raw_walls)
    row["qrun"] = qrun_figures(wall, results, [w for w, _ in qrun_passes])
    row["raw"] = {"wall_s": round(raw, 4), "walls_s": [round(w, 4) for w in raw_walls],
                  "requests": sum(len(stretches(d)) for _, d in runs),
                  "generated_tokens": sum(len(d) for _, d in runs)}
    row["raw_healed_as_prompt"] = {
        "wall_s": round(min(unhealed_walls), 4),
        "walls_s": [round(w, 4) for w in unhealed_walls],
        "requests": sum(len(stretches(d)) for _, d in unhealed),
        "generated_tokens": sum(len(d) for _, d in unhealed)}
    row["qrun_over_raw_healed_as_prompt"] = round(wall / min(unhealed_walls), 3)
    return compare(row, wall, raw, results, transformers, "vllm")


def run_vllm_suite(names: Sequence[str], dtype: str | None, repeat: int,
                   progress: Progress) -> dict[str, Any]:
    """Every named workload on the transformers backend, then on vLLM (one process)."""
    from bench.report import machine
    from bench.workloads import WORKLOADS

    out: dict[str, Any] = {}
    transformers_backend = qrun.load_model("smollm2", dtype=dtype)
    progress(f"transformers backend loaded ({transformers_backend.dtype})")
    reference: dict[str, dict[str, Any]] = {}
    for name in names:
        progress(f"{name}: qrun on transformers")
        reference[name] = time_transformers(WORKLOADS[name], transformers_backend, repeat)
    del transformers_backend
    backend = qrun.load_model("smollm2", backend="vllm", dtype=dtype)
    progress(f"vLLM backend loaded in {backend.load_s:.1f} s ({backend.dtype})")
    out["machine"] = {**machine(None), "dtype": backend.dtype, "vllm": _vllm_version(),
                      "vllm_load_s": round(backend.load_s, 2)}
    for name in names:
        try:
            out[name] = measure_vllm(WORKLOADS[name], backend, reference.get(name), repeat,
                                     progress)
        except Exception:  # noqa: BLE001 - one failing workload must not stop the rest
            import traceback

            out[name] = {"error": traceback.format_exc()}
    backend.close()
    return out


def _vllm_version() -> str:
    import vllm

    return str(vllm.__version__)
