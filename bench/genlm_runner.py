"""genlm-control on the faithfulness tasks, for `python -m bench.faithfulness` when
QRUN_BENCH_GENLM_PYTHON names a Python with genlm-control installed (its own environment: it
pins its own torch and transformers). Standalone: it imports nothing of qrun.

Protocol: one JSON object on standard input, {"model": an HF model folder (qrun's own
conversion of the GGUF, the same weights), "eos": [strings that end the value], "particles":
n, "runs": k, "tasks": [{"name", "prompt_ids": the context's token ids before the hole,
"pattern": the value's regex (a healed prefix included), "strings": [...]}]}; one JSON line
per task on standard output: {"name", "mean_posterior": each string's probability averaged
over the runs' decoded posteriors, "s_per_sample"} or {"name", "error"}.

Each run is genlm-control's AWRS token sampler (adaptive weighted rejection sampling) under
the regex as a byte FSA, inside its SMC with `particles` particles and resampling at ESS 0.5,
the way genlm-control's README writes it (issue #40 measured it the same way)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
from typing import Any


async def _task(llm: Any, task: dict[str, Any], particles: int, runs: int) -> dict[str, Any]:
    from genlm.control import AWRS, BoolFSA

    llm.prompt_ids = list(task["prompt_ids"])
    fsa = BoolFSA.from_regex(task["pattern"])
    sampler = AWRS(llm, fsa.coerce(llm, f=b"".join))
    totals = dict.fromkeys(task["strings"], 0.0)
    started = time.perf_counter()
    for _ in range(runs):
        sequences = await sampler.smc(n_particles=particles, ess_threshold=0.5, max_tokens=24)
        for text, prob in sequences.decoded_posterior.items():
            value = text if isinstance(text, str) else bytes(text).decode("utf-8", "replace")
            for string in task["strings"]:
                if value.endswith(string):
                    totals[string] += prob / runs
    return {"name": task["name"], "mean_posterior": totals,
            "s_per_sample": (time.perf_counter() - started) / runs}


async def _main(job: dict[str, Any]) -> None:
    from genlm.control import PromptedLLM

    llm = PromptedLLM.from_name(job["model"], backend="hf",
                                eos_byte_strings=[e.encode() for e in job["eos"]])
    for task in job["tasks"]:
        try:
            row = await _task(llm, task, job["particles"], job["runs"])
        except Exception:  # noqa: BLE001 - one failing task must not stop the others
            row = {"name": task["name"], "error": traceback.format_exc()}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    asyncio.run(_main(json.loads(sys.stdin.read())))
