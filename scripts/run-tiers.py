"""Runs the test tiers for `make test` (and `make test-under-load`): every tier runs even when
another fails, each in a pytest process of its own, two at a time so that both cores are busy
all along; one summary of all tiers comes at the end, and the exit status is non-zero if any
tier failed.

Why two at a time: the default tier runs on pytest-xdist's workers (one per core) and takes
most of the time; the other tiers (vLLM, llama.cpp, lint and types, the browser) run beside
it, longest first, and whichever of the two runners is free takes the next, so that both end
near together. vLLM and llama.cpp each need a process of their own (their OpenMP threads bind
to the process that starts them: Makefile). Running tiers side by side is also the suite's
load test: nothing in it may depend on having a core to itself (issue #38).

`--hog` runs the named tiers with a busy loop pinned to each core for the whole run (CI's proof
that the backend and serve tiers hold on a busy machine).

Each tier's output goes to build/test-logs/TIER.log; a failed tier's log tail is printed. The
last line is the total in pytest's words ("total: N passed, N failed, N skipped").

Usage: python scripts/run-tiers.py [--hog] [TIER ...]   (default: every tier but serve)
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "build" / "test-logs"
PY = sys.executable
MARKERS_DEFAULT = "not vllm and not llamacpp and not browser"


@dataclass
class Tier:
    name: str
    commands: list[list[str]]
    env: dict[str, str] = field(default_factory=dict)
    returncode: int | None = None
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)


def pytest(*args: str) -> list[str]:
    # The 25 slowest tests in each tier's log: where the suite's time goes.
    return [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=25", *args]


def tiers(chromium: str) -> dict[str, Tier]:
    workers = str(max(2, min(os.cpu_count() or 2, 8)))
    return {t.name: t for t in [
        Tier("check", [[PY, "-m", "ruff", "check", "qrun", "tests", "bench", "scripts",
                        "corpus"], [PY, "-m", "mypy"]]),
        Tier("default", [pytest("-n", workers, "--dist", "worksteal", "-m", MARKERS_DEFAULT)]),
        Tier("llamacpp", [pytest("-m", "llamacpp")], {"QRUN_REQUIRE_LLAMACPP": "1"}),
        Tier("vllm", [pytest("-m", "vllm")]),
        Tier("browser", [pytest("-m", "browser", "tests/trace")],
             {"QRUN_CHROMIUM": chromium, "QRUN_REQUIRE_BROWSER": "1"}),
        # Only under --hog (the default tier holds these tests already): qrun serve's tests.
        Tier("serve", [pytest("-m", "not vllm and not llamacpp and not browser",
                              "tests/serve")]),
    ]}


COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def closing_counts(log: str) -> dict[str, int]:
    """The counts of pytest's closing line ("3195 passed, 6 skipped in 434.18s")."""
    for line in reversed(log.splitlines()):
        if " in " in line and COUNT.search(line):
            counts: dict[str, int] = {}
            for number, word in COUNT.findall(line):
                word = "error" if word.startswith("error") else word
                counts[word] = counts.get(word, 0) + int(number)
            return counts
    return {}


def run_tier(tier: Tier, lock: threading.Lock) -> None:
    log_path = LOGS / f"{tier.name}.log"
    started = time.monotonic()
    with lock:
        print(f"[{tier.name}] started (log: {log_path.relative_to(ROOT)})", flush=True)
    env = {**os.environ, **tier.env}
    with log_path.open("w") as log:
        for command in tier.commands:
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            code = subprocess.run(command, cwd=ROOT, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  check=False).returncode
            if code != 0:
                break
    tier.returncode = code
    tier.seconds = time.monotonic() - started
    text = log_path.read_text(errors="replace")
    tier.counts = closing_counts(text)
    with lock:
        verdict = "passed" if code == 0 else f"FAILED (exit {code})"
        print(f"[{tier.name}] {verdict} in {minutes(tier.seconds)}: {describe(tier)}",
              flush=True)
        if code != 0:
            tail = text.splitlines()[-150:]
            print(f"---- the last {len(tail)} lines of {log_path.relative_to(ROOT)} ----")
            print("\n".join(tail), flush=True)


def describe(tier: Tier) -> str:
    if not tier.counts:
        return "no tests" if tier.name != "check" else "ruff and mypy"
    return ", ".join(f"{n} {w}" for w, n in tier.counts.items())


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{seconds % 60:04.1f}s"


# The order tiers are started in: the longest first (measured on 2 cores, issue #38).
LONGEST_FIRST = ["default", "vllm", "serve", "llamacpp", "check", "browser"]


def runner(todo: queue.Queue[Tier], lock: threading.Lock) -> None:
    """Run tiers from `todo` until it is empty."""
    while True:
        try:
            tier = todo.get_nowait()
        except queue.Empty:
            return
        run_tier(tier, lock)


def hog(core: int) -> None:
    """A busy loop on one core, for the whole run (the machine a user's laptop is)."""
    try:
        os.sched_setaffinity(0, {core})
    except (AttributeError, OSError):
        pass
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tiers", nargs="*", help="tiers to run (default: check default "
                        "llamacpp vllm browser)")
    parser.add_argument("--hog", action="store_true",
                        help="with a busy loop pinned to each core beside the tiers")
    parser.add_argument("--chromium", default=os.environ.get("CHROMIUM", "/usr/bin/chromium"))
    args = parser.parse_args()
    known = tiers(args.chromium)
    names = args.tiers or ["check", "default", "llamacpp", "vllm", "browser"]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown tier {unknown[0]!r}; tiers: {', '.join(known)}")
    chosen = [known[n] for n in names]
    LOGS.mkdir(parents=True, exist_ok=True)
    hogs: list[multiprocessing.Process] = []
    if args.hog:
        for core in sorted(os.sched_getaffinity(0)):
            process = multiprocessing.Process(target=hog, args=(core,), daemon=True)
            process.start()
            hogs.append(process)
        print(f"a busy loop runs on each of {len(hogs)} cores beside the tiers", flush=True)
    started = time.monotonic()
    lock = threading.Lock()
    todo: queue.Queue[Tier] = queue.Queue()
    for tier in sorted(chosen, key=lambda t: LONGEST_FIRST.index(t.name)):
        todo.put(tier)
    threads = [threading.Thread(target=runner, args=(todo, lock)) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for process in hogs:
            process.kill()
    wall = time.monotonic() - started
    print("\n==== all tiers" + (" (with a busy loop on every core)" if hogs else "") + " ====")
    total: dict[str, int] = {}
    for tier in chosen:
        status = "passed" if tier.returncode == 0 else f"FAILED (exit {tier.returncode})"
        print(f"  {tier.name:<9} {status:<16} {minutes(tier.seconds):>10}  {describe(tier)}")
        for word, n in tier.counts.items():
            total[word] = total.get(word, 0) + n
    failed_tiers = [t.name for t in chosen if t.returncode != 0]
    print(f"  wall time {minutes(wall)} on {os.cpu_count()} cores")
    if failed_tiers:
        print(f"  failed tiers: {', '.join(failed_tiers)}")
    # pytest's errors (a fixture that failed) count as failures in the one closing line.
    failed = total.get("failed", 0) + total.get("error", 0)
    print(f"total: {total.get('passed', 0)} passed, {failed} failed, "
          f"{total.get('skipped', 0)} skipped")
    return 1 if failed_tiers else 0


if __name__ == "__main__":
    sys.exit(main())
