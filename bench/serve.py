"""Load on `qrun serve` (issue 26): the extraction workload (32 bios, each turned into a person
record under SCHEMA, greedy) sent by an async httpx client at several concurrencies, against a
`qrun serve` this script starts, and the same runs in process one at a time for reference.

    python -m bench.serve [--model smollm2] [--concurrency 1 4 16 64] [--requests 32]
                          [--threads 1]

Prints per concurrency (a fresh server each): requests/s, output tokens/s, p50/p99 latency,
p50 time to the hole's event (its value, streamed), and how many answers were invalid
(jsonschema) or failed. Not yet here (docs/serve.md §7): llama-cpp-python's and vLLM's
servers on the same workload, and the fault run."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema

import qrun

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "city": {"type": "string", "maxLength": 24}}}
TEMPLATE = ("{% user %}Extract the person described here as JSON with name, age and city.\n"
            "{{ bio }}{% enduser %}\n{% assistant %}{{ gen person json=" + json.dumps(SCHEMA)
            + " max_tokens=64 }}{% endassistant %}\n")
PEOPLE = [("Kofi", 25, "baker", "Lagos", "long walks"), ("Mei", 31, "nurse", "Taipei", "chess"),
          ("Lars", 47, "carpenter", "Bergen", "sailing"), ("Amara", 19, "student", "Accra",
                                                           "poetry"),
          ("Diego", 38, "chef", "Seville", "football"), ("Yuki", 52, "pilot", "Osaka",
                                                          "gardening"),
          ("Priya", 27, "engineer", "Pune", "cricket"), ("Olga", 64, "teacher", "Kazan",
                                                          "opera")]
WARM_UP = "Ana is a 40-year-old doctor who lives in Lima and likes rowing."
BIOS = [f"{name} is a {age + 3 * k}-year-old {job} who lives in {city} and likes {hobby}."
        for k in range(4) for name, age, job, city, hobby in PEOPLE]
assert len(BIOS) == 32


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_server(folder: Path, model: str, max_running: int) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "qrun.cli", "serve", str(folder), "--model", model, "--port",
         str(port), "--max-running", str(max_running), "--max-queue", "1024",
         "--log-level", "warning"], text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(3000):
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"qrun serve exited with {proc.returncode}")
        time.sleep(0.1)
    raise SystemExit("qrun serve did not start")


async def one(client: httpx.AsyncClient, url: str, bio: str) -> dict[str, Any]:
    """One streamed request: its latency, time to its first text event after the prompt,
    tokens, and whether the answer is valid."""
    started = time.perf_counter()
    first: float | None = None
    row: dict[str, Any] | None = None
    body = {"inputs": {"bio": bio}, "stream": True}
    async with client.stream("POST", f"{url}/v1/templates/extract/run", json=body) as answer:
        kind = ""
        async for line in answer.aiter_lines():
            if line.startswith("event:"):
                kind = line.removeprefix("event:").strip()
            elif line.startswith("data:"):
                data = json.loads(line.removeprefix("data:"))
                if kind == "hole" and first is None:
                    first = time.perf_counter() - started
                if kind == "done":
                    row = data
                if kind == "error":
                    return {"ok": False, "error": data}
    if row is None:
        return {"ok": False, "error": "no done event"}
    try:
        jsonschema.validate(row["vars"]["person"], SCHEMA)
        valid = True
    except jsonschema.ValidationError:
        valid = False
    return {"ok": True, "valid": valid, "latency": time.perf_counter() - started,
            "first": first, "tokens": row["stats"]["generated_tokens"]}


async def load(url: str, concurrency: int, requests: int,
               bios: list[str] | None = None) -> dict[str, Any]:
    bios = bios or [BIOS[i % len(BIOS)] for i in range(requests)]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for bio in bios:
        queue.put_nowait(bio)
    outcomes: list[dict[str, Any]] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            outcomes.append(await one(client, url, queue.get_nowait()))

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        wall = time.perf_counter() - started
    done = [o for o in outcomes if o["ok"]]
    latencies = sorted(o["latency"] for o in done)
    firsts = [o["first"] for o in done if o["first"] is not None]
    return {"concurrency": concurrency, "requests": requests, "wall_s": round(wall, 3),
            "requests_per_s": round(len(done) / wall, 3),
            "output_tokens_per_s": round(sum(o["tokens"] for o in done) / wall, 2),
            "p50_s": round(statistics.median(latencies), 3) if latencies else None,
            "p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3)
            if latencies else None,
            "first_hole_p50_s": round(statistics.median(firsts), 3) if firsts else None,
            "invalid": sum(1 for o in done if not o["valid"]),
            "failed": len(outcomes) - len(done)}


def in_process(model: str, requests: int) -> dict[str, Any]:
    query = qrun.Query(TEMPLATE)
    backend = qrun.load_model(model)
    query.run({"bio": WARM_UP}, model=backend)  # warm-up (not a bio the prefix cache then has)
    started = time.perf_counter()
    for i in range(requests):
        query.run({"bio": BIOS[i % len(BIOS)]}, model=backend)
    wall = time.perf_counter() - started
    return {"in_process_requests_per_s": round(requests / wall, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-running", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads, in the server and in process (default 1: on a "
                             "shared VM more threads wait on each other, bench/README.md)")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the server's torch reads it
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "extract.tmpl").write_text(TEMPLATE)
        # A fresh server per concurrency: its prefix cache must not answer a bio it has seen
        # at the previous concurrency.
        for concurrency in args.concurrency:
            proc, url = start_server(Path(folder), args.model, args.max_running)
            try:
                asyncio.run(load(url, 1, 1, [WARM_UP]))
                print(json.dumps(asyncio.run(load(url, concurrency, args.requests))),
                      flush=True)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=120)
    print(json.dumps(in_process(args.model, args.requests)), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
