"""What a batch costs on each backend (issue #37), and what the llama.cpp q8_0 copy costs in
fidelity, in one run:

    python -m bench.forward_cost [--backends transformers,llamacpp,llamacpp:q8_0]
                                 [--repeat 7] [--no-fidelity] [--no-cost]
                                 [--save-reference DIR | --against DIR]

Cost: one forward of N rows (N = 1, 4, 8, 16), each row one new token on its own 64-token
context, against N one-row forwards of the same kind (median of --repeat, fresh tokens each
time); what each drafted token adds to a one-token forward (1 + 4 tokens on one context: the
backend's draft_cost); a 512-token prompt fed in one forward. Fidelity (`llamacpp:q8_0`
against the shipped GGUF): mean and p99 KL of the next-token distributions over 2,048 tokens
of docs/language.md, top-1 agreement, and the greedy outputs of every example template (the
cases of examples/NAME.tests.yaml) and of the bench workloads (their inputs): how many
change. One JSON object per line.

Two builds of llama.cpp (scripts/patches/ changes its kernels) cannot be loaded in one
process: `--save-reference DIR` writes the shipped GGUF's next-token log-probabilities and
greedy outputs under this build, and `--against DIR`, run under the other build, prints the
same fidelity figures against them."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

import qrun
from qrun.backends import Backend
from qrun.runtime.sampler import log_softmax

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "docs/language.md"  # 2,048 tokens of English, tables and code
ROWS = (1, 4, 8, 16)
CONTEXT = 64


def load(spec: str) -> Backend:
    """`transformers`, `llamacpp` (the GGUF as shipped) or `llamacpp:q8_0`; no prefix cache,
    so every forward is computed."""
    backend, _, dtype = spec.partition(":")
    return qrun.load_model("smollm2", backend=backend, dtype=dtype or None, cache_mb=0)


def cost(spec: str, repeat: int) -> dict[str, Any]:
    model = load(spec)
    batch = model.batch_forward()
    assert batch is not None, f"{spec} has no batched forward"
    ids = model.encode(TEXT.read_text())
    row: dict[str, Any] = {"backend": spec, "dtype": model.dtype}
    token = iter(ids[CONTEXT:])  # a fresh token for every row of every forward
    for n in ROWS:
        caches = []
        for i in range(n):
            cache = model.new_cache()
            model.forward(ids[i:i + CONTEXT], cache)
            caches.append(cache)
        together, apart = [], []
        for _ in range(repeat):
            tokens = [next(token) for _ in range(n)]
            started = time.perf_counter()
            if n == 1:
                model.forward(tokens, caches[0])
            else:
                batch.forward_batch([([t], c) for t, c in zip(tokens, caches, strict=True)])
            together.append(time.perf_counter() - started)
            started = time.perf_counter()
            for t, c in zip(tokens, caches, strict=True):
                model.forward([t], c)
            apart.append(time.perf_counter() - started)
        row[f"rows{n}_ms"] = round(statistics.median(together) * 1000, 2)
        row[f"rows{n}_apart_ms"] = round(statistics.median(apart) * 1000, 2)
    for n in ROWS[1:]:
        row[f"rows{n}_vs_apart"] = round(row[f"rows{n}_ms"] / row[f"rows{n}_apart_ms"], 3)
        row[f"rows{n}_vs_one"] = round(row[f"rows{n}_ms"] / row["rows1_ms"], 2)
    # What each drafted token adds to a forward (Capabilities.draft_cost): 1 + 4 tokens on one
    # context against 1 token.
    one, five = [], []
    cache = model.new_cache()
    model.forward(ids[:CONTEXT], cache)
    for _ in range(repeat):
        for times, width in ((one, 1), (five, 5)):
            tokens = [next(token) for _ in range(width)]
            started = time.perf_counter()
            model.forward(tokens, cache, width)
            times.append(time.perf_counter() - started)
    ratio = statistics.median(five) / statistics.median(one)
    row["draft_cost"] = round((ratio - 1) / 4, 3)
    prompts = []
    for i in range(3):
        started = time.perf_counter()
        model.forward(ids[1000 + i:1512 + i], model.new_cache())
        prompts.append(time.perf_counter() - started)
    row["prompt512_ms"] = round(statistics.median(prompts) * 1000, 1)
    model.clear_cache()
    return row


def next_token_logprobs(model: Backend, tokens: int = 2048) -> npt.NDArray[np.float64]:
    """The model's next-token log-probabilities [tokens, V] over the start of TEXT."""
    ids = [model.start_token_id, *model.encode(TEXT.read_text())[:tokens - 1]]
    # float64: a KL of 0.004 nats is a small difference of log-probabilities
    return log_softmax(model.forward(ids, model.new_cache(), len(ids)).astype(np.float64))


