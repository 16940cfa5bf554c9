"""The model's own speed options on this machine: prefill tokens/s and decode ms/token at ~256
and ~1k context, for float32 vs bfloat16, 1 vs all torch threads, inference_mode vs no_grad vs
plain autograd, DynamicCache vs StaticCache; and torch.compile (inductor) in a child process
with a time limit, since compiling takes minutes on a 2-core CPU (`--workload compile`).

Run alone: python -m bench --workload speed   (or: python -m bench.speed compile)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from qrun.backends.transformers import cache_argument

CONTEXTS = (256, 1024)
DECODE_STEPS = 12
PREFILL_REPEATS = {256: 3, 1024: 2}
COMPILE_TIMEOUT_S = 420


def _grad_mode(mode: str) -> contextlib.AbstractContextManager[Any]:
    if mode == "inference_mode":
        return torch.inference_mode()
    if mode == "no_grad":
        return torch.no_grad()
    return contextlib.nullcontext()


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _new_cache(model: Any, kind: str, length: int) -> Any:
    from transformers import DynamicCache, StaticCache

    if kind == "static":
        return StaticCache(config=model.config, max_cache_len=length)
    return DynamicCache(config=model.config)


def _forward(model: Any, ids: Sequence[int], cache: Any, start: int, fn: Any = None) -> int:
    input_ids = torch.tensor([list(ids)])
    positions = torch.arange(start, start + len(ids))
    out = (model if fn is None else fn)(input_ids=input_ids, **{cache_argument(model): cache},
                                        use_cache=True, cache_position=positions,
                                        position_ids=positions[None], logits_to_keep=1)
    return int(out.logits[0, -1].argmax())


def measure(
    model: Any, token_ids: Sequence[int], ctx: int, grad: str = "inference_mode",
    cache_kind: str = "dynamic", fn: Any = None, repeats: int | None = None,
) -> dict[str, float]:
    """Prefill `ctx` tokens (median of a few, tokens/s), then decode DECODE_STEPS greedy tokens
    one forward each (median ms/token)."""
    repeats = repeats or PREFILL_REPEATS.get(ctx, 2)
    prefill: list[float] = []
    with _grad_mode(grad):
        for _ in range(repeats):
            cache = _new_cache(model, cache_kind, ctx + DECODE_STEPS + 1)
            started = time.perf_counter()
            token = _forward(model, token_ids[:ctx], cache, 0, fn)
            prefill.append(time.perf_counter() - started)
        steps: list[float] = []
        for i in range(DECODE_STEPS):
            started = time.perf_counter()
            token = _forward(model, [token], cache, ctx + i, fn)
            steps.append(time.perf_counter() - started)
    return {
        "prefill_tok_s": round(ctx / statistics.median(prefill), 1),
        "prefill_s": round(statistics.median(prefill), 4),
        "decode_ms": round(1000 * statistics.median(steps), 2),
        "decode_ms_min": round(1000 * min(steps), 2),
    }


PACKED = "float32 packed"
"""The pseudo-dtype of qrun's own model: float32 with oneDNN-packed linear layers
(qrun/backends/packed_linear.py)."""


def _configs(all_threads: int, run_threads: int, packed: bool = False) -> list[dict[str, Any]]:
    """dtype x {all cores, 1 thread} (qrun's packed float32 layers too, with `packed`); then
    grad modes and the static cache at the thread count the workloads ran with."""
    base = {"dtype": "float32", "threads": all_threads, "grad": "inference_mode",
            "cache": "dynamic"}
    here = {**base, "threads": run_threads}
    configs = [
        base,
        {**base, "threads": 1},
        {**base, "dtype": "bfloat16"},
        {**base, "dtype": "bfloat16", "threads": 1},
        {**here, "grad": "no_grad"},
        {**here, "grad": "none (autograd on)"},
        {**here, "cache": "static"},
    ]
    if packed:
        configs[2:2] = [{**base, "dtype": PACKED}, {**base, "dtype": PACKED, "threads": 1}]
    unique: list[dict[str, Any]] = []
    for config in configs:
        if config not in unique:
            unique.append(config)
    return unique


def run_speed(
    load: Callable[[str], Any], token_ids: Sequence[int],
    progress: Callable[[str], None] = lambda s: None, packed: bool = False,
) -> dict[str, Any]:
    """Measure every configuration; `load(dtype)` gives the model in that dtype (or, for
    PACKED, qrun's packed model). Errors are recorded per configuration, not raised."""
    threads = os.cpu_count() or torch.get_num_threads()
    run_threads = torch.get_num_threads()
    models: dict[str, Any] = {}
    rows = []
    for config in _configs(threads, run_threads, packed):
        row: dict[str, Any] = dict(config)
        try:
            if config["dtype"] not in models:
                models[config["dtype"]] = load(config["dtype"])
            model = models[config["dtype"]]
            with _threads(config["threads"]):
                measure(model, token_ids, 32, config["grad"], config["cache"], repeats=1)
                for ctx in CONTEXTS:
                    row[str(ctx)] = measure(model, token_ids, ctx, config["grad"],
                                            config["cache"])
        except Exception as exc:  # noqa: BLE001 - a failing option is a result too
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
        progress(describe(row))
    return {"threads_all": threads, "threads_run": run_threads, "decode_steps": DECODE_STEPS,
            "configs": rows}


def describe(row: dict[str, Any]) -> str:
    name = f"{row['dtype']} threads={row['threads']} {row['grad']} {row['cache']}"
    if "error" in row:
        return f"{name}: {row['error']}"
    parts = [f"{ctx}: prefill {row[str(ctx)]['prefill_tok_s']} tok/s, decode "
             f"{row[str(ctx)]['decode_ms']} ms" for ctx in CONTEXTS if str(ctx) in row]
    return f"{name}: " + "; ".join(parts)


# --- torch.compile, in a child process ------------------------------------------------------


def run_compile(timeout_s: int = COMPILE_TIMEOUT_S) -> dict[str, Any]:
    """torch.compile (inductor, static cache) vs eager, measured in a child process (with this
    process's torch thread count) killed after `timeout_s`; a timeout or failure is recorded
    with its reason."""
    started = time.perf_counter()
    threads = str(torch.get_num_threads())
    # Its own process group, so inductor's compile workers go down with it on a timeout.
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.speed", "compile", threads], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    try:
        stdout, stderr = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return {"skipped": f"compiling did not finish within {timeout_s} s on this machine",
                "wall_s": round(time.perf_counter() - started, 1)}
    done = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"skipped": f"torch.compile failed (exit {done.returncode}): {' | '.join(tail)}",
                "wall_s": round(time.perf_counter() - started, 1)}
    result: dict[str, Any] = json.loads(lines[-1])
    result["wall_s"] = round(time.perf_counter() - started, 1)
    return result


def _compile_child(threads: int) -> None:
    import warnings

    import qrun

    warnings.simplefilter("ignore")
    torch.set_num_threads(threads)
    os.environ["QRUN_PACKED_LINEAR"] = "0"  # compile plain transformers' layers
    backend: Any = qrun.load_model("smollm2")
    model = backend.model
    ids = probe_tokens(backend)
    ctx = 256
    out: dict[str, Any] = {"context": ctx, "threads": threads}
    out["eager_dynamic"] = measure(model, ids, ctx)
    out["eager_static"] = measure(model, ids, ctx, cache_kind="static")
    compiled = torch.compile(model, dynamic=False)
    started = time.perf_counter()
    measure(model, ids, ctx, cache_kind="static", fn=compiled, repeats=1)  # compiles
    out["compile_s"] = round(time.perf_counter() - started, 1)
    out["compiled_static"] = measure(model, ids, ctx, cache_kind="static", fn=compiled)
    print(json.dumps(out), flush=True)


def probe_tokens(backend: Any) -> list[int]:
    from bench.workloads import LONGDOC

    ids: list[int] = backend.encode(str(LONGDOC.inputs[0]["document"]))
    assert len(ids) > max(CONTEXTS) + DECODE_STEPS
    return ids


if __name__ == "__main__":
    if sys.argv[1:2] == ["compile"]:
        _compile_child(int(sys.argv[2]) if len(sys.argv) > 2 else torch.get_num_threads())
    else:
        sys.exit("usage: python -m bench.speed compile   (the full suite: python -m bench)")
