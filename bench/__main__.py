"""`python -m bench [--workload NAME]... [--json] [--repeat N] [--no-write] [--profile]`: runs
the workloads (default: rpg, longdoc, batch, regex, then the model speed options), prints a
summary (or, with --json, one JSON object keyed by workload) and writes bench/RESULTS.md. A
workload that fails records its error and the others still run."""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from bench.report import machine, write_results
from bench.workloads import WORKLOADS

HERE = Path(__file__).parent
DEFAULT_SUITE = (*WORKLOADS, "speed")
CHOICES = (*WORKLOADS, "speed", "compile")
RESULTS_JSON = HERE / "results.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--workload", action="append", choices=CHOICES,
                   help="run only this workload (repeatable); 'speed' is the model speed "
                        "options, 'compile' the torch.compile trial (minutes; not in the "
                        "default suite)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--repeat", type=int, default=2,
                   help="timed passes of qrun and the ideal replays, fastest kept (default 2)")
    p.add_argument("--naive-repeat", type=int, default=1,
                   help="timed passes of the naive baseline, fastest kept (default 1)")
    p.add_argument("--model", default="smollm2",
                   help="model to load (default smollm2; 'tiny': the random test model, to "
                        "check the harness in seconds)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads for the workloads (default: torch's own, one "
                        "per core); the speed options measure 1 and all cores either way")
    p.add_argument("--no-write", action="store_true",
                   help="do not update bench/RESULTS.md and bench/results.json")
    p.add_argument("--render", action="store_true",
                   help="only rewrite bench/RESULTS.md from bench/results.json")
    p.add_argument("--backend", choices=("transformers", "vllm", "llamacpp"),
                   default="transformers",
                   help="vllm: the workloads on the in-process vLLM backend against raw vLLM "
                        "generate and the transformers backend (bench/vllm_suite.py); "
                        "llamacpp: the same against raw llama.cpp (bench/llamacpp_suite.py)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "q8_0"),
                   help="with --backend vllm: the dtype of both backends (default: qrun's); "
                        "with --backend llamacpp, q8_0: qrun and guidance on the "
                        "re-quantized copy (docs/internals.md §10)")
    p.add_argument("--profile", action="store_true",
                   help="also run qrun once more under cProfile per workload (not timed) and "
                        "print the top functions to stderr")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        write_results(json.loads(RESULTS_JSON.read_text(encoding="utf-8")), HERE / "RESULTS.md")
        return 0
    names = list(dict.fromkeys(args.workload or DEFAULT_SUITE))
    warnings.simplefilter("ignore")
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    def progress(message: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    if args.backend == "vllm":
        return _main_vllm(args, progress)
    if args.backend == "llamacpp":
        return _main_llamacpp(args, progress)

    results: dict[str, Any] = {}
    backend: Any = None
    try:
        import qrun

        started = time.perf_counter()
        if args.model == "tiny":
            from qrun.backends.tiny import load_tiny

            backend = load_tiny()
        else:
            backend = qrun.load_model(args.model)
        progress(f"loaded {backend.name} in {time.perf_counter() - started:.1f} s")
    except Exception:  # noqa: BLE001 - reported, and every workload records it
        error = traceback.format_exc()
        progress(f"cannot load the model:\n{error}")
        for name in names:
            results[name] = {"error": error}
    results["machine"] = machine(backend)

    if backend is not None:
        from bench.naive import NaiveRunner

        plain = _plain_twin(backend, args.model, progress)
        naive = NaiveRunner(plain)
        for name in names:
            started = time.perf_counter()
            try:
                results[name] = _run_one(name, backend, plain, naive, args, progress)
            except Exception:  # noqa: BLE001 - one failing workload must not stop the rest
                results[name] = {"error": traceback.format_exc(), "measured_at": _now()}
            progress(f"{name}: done in {time.perf_counter() - started:.1f} s"
                     + (" (FAILED)" if "error" in results[name] else ""))
            if args.profile and "profile" in results[name]:
                print(results[name]["profile"], file=sys.stderr)

    if not args.no_write:
        merged = _merge(results)
        RESULTS_JSON.write_text(json.dumps(merged, indent=1) + "\n", encoding="utf-8")
        write_results(merged, HERE / "RESULTS.md")
        progress(f"wrote {HERE / 'RESULTS.md'}")
    if args.json:
        print(json.dumps({k: _public(v) for k, v in results.items()}, indent=1))
    else:
        _print_summary(results, names)
    failed = [n for n in names if "error" in results.get(n, {})]
    return 1 if failed else 0


def store_suite(key: str, out: dict[str, Any], progress: Any) -> None:
    """A backend suite's rows merged into results.json under `key`, then RESULTS.md."""
    merged = json.loads(RESULTS_JSON.read_text(encoding="utf-8")) if RESULTS_JSON.exists() \
        else {}
    merged[key] = {**merged.get(key, {}), **out}
    RESULTS_JSON.write_text(json.dumps(merged, indent=1) + "\n", encoding="utf-8")
    write_results(merged, HERE / "RESULTS.md")
    progress(f"wrote {HERE / 'RESULTS.md'}")


def _main_vllm(args: argparse.Namespace, progress: Any) -> int:
    from bench.vllm_suite import run_vllm_suite

    names = [n for n in dict.fromkeys(args.workload or WORKLOADS) if n in WORKLOADS]
    out = run_vllm_suite(names, args.dtype, args.repeat, progress)
    key = f"vllm-{out['machine']['dtype']}"
    if not args.no_write:
        store_suite(key, out, progress)
    return _print_suite(args, names, out, key, key, "vLLM", "vllm")


def _main_llamacpp(args: argparse.Namespace, progress: Any) -> int:
    from bench.llamacpp_suite import run_llamacpp_suite

    names = [n for n in dict.fromkeys(args.workload or WORKLOADS) if n in WORKLOADS]
    out = run_llamacpp_suite(names, args.repeat, progress, args.dtype)
    if not args.no_write:
        # A run with the default thread count, and one per other count (QRUN_LLAMACPP_THREADS):
        # which is faster depends on how busy the machine is (docs/language.md §18).
        given = os.environ.get("QRUN_LLAMACPP_THREADS")
        key = f"llamacpp-{given}threads" if given else "llamacpp"
        store_suite(f"{key}-{args.dtype}" if args.dtype else key, out, progress)
    return _print_suite(args, names, out, "llamacpp", f"llamacpp {out['machine']['dtype']}",
                        "llama.cpp", "llamacpp")


def _print_suite(args: argparse.Namespace, names: list[str], out: dict[str, Any],
                 json_key: str, label: str, engine: str, ratio: str) -> int:
    """A backend suite's results: as JSON under `json_key`, or a line per workload (qrun
    against raw `engine`, and transformers against it: `transformers_over_{ratio}`); exit 1
    when a workload failed."""
    if args.json:
        print(json.dumps({json_key: out}, indent=1))
    else:
        for name in names:
            row = out.get(name, {})
            if "error" in row:
                print(f"{name}: FAILED\n{row['error']}")
                continue
            print(f"{name} ({label}): qrun {row['qrun']['wall_s']:.2f} s, raw {engine} "
                  f"{row['raw']['wall_s']:.2f} s, qrun/raw {row['qrun_over_raw']:.3f} "
                  f"({'PASS' if row['overhead_pass'] else 'MISS'} {row['overhead_target']}), "
                  f"transformers/{engine} {row.get(f'transformers_over_{ratio}')}")
    return 1 if any("error" in out.get(n, {}) for n in names) else 0


def _plain_twin(backend: Any, model: str, progress: Any) -> Any:
    """The loaded model as plain transformers runs it, which is what the ideal, the naive
    baseline and the speed options are defined on (bench/README.md): the backend itself,
    unless qrun packed its linear layers (qrun/backends/packed_linear.py); then the same
    weights loaded a second time without packing."""
    from qrun.backends.packed_linear import PackedLinear

    if not any(isinstance(m, PackedLinear) for m in backend.model.modules()):
        return backend
    import qrun

    before = os.environ.get("QRUN_PACKED_LINEAR")
    os.environ["QRUN_PACKED_LINEAR"] = "0"
    try:
        plain = qrun.load_model(model)
    finally:
        if before is None:
            del os.environ["QRUN_PACKED_LINEAR"]
        else:
            os.environ["QRUN_PACKED_LINEAR"] = before
    progress("loaded the same model without packed layers, for the ideal and the naive runs")
    return plain


def _run_one(name: str, backend: Any, plain: Any, naive: Any, args: argparse.Namespace,
             progress: Any) -> dict[str, Any]:
    if name == "speed":
        from bench.speed import PACKED, probe_tokens, run_speed

        before = [round(x, 2) for x in os.getloadavg()]
        models = {plain.dtype: plain.model, PACKED: backend.model}

        def load(dtype: str) -> Any:
            # A converted copy of the loaded weights: the same as loading with that dtype.
            if dtype not in models:
                models[dtype] = copy.deepcopy(plain.model).to(getattr(torch, dtype))
            return models[dtype]

        out = run_speed(load, probe_tokens(backend), lambda s: progress(f"speed: {s}"),
                        packed=plain is not backend)
        from bench.speed import PACKED
        from qrun.backends.transformers import default_dtype

        dtype = str(default_dtype("cpu")).removeprefix("torch.")
        # The row of what qrun runs: its float32 layers are packed when it packed them.
        out.update(measured_at=_now(), load_avg_before=before,
                   default_dtype=PACKED if dtype == "float32" and plain is not backend else dtype,
                   load_avg_after=[round(x, 2) for x in os.getloadavg()])
        return out
    if name == "compile":
        from bench.speed import run_compile

        progress("compile: torch.compile trial in a child process (minutes)")
        out = run_compile()
        out["measured_at"] = _now()
        return out
    from bench.suite import measure_workload

    return measure_workload(WORKLOADS[name], backend, naive, repeat=args.repeat,
                            naive_repeat=args.naive_repeat, progress=progress,
                            profile=args.profile, plain_model=plain.model)


def _merge(results: dict[str, Any]) -> dict[str, Any]:
    """This run's results over the previous ones, so a partial run keeps the rest (the machine
    details are those of the last run that measured a workload)."""
    merged: dict[str, Any] = {}
    if RESULTS_JSON.exists():
        try:
            merged = json.loads(RESULTS_JSON.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            merged = {}
    ran_workload = any(k in WORKLOADS for k in results)
    merged.update({k: _public(v) for k, v in results.items()
                   if k != "machine" or ran_workload or "machine" not in merged})
    return merged


def _public(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "profile"}
    return value


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _print_summary(results: dict[str, Any], names: list[str]) -> None:
    for name in names:
        row = results.get(name, {})
        if "error" in row:
            print(f"{name}: FAILED\n{row['error']}")
        elif name in WORKLOADS:
            verdicts = "  ".join(
                f"{t['name']}={t['value']} ({t['target']}: {'PASS' if t['pass'] else 'MISS'})"
                for t in row["targets"])
            q = row["qrun"]
            print(f"{name}: qrun {q['wall_s']:.2f} s (model {q['model_s']:.2f}, masks "
                  f"{q['mask_s']:.2f}, rest {q['rest_s']:.2f}), ideal "
                  f"{row['ideal']['wall_s']:.2f} s, naive {row['naive']['wall_s']:.2f} s; "
                  f"context {row['context_tokens']}, forward {row['forward_tokens']}; "
                  f"{verdicts}")
        elif name == "speed":
            from bench.speed import describe

            for config in row.get("configs", []):
                print(f"speed: {describe(config)}")
        elif name == "compile":
            print(f"compile: {json.dumps(row)}")


if __name__ == "__main__":
    sys.exit(main())
