"""`python -m bench --backend llamacpp`: the four workloads on the llamacpp backend, against
raw llama.cpp replaying the same token sequences and against the transformers backend, all in
one process, one after another.

- **qrun on llama.cpp**: wall time of `Query.run_many(inputs)` on
  `load_model(backend="llamacpp")` (the shipped Q4_1 GGUF).
- **raw llama.cpp**: qrun's final token ids replayed as a template tool on bare llama.cpp
  would run them, through the same ctypes calls (backends/llamacpp_api.py) on a context of
  its own: per run one sequence whose KV cache is kept across segments (and what it shares
  with the previous run's tokens is kept too, a one-entry prefix cache); for every stretch of
  consecutive positions where the model chose the token (bench/ideal.py), the text before it
  is fed in one decode, then each chosen token is read off the logits (argmax) and fed back,
  one decode per token. No masks, no template machinery: qrun/raw is qrun's own overhead.
- **qrun on transformers**: the same workload on the transformers backend (its default
  dtype), measured first.
- **guidance on llama.cpp** (when QRUN_BENCH_GUIDANCE_PYTHON names a Python with guidance, e.g.
  the one scripts/guidance-venv.sh makes): the same workload as guidance programs on the same
  GGUF file and thread count, in that Python (bench/guidance_runner.py, kept running and
  asked for one pass at a time), its passes in turn with qrun's and raw llama.cpp's.

Each after one warm-up that is not counted; the prefix caches emptied before every timed
pass; fastest of `--repeat` passes kept."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import qrun
from bench.ideal import decisions_of
from bench.vllm_suite import (
    Progress,
    compare,
    qrun_figures,
    row_header,
    run_all,
    stretches,
    time_transformers,
)
from bench.workloads import Workload


def replay_raw(backend: Any, runs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> float:
    """Raw llama.cpp decodes for every run's stretches; returns the wall time."""
    from qrun.backends.llama_threads import llama_threads
    from qrun.backends.llamacpp_api import Batch, Context

    context = Context(backend.model, 8192, 1, 2048, llama_threads())
    try:
        started = time.perf_counter()
        previous: Sequence[int] = ()
        for token_ids, decisions in runs:
            parts = stretches(decisions)
            # What the previous run fed and this one shares stays (a one-entry prefix cache),
            # short of the first choice's position, whose logits must be computed again.
            fed = _common(previous, token_ids, parts[0][0] - 1 if parts else 0)
            context.seq_rm(0, fed)
            previous = token_ids
            for start, length in parts:
                if start > fed:
                    batch = Batch(start - fed)
                    batch.add(list(token_ids[fed:start]), fed, 0, 1)
                    _decode(context, batch)
                for position in range(start, start + length):
                    np.argmax(context.logits(1)[0])  # the choice a greedy tool makes
                    batch = Batch(1)
                    batch.add([token_ids[position]], position, 0, 1)
                    _decode(context, batch)
                fed = start + length
        return time.perf_counter() - started
    finally:
        context.close()


