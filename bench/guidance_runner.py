"""guidance on llama.cpp running the bench's workloads, for `python -m bench --backend llamacpp`
when QRUN_BENCH_GUIDANCE_PYTHON names a Python with guidance installed (scripts/guidance-venv.sh
makes one that shares qrun's llama-cpp-python build). Standalone: it runs in guidance's
environment and imports nothing of qrun. It serves passes on request, so the suite can
alternate guidance's passes with qrun's (a drift of the machine's speed then falls on both).

Protocol, one JSON object per line. First line (the job): {"gguf": path, "threads": n,
"n_ctx": n, "programs": {workload: [run...]}}, a run being the workload's flat step list for one
input (bench/workloads.py Workload.steps): {"text": s}, {"gen": name, "regex": pattern or null,
"stop": [...], "max_tokens": n} or {"select": name, "options": [...]}. Then requests
{"workload": name, "warmup": bool}, each answered by one line: {"wall_s", "values"} or
{"error"}. End of input ends the runner.

Each run is one guidance program built as one grammar (every step joined with `+` and added to
the model once), greedy, the way guidance's README writes templates. A pass runs every input
of a workload one after another on a freshly loaded model (its KV cache cold, as qrun's prefix
cache is emptied before each of its passes; the load is not timed); a warm-up pass runs the
first input only. values are the first run's captures (to compare with qrun's)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def _program(steps: list[dict[str, Any]]) -> Any:
    """The run's steps as one guidance grammar; hole k captures as `h{k}` (guidance's grammar
    names take no brackets, and loop holes are named `item[0]`...)."""
    from guidance import gen, select

    program: Any = ""
    holes = 0
    for step in steps:
        if "text" in step:
            part: Any = step["text"]
        elif "gen" in step:
            part = gen(f"h{holes}", regex=step["regex"], stop=step["stop"] or None,
                       max_tokens=step["max_tokens"])
            holes += 1
        else:
            part = select(step["options"], name=f"h{holes}")
            holes += 1
        program = program + part
    return program


def _load(job: dict[str, Any]) -> Any:
    from guidance import models

    return models.LlamaCpp(job["gguf"], n_ctx=job["n_ctx"], n_threads=job["threads"],
                           echo=False, verbose=False)


def _pass(job: dict[str, Any], runs: list[list[dict[str, Any]]]) -> tuple[float, Any]:
    programs = [_program(steps) for steps in runs]
    model = _load(job)
    started = time.perf_counter()
    first = None
    for program in programs:
        out = model + program
        first = first if first is not None else out
    wall = time.perf_counter() - started
    return wall, first


def _serve_pass(job: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    runs = job["programs"][request["workload"]]
    names = [s.get("gen") or s.get("select") for s in runs[0] if "text" not in s]
    wall, first = _pass(job, runs[:1] if request.get("warmup") else runs)
    values = {}
    for k, capture in enumerate(names):
        try:
            values[capture] = first[f"h{k}"]
        except KeyError:
            values[capture] = None
    return {"wall_s": round(wall, 4), "values": values}


def main() -> int:
    # Answers go to a copy of the original stdout; fd 1 itself then points at stderr, so
    # nothing guidance or llama.cpp prints can break the protocol.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    job = json.loads(sys.stdin.readline())
    for line in sys.stdin:
        try:
            answer = _serve_pass(job, json.loads(line))
        except Exception:  # noqa: BLE001 - a failing pass is reported, the runner goes on
            import traceback

            answer = {"error": traceback.format_exc()[-3000:]}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
