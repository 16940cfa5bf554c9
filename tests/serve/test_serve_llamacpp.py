"""qrun serve on the llamacpp backend (tests marked `llamacpp`; `make test` runs them in their
own pytest process after `make llamacpp`): a real uvicorn on a free port serving the default
model's GGUF, driven with httpx. Concurrent requests share llama.cpp's batched decodes (one
sequence per run) with every answer holding its constraint, a stream's events come in order,
and a client that goes away cancels its run, whose sequence is freed, while the server goes on.

llama.cpp's results depend slightly on how tokens were batched (tests/backends/test_llamacpp.py),
so answers are checked against their constraints, not against runs alone.

Without llama_cpp installed these tests skip, unless QRUN_REQUIRE_LLAMACPP=1."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
from tiers import require_llama_cpp

import qrun
from qrun.errors import RunCancelled
from qrun.serve import app
from qrun.serve.service import Service
from tests.hang import alarm, wait_until
from tests.serve.serving import (
    BIOS,
    EXTRACT,
    GATE,
    SCHEMA,
    Gate,
    post_extract,
    serving,
    sse_events,
)

pytestmark = pytest.mark.llamacpp

require_llama_cpp()

from qrun.backends.llamacpp import LlamaCppBackend  # noqa: E402


@pytest.fixture(scope="module")
def server(llama: LlamaCppBackend) -> Iterator[tuple[str, Service]]:
    templates = {"extract": qrun.Query(EXTRACT, functions={"wait": GATE.wait})}
    asgi = app(templates, model=llama, max_running=3, max_queue=2)
    with serving(asgi) as url:
        yield url, asgi.state.qrun


def test_concurrent_requests_share_llamacpp_decodes_and_hold_their_constraint(
        server: tuple[str, Service], gate: Gate) -> None:
    url, service = server
    with alarm(300), ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(post_extract, url, {"inputs": {"bio": bio}}) for bio in BIOS]
        wait_until(lambda: gate.arrived == 3)  # every run started, none has a forward yet
        gate.open.set()
        answers = [future.result() for future in futures]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        jsonschema.validate(answer.json()["vars"]["person"], SCHEMA)
    assert service.runner.forwards is not None
    assert service.largest_batch == 3  # the three runs shared decodes


def test_a_stream_on_llamacpp_sends_text_then_the_hole_then_done(
        server: tuple[str, Service], gate: Gate) -> None:
    url, _ = server
    gate.open.set()
    body = {"inputs": {"bio": BIOS[0]}, "stream": True}
    with alarm(300), httpx.stream("POST", f"{url}/v1/templates/extract/run", json=body,
                                  timeout=300) as response:
        assert response.status_code == 200
        events = sse_events(response.iter_lines())
    kinds = [kind for kind, _ in events]
    assert kinds[-1] == "done" and "error" not in kinds
    done = events[-1][1]
    assert "".join(d["text"] for k, d in events if k == "text") == done["text"]
    assert [(d["name"], d["value"]) for k, d in events if k == "hole"] == [
        ("person", done["vars"]["person"])]
    jsonschema.validate(done["vars"]["person"], SCHEMA)


def test_a_client_gone_cancels_its_llamacpp_run_and_frees_its_sequence(
        server: tuple[str, Service], gate: Gate, llama: LlamaCppBackend) -> None:
    url, service = server
    body = {"inputs": {"bio": BIOS[1]}, "stream": True}
    with alarm(300):
        with httpx.stream("POST", f"{url}/v1/templates/extract/run", json=body,
                          timeout=300) as response:
            assert response.status_code == 200
            wait_until(lambda: gate.arrived == 1)
            ticket = next(iter(service.runs.running))
            cancelled, outcome = ticket.cancelled, ticket.future
            del ticket
        # The stream is closed: the server cancels the run at its next forward.
        wait_until(cancelled.is_set)
        gate.open.set()
        wait_until(lambda: service.runs.active == 0)
        with pytest.raises(RunCancelled):
            outcome.result()
        answer = post_extract(url, {"inputs": {"bio": BIOS[2]}})  # the server goes on
    assert answer.status_code == 200, answer.text
    jsonschema.validate(answer.json()["vars"]["person"], SCHEMA)
    del outcome  # its exception's traceback holds the run's frames, and so its cache
    gc.collect()
    llama.clear_cache()  # the prefix cache's sequences: what is left is held by a run
    assert llama.free_sequences() == llama.context().n_seq_max


def test_the_openai_sdk_on_llamacpp(server: tuple[str, Service], llama: LlamaCppBackend) -> None:
    # issue #39: OpenAI's endpoints on the default model's GGUF, concurrent requests under a
    # schema (llama.cpp batches them) and a stream (serve/openai.py; the tiny model's tier has
    # the rest, tests/serve/test_openai.py).
    import openai

    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": f"Extract the person as JSON: {bio}"}
                for bio in BIOS[:2]]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    with alarm(300), ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda m: client.chat.completions.create(
            model=llama.name, messages=[m], temperature=0, max_tokens=64,  # type: ignore[list-item]
            response_format=fmt), messages))  # type: ignore[arg-type]
        chunks = list(client.chat.completions.create(
            model=llama.name, messages=[messages[0]], temperature=0,  # type: ignore[list-item]
            max_tokens=64, response_format=fmt, stream=True))  # type: ignore[arg-type]
    for answer in answers:
        jsonschema.validate(json.loads(answer.choices[0].message.content or ""), SCHEMA)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(streamed), SCHEMA)
