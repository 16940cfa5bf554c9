"""How many threads llama.cpp runs (backends/llamacpp.py): one per physical core this process
may run on, fewer when other work holds CPUs now, or $QRUN_LLAMACPP_THREADS. Read once, when a
model loads; no llama.cpp import, so it is tested without the bindings."""

from __future__ import annotations

import os
import time
from pathlib import Path


def llama_threads() -> int:
    """llama.cpp's thread count: $QRUN_LLAMACPP_THREADS when set; else one per physical core
    this process may run on (`physical_cores`), but no more than the CPUs that other work
    leaves free now (`other_work`), and at least one. ggml synchronises its threads at every
    graph node, so a thread that loses its core stalls all of them. Measured on this project's
    2-core machine: with no other work on it, 2 threads ran the bench's rpg and regex
    workloads 1.5x and 1.9x faster than 1 (bench/RESULTS.md); busy (load average 6),
    examples/hello.tmpl took 1.6 s of model time with 1 thread and 126 s with 2. Read once,
    when the model loads."""
    given = os.environ.get("QRUN_LLAMACPP_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, min(physical_cores(), round(usable_cpus() - other_work())))


PROC_STAT = Path("/proc/stat")
STAT_READS = 9
"""Reads of PROC_STAT, STAT_READ_GAP seconds apart (~20 ms in all, once per model load)."""
STAT_READ_GAP = 0.002


def other_work() -> float:
    """How many CPUs other tasks keep busy now: on Linux, the median over STAT_READS reads of
    the tasks running or ready to run (`procs_running` in /proc/stat, this reading thread
    less); elsewhere the load average over the last minute.

    Why not the load average on Linux: it is a one-minute mean, so it counts what has just
    ended, qrun's own previous run included. On this 2-core machine, after a few runs of
    `qrun --backend llamacpp` one after another, it stood near 1 with nothing else running,
    and the next run took 1 thread instead of 2. A median of instant readings sees the work
    that is there now and ignores a task that only wakes briefly."""
    counts = []
    for read in range(STAT_READS):
        if read:
            time.sleep(STAT_READ_GAP)
        try:
            text = PROC_STAT.read_text()
        except OSError:
            break
        running = next((line.split()[1] for line in text.splitlines()
                        if line.startswith("procs_running ")), None)
        if running is None or not running.isdigit():
            break
        counts.append(max(0, int(running) - 1))
    if counts:
        return float(sorted(counts)[len(counts) // 2])
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def usable_cpus() -> int:
    """The logical CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on: hyperthreads of one core count
    once, as in llama.cpp's own default (and torch's, which this replaced so that the llama.cpp
    path never imports torch). Read from Linux's sysfs topology; elsewhere the CPU count."""
    if not hasattr(os, "sched_getaffinity"):
        return os.cpu_count() or 1
    cores = set()
    for cpu in sorted(os.sched_getaffinity(0)):
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))  # no topology: count the CPU itself
    return max(1, len(cores))
