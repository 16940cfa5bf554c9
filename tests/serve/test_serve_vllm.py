"""qrun serve on vLLM (tests marked `vllm`; `make test` runs them in a pytest process of their
own after `make vllm`): on its in-process engine, and on a `vllm serve` started here
(`--backend vllm --url`); a real uvicorn on a free port, driven with httpx. vLLM batches the
runs' calls itself (no ForwardScheduler), so these check that concurrent requests are each
answered under their constraint and that a client that goes away still cancels its run at its
next call, while the server goes on."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import jsonschema
import pytest

import qrun
from qrun.errors import RunCancelled
from qrun.serve import app
from qrun.serve.service import Service
from tests.hang import alarm, wait_until
from tests.serve.serving import BIOS, EXTRACT, GATE, SCHEMA, Gate, post_extract, serving

pytestmark = pytest.mark.vllm



@pytest.fixture(scope="module", params=["engine", "server"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, Service]]:
    """qrun serve on vLLM's in-process engine, or on a `vllm serve` (tests/vllm_serving.py);
    both shared with the rest of the tier (tests/conftest.py)."""
    with ExitStack() as stack:
        if request.param == "engine":
            backend = request.getfixturevalue("vllm_engine")
        else:
            url = request.getfixturevalue("vllm_server_url")
            backend = qrun.load_model("smollm2", backend="vllm", url=url)
            stack.callback(backend.close)  # type: ignore[attr-defined]
        asgi = app({"extract": qrun.Query(EXTRACT, functions={"wait": GATE.wait})},
                   model=backend, max_running=3)
        url = stack.enter_context(serving(asgi))
        yield url, asgi.state.qrun


def test_concurrent_requests_on_vllm_are_each_answered_under_their_schema(
        server: tuple[str, Service], gate: Gate) -> None:
    url, service = server
    assert service.runner.forwards is None  # vLLM's engine batches the runs' calls
    with alarm(300), ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(post_extract, url, {"inputs": {"bio": bio}}) for bio in BIOS]
        wait_until(lambda: gate.arrived == 3)
        gate.open.set()
        answers = [future.result() for future in futures]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        jsonschema.validate(answer.json()["vars"]["person"], SCHEMA)


def test_a_client_gone_cancels_its_vllm_run_and_the_server_goes_on(
        server: tuple[str, Service], gate: Gate) -> None:
    url, service = server
    body = {"inputs": {"bio": BIOS[1]}, "stream": True}
    with alarm(300):
        with httpx.stream("POST", f"{url}/v1/templates/extract/run", json=body,
                          timeout=300) as response:
            assert response.status_code == 200
            wait_until(lambda: gate.arrived == 1)
            ticket = next(iter(service.runs.running))
        wait_until(ticket.cancelled.is_set)
        gate.open.set()
        wait_until(lambda: service.runs.active == 0)
        with pytest.raises(RunCancelled):
            ticket.future.result()
        answer = post_extract(url, {"inputs": {"bio": BIOS[2]}})
    assert answer.status_code == 200, answer.text
    jsonschema.validate(answer.json()["vars"]["person"], SCHEMA)