def next_token_kl(reference: Backend, other: Backend, tokens: int = 2048) -> dict[str, Any]:
    return kl_figures(next_token_logprobs(reference, tokens), next_token_logprobs(other, tokens))


def kl_figures(p: npt.NDArray[np.float64], q: npt.NDArray[np.float64]) -> dict[str, Any]:
    kl = (np.exp(p) * (p - q)).sum(-1)
    return {"tokens": len(p), "mean_kl": round(float(kl.mean()), 5),
            "p99_kl": round(float(np.quantile(kl, 0.99)), 4),
            "top1_agree": round(float((p.argmax(-1) == q.argmax(-1)).mean()), 4)}


def greedy_runs() -> list[tuple[str, qrun.Query, dict[str, Any], dict[str, Any]]]:
    """Every example template's cases (examples/NAME.tests.yaml: inputs and fills, with the
    host functions of examples/NAME.py) and every bench workload's inputs: (name, query,
    inputs, fill) each."""
    from bench.workloads import WORKLOADS
    from qrun.cli.functions_file import load_functions
    from qrun.testing.cases import cases_file_of, load_cases

    runs: list[tuple[str, qrun.Query, dict[str, Any], dict[str, Any]]] = []
    for template in sorted((ROOT / "examples").glob("*.tmpl")):
        functions_file = template.with_suffix(".py")
        functions = load_functions(str(functions_file)) if functions_file.is_file() else None
        query = qrun.Query.from_file(template, functions=functions)
        cases = cases_file_of(template)
        for case in load_cases(cases) if cases.is_file() else []:
            runs.append((f"{template.name}:{case.name}", query, case.inputs, case.fill))
    for name, workload in WORKLOADS.items():
        query = qrun.Query(workload.template())
        for i, inputs in enumerate(workload.inputs):
            runs.append((f"bench:{name}#{i}", query, dict(inputs), {}))
    return runs


def greedy_texts(model: Backend) -> dict[str, str]:
    """The greedy_runs' texts on `model`, by run name."""
    return {name: query.run(inputs, model=model, temperature=0, fill=fill or None).text
            for name, query, inputs, fill in greedy_runs()}


def greedy_outputs(reference: Backend, other: Backend) -> dict[str, Any]:
    """The greedy_runs on both models: which outputs differ."""
    return greedy_figures(greedy_texts(reference), greedy_texts(other))


def greedy_figures(reference: dict[str, str], other: dict[str, str]) -> dict[str, Any]:
    changed = [name for name, text in reference.items() if other.get(name) != text]
    return {"runs": len(reference), "changed": len(changed),
            "unchanged_share": round(1 - len(changed) / len(reference), 3),
            "changed_runs": changed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="transformers,llamacpp,llamacpp:q8_0")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-fidelity", action="store_true")
    parser.add_argument("--no-cost", action="store_true")
    saved = parser.add_mutually_exclusive_group()
    saved.add_argument("--save-reference", type=Path, metavar="DIR",
                       help="write the shipped GGUF's figures under this llama.cpp build")
    saved.add_argument("--against", type=Path, metavar="DIR",
                       help="compare this llama.cpp build with those of --save-reference")
    args = parser.parse_args()
    for spec in [] if args.no_cost else args.backends.split(","):
        print(json.dumps(cost(spec, args.repeat)), flush=True)
    if args.save_reference or args.against:
        model = load("llamacpp")
        logprobs, texts = next_token_logprobs(model), greedy_texts(model)
        if args.save_reference:
            args.save_reference.mkdir(parents=True, exist_ok=True)
            np.save(args.save_reference / "logprobs.npy", logprobs)
            (args.save_reference / "greedy.json").write_text(json.dumps(texts, indent=1))
        else:
            reference = np.load(args.against / "logprobs.npy")
            print(json.dumps({"fidelity": f"this llama.cpp build vs {args.against}",
                              **kl_figures(reference, logprobs)}), flush=True)
            print(json.dumps({"greedy": f"this llama.cpp build vs {args.against}",
                              **greedy_figures(json.loads(
                                  (args.against / "greedy.json").read_text()), texts)}),
                  flush=True)
    elif not args.no_fidelity:
        shipped, q8 = load("llamacpp"), load("llamacpp:q8_0")
        print(json.dumps({"fidelity": "llamacpp:q8_0 vs llamacpp",
                          **next_token_kl(shipped, q8)}), flush=True)
        print(json.dumps({"greedy": "llamacpp:q8_0 vs llamacpp",
                          **greedy_outputs(shipped, q8)}), flush=True)


if __name__ == "__main__":
    main()