def _common(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = 0
    while n < min(len(a), len(b), limit) and a[n] == b[n]:
        n += 1
    return max(0, n)


def _decode(context: Any, batch: Any) -> None:
    code = context.decode(batch)
    if code != 0:
        raise RuntimeError(f"llama_decode returned {code}")


def measure_llamacpp(workload: Workload, backend: Any, transformers: dict[str, Any] | None,
                     repeat: int = 2, progress: Progress = lambda s: None,
                     peer: GuidancePeer | None = None) -> dict[str, Any]:
    """qrun on llama.cpp, raw llama.cpp and, with `peer`, guidance on llama.cpp: their passes
    in turn (the order rotating from one round to the next), fastest of `repeat` each."""
    row = row_header(workload, backend, repeat)
    query = qrun.Query(workload.template(), f"<bench:{workload.name}>")
    inputs = list(workload.inputs)
    progress(f"{workload.name}: qrun on llama.cpp, warm-up")
    run_all(query, backend, inputs[: workload.warmup_inputs or len(inputs)])
    passes: list[tuple[float, list[qrun.Result]]] = []
    raw_walls: list[float] = []
    runs: list[tuple[list[int], list[int]]] = []

    def time_qrun() -> None:
        backend.clear_cache()
        started = time.perf_counter()
        results = run_all(query, backend, inputs)
        passes.append((time.perf_counter() - started, results))
        if not runs:
            runs[:] = [(list(r.token_ids), decisions_of(r, healed=True)) for r in results]
            replay_raw(backend, runs[:1])  # the raw replay's own warm-up

    def time_raw() -> None:
        raw_walls.append(replay_raw(backend, runs))

    guided: list[dict[str, Any]] = []

    def time_guidance() -> None:
        assert peer is not None
        guided.append(peer.run(workload.name))

    measures = [time_qrun, time_raw]
    if peer is not None:
        progress(f"{workload.name}: guidance on llama.cpp, warm-up")
        warm = peer.run(workload.name, warmup=True)
        measures.append(time_guidance)
    for attempt in range(repeat):
        progress(f"{workload.name}: {len(measures)} ways, pass {attempt + 1}/{repeat}")
        turn = attempt % len(measures)  # round 0 starts with qrun: raw replays its tokens
        for measure in [*measures[turn:], *measures[:turn]]:
            measure()
    wall, results = min(passes, key=lambda p: p[0])
    raw = min(raw_walls)
    row["qrun"] = qrun_figures(wall, results, [w for w, _ in passes])
    row["qrun"]["generated_per_s"] = round(row["qrun"]["generated_tokens"] / wall, 2)
    row["raw"] = {"wall_s": round(raw, 4), "walls_s": [round(w, 4) for w in raw_walls],
                  "decodes": sum(len(stretches(d)) + len(d) for _, d in runs),
                  "generated_tokens": sum(len(d) for _, d in runs)}
    row = compare(row, wall, raw, results, transformers, "llamacpp")
    if peer is not None:
        row["guidance"] = _guidance_row(workload, peer, [warm, *guided])
        if "wall_s" in row["guidance"]:
            row["qrun_over_guidance"] = round(wall / row["guidance"]["wall_s"], 3)
            best = min(wall, (transformers or {}).get("wall_s") or wall)
            row["best_over_guidance"] = round(best / row["guidance"]["wall_s"], 3)
    return row


def _guidance_row(workload: Workload, peer: GuidancePeer, answers: list[dict[str, Any]]
                  ) -> dict[str, Any]:
    """guidance's figures from its warm-up and its passes: fastest pass, every pass, and how
    many of its regex values are valid; or the first error."""
    errors = [a["error"] for a in answers if "error" in a]
    if errors:
        return {"error": errors[0], "version": peer.version}
    walls = [a["wall_s"] for a in answers[1:]]
    return {"wall_s": min(walls), "walls_s": walls, "values": answers[-1]["values"],
            "version": peer.version,
            "constrained_values_valid": _valid(workload, answers[-1]["values"])}


def run_llamacpp_suite(names: Sequence[str], repeat: int, progress: Progress,
                       dtype: str | None = None) -> dict[str, Any]:
    """Every named workload on the transformers backend, then on llama.cpp (one process):
    the shipped GGUF, or with `dtype` q8_0 its re-quantized copy, which guidance then runs
    too (qrun/backends/requantize.py)."""
    from bench.report import machine
    from bench.workloads import WORKLOADS
    from qrun.backends.llama_threads import llama_threads

    out: dict[str, Any] = {}
    transformers_backend = qrun.load_model("smollm2")
    progress(f"transformers backend loaded ({transformers_backend.dtype})")
    reference: dict[str, dict[str, Any]] = {}
    for name in names:
        progress(f"{name}: qrun on transformers")
        reference[name] = time_transformers(WORKLOADS[name], transformers_backend, repeat)
        reference[name]["transformers_dtype"] = transformers_backend.dtype
    del transformers_backend
    backend = qrun.load_model("smollm2", backend="llamacpp", dtype=dtype)
    progress(f"llamacpp backend loaded in {backend.load_s:.1f} s ({backend.dtype})")
    out["machine"] = {**machine(None), "dtype": backend.dtype, "llamacpp": _version(),
                      "llamacpp_load_s": round(backend.load_s, 2),
                      "threads": llama_threads()}
    python = os.environ.get("QRUN_BENCH_GUIDANCE_PYTHON")
    peer = GuidancePeer(python, names, out["machine"]["threads"], dtype) if python else None
    if peer is not None:
        progress(f"guidance on llama.cpp ({python}, guidance {peer.version}): alternating")
    try:
        for name in names:
            try:
                out[name] = measure_llamacpp(WORKLOADS[name], backend, reference.get(name),
                                             repeat, progress, peer)
            except Exception:  # noqa: BLE001 - one failing workload must not stop the rest
                import traceback

                out[name] = {"error": traceback.format_exc()}
    finally:
        if peer is not None:
            peer.close()
        backend.close()
    return out


class GuidancePeer:
    """guidance on llama.cpp, serving passes on request: bench/guidance_runner.py kept running
    in `python` (guidance's own environment), so its passes can alternate with qrun's."""

    def __init__(self, python: str, names: Sequence[str], threads: int,
                 dtype: str | None = None) -> None:
        from bench.workloads import WORKLOADS
        from qrun.backends import locate_model
        from qrun.backends.requantize import requantized

        location = locate_model("smollm2")
        gguf = Path(location.path) / str(location.gguf_file)
        if dtype is not None:  # the same weights as qrun's
            gguf = requantized(gguf, dtype)
        programs = {name: [_steps_json(WORKLOADS[name].steps(inputs))
                           for inputs in WORKLOADS[name].inputs] for name in names}
        job = {"gguf": str(gguf), "threads": threads,
               "n_ctx": 4096, "programs": programs}
        self.version = _guidance_version(python)
        runner = Path(__file__).with_name("guidance_runner.py")
        self._process = subprocess.Popen([python, str(runner)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True)
        self._send(job)

    def _send(self, message: dict[str, Any]) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(message) + "\n")
        self._process.stdin.flush()

    def run(self, workload: str, warmup: bool = False) -> dict[str, Any]:
        """One pass of `workload` (its first input only for a warm-up): {"wall_s", "values"},
        or {"error"} (also when the runner has died)."""
        assert self._process.stdout is not None
        try:
            self._send({"workload": workload, "warmup": warmup})
            line = self._process.stdout.readline()
        except OSError as exc:
            return {"error": f"guidance runner: {exc}"}
        if not line:
            stderr = self._process.stderr.read() if self._process.stderr else ""
            return {"error": f"guidance runner ended: {stderr[-3000:]}"}
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()


def _valid(workload: Workload, values: dict[str, Any]) -> str:
    """How many of the first run's regex-constrained values fully match their regex (qrun's
    always do), as "k/n"."""
    import regex

    holes = [s for s in workload.steps(workload.inputs[0])
             if getattr(s, "pattern", None) is not None]
    good = sum(1 for s in holes if isinstance(values.get(s.name), str)
               and regex.fullmatch(s.pattern, values[s.name], flags=regex.ASCII) is not None)
    return f"{good}/{len(holes)}"


def _steps_json(steps: Sequence[Any]) -> list[dict[str, Any]]:
    from bench.workloads import Gen, Text

    out: list[dict[str, Any]] = []
    for step in steps:
        if isinstance(step, Text):
            out.append({"text": step.text})
        elif isinstance(step, Gen):
            out.append({"gen": step.name, "regex": step.pattern, "stop": list(step.stop),
                        "max_tokens": step.max_tokens})
        else:
            out.append({"select": step.name, "options": list(step.options)})
    return out


def _guidance_version(python: str) -> str:
    done = subprocess.run([python, "-c", "import guidance; print(guidance.__version__)"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def _version() -> str:
    from importlib.metadata import version

    return version("llama_cpp_python")
