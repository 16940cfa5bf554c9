"""qrun serve (docs/serve.md) against a real uvicorn on a free port, driven with httpx, on the
tiny model: the endpoints, every error code, streaming, admission, and runs of concurrent
requests batched together with the results an in-process run gives."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import RunCancelled, UsageError
from qrun.serve import app
from qrun.serve.server import is_loopback
from qrun.serve.service import Service
from tests.doubles import ScriptedServer
from tests.hang import alarm, wait_until
from tests.serve.serving import GATE, Gate, serving, sse_events

PERSON = ('---\ntemperature: 0\n---\nName: {{ name }}.\nAge: {{ gen age regex="[0-9]{1,2}" }}'
          '\nCity: {{ gen city regex="[A-Z][a-z]{2,7}" }}\n')
GATED = 'Q: {{ q }}{{ wait() }}\nA: {{ gen a regex="[a-z]{2,6}" }}\n'
JSON = {"Content-Type": "application/json"}
NDJSON = {"Content-Type": "application/x-ndjson"}



@pytest.fixture(scope="module")
def server(tiny: TransformersBackend) -> Iterator[tuple[str, Service]]:
    templates = {"person": qrun.Query(PERSON),
                 "gated": qrun.Query(GATED, functions={"wait": GATE.wait})}
    asgi = app(templates, model=tiny, max_running=3, max_queue=2)
    with serving(asgi) as url:
        yield url, asgi.state.qrun


def post(url: str, name: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/templates/{name}/run", json=body, timeout=120, **kwargs)


def test_lists_the_templates_with_inputs_holes_and_options(
        server: tuple[str, Service]) -> None:
    url, _ = server
    listed = httpx.get(f"{url}/v1/templates").json()["templates"]
    person = next(t for t in listed if t["name"] == "person")
    assert person["inputs"] == ["name"]
    assert [(h["name"], h["constraint"]) for h in person["holes"]] == [
        ("age", {"kind": "regex", "pattern": "[0-9]{1,2}"}),
        ("city", {"kind": "regex", "pattern": "[A-Z][a-z]{2,7}"})]
    assert person["options"] == {"temperature": 0.0}
    assert httpx.get(f"{url}/v1/templates/gated").json()["inputs"] == ["q"]
    assert httpx.get(f"{url}/healthz").json()["status"] == "ok"


def test_a_run_answers_what_an_in_process_run_gives(
        server: tuple[str, Service], tiny: TransformersBackend) -> None:
    url, _ = server
    response = post(url, "person", {"inputs": {"name": "Ada"}, "options": {"seed": 3},
                                    "fields": ["text", "vars", "stats", "holes"]})
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"]
    row = response.json()
    local = qrun.Query(PERSON).run({"name": "Ada"}, model=tiny, seed=3)
    assert row["text"] == local.text and row["vars"] == local.vars
    assert row["stats"]["generated_tokens"] == local.stats.generated_tokens
    assert row["holes"]["age"]["value"] == local.vars["age"]
    assert set(row) == {"text", "vars", "stats", "holes"}


def test_a_request_chooses_the_sampler_of_the_constrained_holes(
        server: tuple[str, Service], tiny: TransformersBackend) -> None:
    url, _ = server
    body = {"inputs": {"name": "Ada"}, "fields": ["vars", "holes"],
            "options": {"sampler": "smc", "particles": 3, "ess_threshold": 1, "seed": 2,
                        "temperature": 1}}
    response = post(url, "person", body)
    assert response.status_code == 200, response.text
    row = response.json()
    assert [len(row["holes"][h]["particles"]) for h in ("age", "city")] == [3, 3]
    local = qrun.Query(PERSON).run({"name": "Ada"}, model=tiny, sampler="smc", particles=3,
                                   ess_threshold=1, seed=2, temperature=1)
    assert row["vars"] == local.vars
    blocks = post(url, "person", {**body, "fields": ["particle_blocks"]})
    assert blocks.status_code == 200 and blocks.json() == {"particle_blocks": []}
    for wrong in ({"sampler": "best"}, {"particles": 65}, {"sampler": "exact", "top_k": 3},
                  {"ess_threshold": 2}):
        refused = post(url, "person", {"inputs": {"name": "Ada"}, "options": wrong})
        assert refused.status_code == 400, wrong
        assert refused.json()["error"]["code"] == "bad_request"


@pytest.mark.parametrize(("name", "body", "status", "code"), [
    ("person", {"inputs": {}}, 422, "input_error"),
    ("nobody", {"inputs": {"name": "x"}}, 404, "template_not_found"),
    ("..%2F..%2Fetc%2Fpasswd", {"inputs": {}}, 404, "not_found"),  # no such route
    ("person.tmpl", {"inputs": {}}, 404, "template_not_found"),
    ("person", {"inputs": {"name": "x"}, "options": {"temperature": -1}}, 400, "bad_request"),
    ("person", {"inputs": {"name": "x"}, "options": {"trace": True}}, 400, "bad_request"),
    ("person", {"inputs": {"name": "x"}, "extra": 1}, 400, "bad_request"),
    ("person", ["not", "an", "object"], 400, "bad_request"),
])
def test_errors_are_json_with_a_stable_code(server: tuple[str, Service], name: str, body: Any,
                                            status: int, code: str) -> None:
    url, _ = server
    response = post(url, name, body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code
    assert "Traceback" not in response.text
    if code == "input_error":
        assert error["position"]["line"] == 4 and "name" in error["message"]


@pytest.mark.parametrize("endpoint, content_type", [
    ("run", "text/plain"), ("run", "application/x-www-form-urlencoded"),
    ("run", "multipart/form-data; boundary=x"), ("run", None),
    ("batch", "text/plain"), ("batch", None),
])
def test_a_body_a_web_page_could_send_unasked_is_refused_415(
        server: tuple[str, Service], endpoint: str, content_type: str | None) -> None:
    """Issue #38: any web page could POST `text/plain` to the default server (127.0.0.1, no
    key) without a CORS preflight, and run templates for whoever visits it."""
    url, service = server
    def tokens() -> float | None:
        return service.metrics.registry.get_sample_value("qrun_generated_tokens_total")

    before = tokens()
    headers = {} if content_type is None else {"Content-Type": content_type}
    body = b'{"inputs": {"name": "Ada"}}' if endpoint == "run" else b'{"name": "Ada"}\n'
    answer = httpx.post(f"{url}/v1/templates/person/{endpoint}", content=body,
                        headers=headers, timeout=60)
    assert answer.status_code == 415, answer.text
    assert answer.json()["error"]["code"] == "unsupported_media_type"
    assert tokens() == before  # nothing ran
    ok = httpx.post(f"{url}/v1/templates/person/{endpoint}", content=body, timeout=120,
                    headers=JSON if endpoint == "run" else NDJSON)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io",
                                  "", "[::2]:80"])
def test_a_host_this_server_is_not_is_refused(server: tuple[str, Service], host: str) -> None:
    """DNS rebinding (issue #38): a page whose name resolves to 127.0.0.1 still sends its own
    name in Host, and is refused before anything runs, /healthz and the errors included."""
    url, _ = server
    for method, path in [("GET", "/healthz"), ("GET", "/v1/templates"),
                         ("POST", "/v1/templates/person/run"), ("GET", "/nowhere")]:
        answer = httpx.request(method, url + path, json={"inputs": {"name": "Ada"}},
                               headers={"Host": host}, timeout=60)
        assert answer.status_code == 400, (path, answer.text)
        assert answer.json()["error"]["code"] == "bad_host"
    for name in ["localhost", "127.0.0.1", f"127.0.0.1:{url.rsplit(':', 1)[1]}", "[::1]:9",
                 "LOCALHOST"]:
        assert httpx.get(url + "/healthz", headers={"Host": name}).status_code == 200


def test_the_names_a_served_address_answers_to() -> None:
    from qrun.serve import allowed_hosts

    assert allowed_hosts("127.0.0.1", []) == {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts("10.0.0.5", ["api.example"]) == {
        "localhost", "127.0.0.1", "::1", "10.0.0.5", "api.example"}
    assert allowed_hosts("0.0.0.0", []) is None  # every interface, no names given: any
    assert allowed_hosts("0.0.0.0", ["api.example"]) == {
        "localhost", "127.0.0.1", "::1", "0.0.0.0", "api.example"}


def test_any_host_may_be_allowed(tiny: TransformersBackend) -> None:
    asgi = app({"person": qrun.Query(PERSON)}, model=tiny, allowed_hosts=["*"])
    with serving(asgi) as url:
        assert httpx.get(url + "/healthz", headers={"Host": "anything.example"}
                         ).status_code == 200


@pytest.mark.parametrize("key", ["key ", " key", "k e y", "key\n", "ключ"])
def test_a_key_that_could_never_match_is_refused_at_start(tiny: TransformersBackend,
                                                          key: str) -> None:
    with pytest.raises(UsageError, match="API key must be printable ASCII"):
        app({"person": qrun.Query(PERSON)}, model=tiny, api_key=key)


def test_bad_json_and_a_body_too_large(server: tuple[str, Service]) -> None:
    url, _ = server
    bad = httpx.post(f"{url}/v1/templates/person/run", content=b'{"inputs": {', timeout=60,
                     headers=JSON)
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "bad_request")
    nan = httpx.post(f"{url}/v1/templates/person/run", content=b'{"inputs": {"name": NaN}}',
                     timeout=60, headers=JSON)
    assert nan.status_code == 400
    big = {"inputs": {"name": "x" * (1 << 20)}}
    too_large = post(url, "person", big)
    assert (too_large.status_code, too_large.json()["error"]["code"]) == (413, "body_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds as it is read
        yield b'{"inputs": {"name": "'
        for _ in range(40):
            yield b"y" * 65536
        yield b'"}}'

    chunked = httpx.post(f"{url}/v1/templates/person/run", content=chunks(), timeout=60,
                         headers=JSON)
    assert chunked.status_code == 413
    assert httpx.get(f"{url}/nowhere").json()["error"]["code"] == "not_found"


def test_an_input_too_long_or_too_deep_is_422_input_too_large(
        tiny: TransformersBackend) -> None:
    asgi = app({"person": qrun.Query(PERSON)}, model=tiny, max_input_chars=10,
               max_input_depth=2)
    with alarm(120), serving(asgi) as url:
        answers = [post(url, "person", {"inputs": {"name": name}})
                   for name in ("x" * 10, "x" * 11, [["a"]], [[["a"]]], {"k": ["x" * 11]},
                                {"k" * 11: 1}, {"k" * 10: {"y" * 50: "x" * 11}})]
        filled = post(url, "person", {"inputs": {"name": "Ada"}, "fill": {"city": "X" * 11}})
        batch = httpx.post(f"{url}/v1/templates/person/batch?fields=vars",
                           content=b'{"name": "Ada"}\n{"name": "abcdefghijk"}\n', timeout=120,
                           headers=NDJSON)
    assert [a.status_code for a in answers] == [200, 422, 200, 422, 422, 422, 422]
    # A key is a string too (issue #38: a 100,001-character key passed).
    assert "input name has a key of 11 characters" in answers[5].json()["error"]["message"]
    message = answers[6].json()["error"]["message"]
    assert message.startswith('input name["kkkkkkkkkk"] has a key of 50 characters')
    assert "yyyyyyyyyyy" not in message  # the key is not echoed
    for answer in answers[1:4:2] + answers[4:]:
        assert answer.json()["error"]["code"] == "input_too_large"
    assert "input name is a string of 11 characters" in answers[1].json()["error"]["message"]
    assert "deeper than 2 levels" in answers[3].json()["error"]["message"]
    assert "input name[\"k\"][0] is a string" in answers[4].json()["error"]["message"]
    assert filled.status_code == 422, filled.text
    assert filled.json()["error"]["message"].startswith("fill city is a string of 11")
    rows = [json.loads(line) for line in batch.text.splitlines()]
    assert "vars" in rows[0] and rows[1]["line"] == 2
    assert "at most 10 (--max-input-chars)" in rows[1]["error"]


def test_inputs_longer_than_the_models_context_are_422_context_too_long(
        server: tuple[str, Service]) -> None:
    """Issue #38: an input that overflows the model's context was a 500, not the client's
    4xx; openapi.json now lists 415, 502 and 503 too."""
    url, _ = server
    answer = post(url, "person", {"inputs": {"name": "word " * 9000}})  # over 4,096 tokens
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "context_too_long"
    assert "context" in answer.json()["error"]["message"]
    responses = httpx.get(f"{url}/openapi.json").json()["paths"][
        "/v1/templates/person/run"]["post"]["responses"]
    assert {"415", "422", "429", "502", "503", "504"} <= set(responses)


def test_the_size_limits_are_on_the_request_not_on_the_template_defaults(
        tiny: TransformersBackend) -> None:
    # A default longer than the limit is the template's, not the client's: a request that
    # leaves the input out is answered.
    template = ("---\ninputs:\n  name: string = " + "N" * 20 + "\n---\n"
                "Name: {{ name }}\nCity: {{ gen city max_tokens=3 }}\n")
    asgi = app({"person": qrun.Query(template)}, model=tiny, max_input_chars=10)
    with alarm(120), serving(asgi) as url:
        defaulted = post(url, "person", {"inputs": {}})
        given = post(url, "person", {"inputs": {"name": "x" * 11}})
    assert defaulted.status_code == 200, defaulted.text
    assert given.status_code == 422 and given.json()["error"]["code"] == "input_too_large"

def test_an_api_key_is_required_when_set(tiny: TransformersBackend) -> None:
    asgi = app({"person": qrun.Query(PERSON)}, model=tiny, api_key="s3cret")
    with serving(asgi) as url:
        assert httpx.get(f"{url}/healthz").status_code == 200
        missing = httpx.get(f"{url}/v1/templates")
        assert (missing.status_code, missing.json()["error"]["code"]) == (401, "unauthorized")
        wrong = httpx.get(f"{url}/v1/templates", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert httpx.get(f"{url}/metrics").status_code == 401
        right = post(url, "person", {"inputs": {"name": "Bo"}},
                     headers={"Authorization": "Bearer s3cret"})
        assert right.status_code == 200 and right.json()["vars"]["city"]


def test_concurrent_requests_are_batched_and_each_answered_as_alone(
        server: tuple[str, Service], tiny: TransformersBackend, gate: Gate) -> None:
    url, service = server
    questions = ["apples?", "a longer question about pears?", "why?"]
    with alarm(120), ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(post, url, "gated", {"inputs": {"q": q}}) for q in questions]
        wait_until(lambda: gate.arrived == 3)  # every run started, none has a forward yet
        gate.open.set()
        rows = [f.result().json() for f in futures]
    local = qrun.Query(GATED, functions={"wait": gate.wait})
    for q, row in zip(questions, rows, strict=True):
        alone = local.run({"q": q}, model=tiny)
        assert (row["text"], row["vars"]) == (alone.text, alone.vars)
    assert service.runner.forwards is not None
    assert service.largest_batch == 3  # the three runs shared forwards


def test_a_host_function_that_waits_holds_no_other_request(
        server: tuple[str, Service], gate: Gate) -> None:
    """Issue #38: a run inside a host function still counted in the batch, so every other
    run's forward waited for it (an echo template answered after 59 s)."""
    url, service = server
    with alarm(120), ThreadPoolExecutor(2) as pool:
        held = pool.submit(post, url, "gated", {"inputs": {"q": "held"}})
        wait_until(lambda: gate.arrived == 1)
        other = pool.submit(post, url, "person", {"inputs": {"name": "Ada"}})
        answer = other.result(timeout=100)  # answered while the gate stays shut
        assert answer.status_code == 200, answer.text
        assert not gate.open.is_set() and not held.done()
        gate.open.set()
        assert held.result().status_code == 200


def test_a_host_functions_failure_and_the_servers_paths_stay_in_its_log(
        tiny: TransformersBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue #38: the client got `boom() failed: ValueError: cannot open /etc/...` and
    positions with the server's absolute template path."""
    folder = tmp_path / "private-templates"
    folder.mkdir()
    (folder / "leaky.tmpl").write_text("Hello {{ who }}.\n{{ boom() }}\n")

    def boom() -> str:
        raise ValueError("cannot open /etc/qrun-secret.conf")

    asgi = app([str(folder)], model=tiny, functions={"boom": boom})
    with serving(asgi) as url, caplog.at_level("WARNING", logger="qrun.serve"):
        failed = post(url, "leaky", {"inputs": {"who": "Ada"}})
        missing = post(url, "leaky", {"inputs": {}})
        streamed = httpx.post(f"{url}/v1/templates/leaky/run", timeout=120,
                              json={"inputs": {"who": "Ada"}, "stream": True}).text
        batch = httpx.post(f"{url}/v1/templates/leaky/batch", content=b'{"who": "Ada"}\n',
                           headers=NDJSON, timeout=120).text
    error = failed.json()["error"]
    assert (failed.status_code, error["code"]) == (500, "host_function_error")
    assert error["message"] == "boom() failed (the server's log has why)"
    assert error["position"]["template"] == "leaky.tmpl"
    assert (error["position"]["line"], error["position"]["column"]) == (2, 4)
    assert missing.status_code == 422
    assert missing.json()["error"]["position"]["template"] == "leaky.tmpl"
    for answer in (failed.text, missing.text, streamed, batch):
        assert "secret" not in answer and "ValueError" not in answer
        assert str(tmp_path) not in answer and "private-templates" not in answer
    assert "host_function_error" in streamed and "boom() failed" in batch
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "ValueError: cannot open /etc/qrun-secret.conf" in logged
    assert failed.json()["request_id"] in logged


def test_a_first_template_without_holes_loads_the_weights_the_others_need(
        tiny_folder: str) -> None:
    """Issue #38: the model was loaded for the first template only: without holes, the
    tokenizer alone, and every other template failed "loaded without weights"."""
    templates = {"a_plain": qrun.Query("Hello {{ who }}."), "b_person": qrun.Query(PERSON)}
    asgi = app(templates, model=tiny_folder)
    with serving(asgi) as url:
        assert post(url, "a_plain", {"inputs": {"who": "Ada"}}).json()["text"] == "Hello Ada."
        answer = post(url, "b_person", {"inputs": {"name": "Ada"}})
        assert answer.status_code == 200, answer.text
    plain = app({"a_plain": qrun.Query("Hello {{ who }}.")}, model=tiny_folder)
    assert plain.state.qrun.backend.step_model() is None  # nothing needs the weights


def test_a_full_queue_answers_429_and_every_admitted_run_ends(
        server: tuple[str, Service], gate: Gate) -> None:
    url, service = server
    with alarm(120), ThreadPoolExecutor(5) as pool:
        admitted = [pool.submit(post, url, "gated", {"inputs": {"q": str(i)}})
                    for i in range(5)]  # 3 running, 2 queued
        wait_until(lambda: service.runs.active == 3 and service.runs.queued == 2)
        refused = post(url, "gated", {"inputs": {"q": "one too many"}})
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "queue_full"
        assert refused.headers["retry-after"] == "1"
        gate.open.set()
        assert [f.result().status_code for f in admitted] == [200] * 5
    metrics = httpx.get(f"{url}/metrics").text
    assert 'qrun_requests_total{status="429"}' in metrics
    assert 'qrun_requests_total{status="200"}' in metrics
    for name in ("qrun_queue_depth", "qrun_running_runs", "qrun_forward_batch_size_bucket",
                 "qrun_generated_tokens_total", "qrun_mask_seconds_total"):
        assert name in metrics


def test_queued_requests_that_time_out_or_leave_give_their_places_back(
        server: tuple[str, Service], gate: Gate) -> None:
    """Issue #38: a queued request that timed out (or whose client left) kept its place, so
    the queue filled with nobody and every later request got 429 `queue_full`."""
    url, service = server
    with alarm(120), ThreadPoolExecutor(6) as pool:
        running = [pool.submit(post, url, "gated", {"inputs": {"q": str(i)}}) for i in range(3)]
        wait_until(lambda: gate.arrived == 3)
        # Two queued requests that time out while they wait, then one whose client leaves.
        late = [pool.submit(post, url, "gated",
                            {"inputs": {"q": "late"}, "options": {"timeout": 0.2}})
                for _ in range(2)]
        assert [f.result().json()["error"]["code"] for f in late] == ["timeout"] * 2
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/templates/gated/run", json={"inputs": {"q": "gone"}},
                       timeout=httpx.Timeout(120, read=0.5))
        wait_until(lambda: service.runs.queued == 0)
        assert 'qrun_queue_depth 0.0' in httpx.get(f"{url}/metrics").text
        # The queue (2 places) takes two new requests; a third is one too many.
        queued = [pool.submit(post, url, "gated", {"inputs": {"q": f"new {i}"}})
                  for i in range(2)]
        wait_until(lambda: service.runs.queued == 2)
        assert post(url, "gated", {"inputs": {"q": "third"}}).status_code == 429
        gate.open.set()
        assert [f.result().status_code for f in running + queued] == [200] * 5


def test_a_batch_waiting_for_a_place_does_not_spin(
        server: tuple[str, Service], gate: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch line waiting while other requests fill the queue tries again now and then
    (issue #38: it tried 25,654 times in 3 s, a core spent on nothing)."""
    url, service = server
    tries = 0
    submit = service.runs.submit

    def counted(run: Any) -> Any:
        nonlocal tries
        tries += 1
        return submit(run)

    monkeypatch.setattr(service.runs, "submit", counted)
    with alarm(120), ThreadPoolExecutor(6) as pool:
        others = [pool.submit(post, url, "gated", {"inputs": {"q": str(i)}}) for i in range(5)]
        wait_until(lambda: service.runs.active == 3 and service.runs.queued == 2)
        tries = 0
        started = time.monotonic()
        batch = pool.submit(httpx.post, f"{url}/v1/templates/gated/batch",
                            content=b'{"q": "b1"}\n{"q": "b2"}\n', timeout=120,
                            headers=NDJSON)
        wait_until(lambda: tries >= 3)  # it has met the full queue and waited twice
        time.sleep(1.0)
        waited = time.monotonic() - started
        # A try after 0.05, 0.1, 0.2, 0.4 s, then every 0.5 s at most: a slower machine only
        # tries less often.
        assert tries <= 5 + 2 * waited, (tries, waited)
        gate.open.set()
        assert [f.result().status_code for f in others] == [200] * 5
        lines = batch.result().text.splitlines()
    assert [("error" in json.loads(line)) for line in lines] == [False, False]


def test_a_batch_given_up_on_logs_no_unread_outcome(
        server: tuple[str, Service], gate: Gate, caplog: pytest.LogCaptureFixture) -> None:
    """Issue #38: the runs of a batch that timed out ended later with RunCancelled, which
    nobody read: asyncio logged "Future exception was never retrieved" tracebacks."""
    url, service = server
    with alarm(120), caplog.at_level("ERROR", logger="asyncio"):
        batch = httpx.post(f"{url}/v1/templates/gated/batch?timeout=0.5",
                           content=b'{"q": "a"}\n{"q": "b"}\n', headers=NDJSON, timeout=120)
        assert [json.loads(line)["code"] for line in batch.text.splitlines()] == \
            ["timeout", "timeout"]
        gate.open.set()
        wait_until(lambda: service.runs.active == 0)
        httpx.get(f"{url}/healthz")  # the loop has run the runs' last callbacks by now
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_a_run_past_its_timeout_is_504_and_is_cancelled(
        server: tuple[str, Service], gate: Gate) -> None:
    url, service = server
    with alarm(120):
        late = post(url, "gated", {"inputs": {"q": "slow"}, "options": {"timeout": 0.2}})
        assert (late.status_code, late.json()["error"]["code"]) == (504, "timeout")
        assert service.runs.active == 1  # still at the gate
        gate.open.set()
        wait_until(lambda: service.runs.active == 0)  # it ended at its next forward


def test_streaming_sends_text_then_holes_then_done(server: tuple[str, Service]) -> None:
    url, _ = server
    body = {"inputs": {"name": "Ada"}, "stream": True}
    with httpx.stream("POST", f"{url}/v1/templates/person/run", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    kinds = [kind for kind, _ in events]
    assert kinds[-1] == "done" and "error" not in kinds
    done = events[-1][1]
    assert "".join(d["text"] for k, d in events if k == "text") == done["text"]
    holes = [(d["name"], d["value"]) for k, d in events if k == "hole"]
    assert holes == list(done["vars"].items())
    # The text before each hole's value is sent before the hole's event.
    assert kinds.index("hole") > kinds.index("text")
    assert done["text"].startswith("Name: Ada.\nAge: ")


def test_a_stream_ends_with_an_error_event_at_the_template_position(
        tiny: TransformersBackend) -> None:
    failing = qrun.Query('Start {{ gen x regex="[0-9]{5}" max_tokens=2 }}')
    asgi = app({"failing": failing}, model=tiny)
    with serving(asgi) as url:
        with httpx.stream("POST", f"{url}/v1/templates/failing/run", json={},
                          headers={"Accept": "text/event-stream"}, timeout=60) as r:
            events = sse_events(r.iter_lines())
        plain = post(url, "failing", {})
    kind, data = events[-1]
    assert kind == "error"
    # Five digits cannot fit two tokens: the value is cut off (a GenerationError of its own).
    assert data["error"]["code"] == "value_cut_off"
    assert data["error"]["position"]["line"] == 1
    assert data["error"]["position"]["column"] == 7
    assert (plain.status_code, plain.json()["error"]["code"]) == (500, "value_cut_off")


def test_loopback_addresses() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")


def test_a_batch_runs_each_line_and_answers_json_lines_in_order(
        server: tuple[str, Service], tiny: TransformersBackend) -> None:
    url, _ = server
    body = b"\n".join([b'{"id": 1, "name": "Ada"}', b'{"id": 2, "name": ', b"",
                       b'{"id": 3}', b'{"id": 4, "name": "Bo"}', b'{"id": 5, "name": "Cy"}',
                       b'{"id": 6, "name": "Di"}', b'[1]']) + b"\n"
    with alarm(120):
        response = httpx.post(f"{url}/v1/templates/person/batch?seed=5&id=id&fields=vars",
                              content=body, timeout=120, headers=NDJSON)
    assert response.status_code == 200, response.text
    rows = [json.loads(line) for line in response.text.splitlines()]
    assert [row["id"] for row in rows] == [1, None, 3, 4, 5, 6, None]
    assert [row.get("line") for row in rows] == [None, 2, 4, None, None, None, 8]
    assert "missing input 'name'" in rows[2]["error"]
    assert rows[1]["error"].startswith("line 2: invalid JSON")
    runnable = [{"name": n} for n in ("Ada", "Bo", "Cy", "Di")]
    local = qrun.Query(PERSON).run_many(runnable, model=tiny, seed=5)
    assert [row["vars"] for row in rows if "vars" in row] == [
        r.vars for r in local if isinstance(r, qrun.Result)]
    assert set(rows[0]) == {"id", "vars"}


def test_openapi_describes_each_template_and_its_answers_fit(
        server: tuple[str, Service]) -> None:
    import jsonschema

    url, _ = server
    document = httpx.get(f"{url}/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    assert {"/v1/templates/person/run", "/v1/templates/gated/batch"} <= set(document["paths"])
    schemas = document["components"]["schemas"]
    assert schemas["person.request"]["properties"]["inputs"]["required"] == ["name"]
    response = schemas["person.response"]
    assert response["properties"]["vars"]["properties"]["age"]["pattern"] == "^(?:[0-9]{1,2})$"
    row = post(url, "person", {"inputs": {"name": "Eve"}}).json()
    jsonschema.validate(row, response)
    with pytest.raises(jsonschema.ValidationError):  # the schema says something
        jsonschema.validate({**row, "vars": {**row["vars"], "age": "x"}}, response)


def test_a_client_that_goes_away_cancels_its_run(
        server: tuple[str, Service], gate: Gate) -> None:
    url, service = server
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"inputs": {"q": "never read"}}).encode()
    with alarm(120):
        client = socket.create_connection((host, int(port)))
        client.sendall(b"POST /v1/templates/gated/run HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Content-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_until(lambda: gate.arrived == 1)
        client.close()
        wait_until(lambda: 'qrun_requests_total{status="499"}' in
                   httpx.get(f"{url}/metrics").text)
        running = next(iter(service.runs.running))
        assert running.cancelled.is_set()
        gate.open.set()
        wait_until(lambda: service.runs.active == 0)
    with pytest.raises(RunCancelled):  # it ended at its next forward, not with a result
        running.future.result()



class SelfBatching(TransformersBackend):
    """The tiny model declared as a backend that batches itself (as vLLM is): the server's
    runs call it directly, with no ForwardScheduler between."""

    capabilities = dataclasses.replace(TransformersBackend.capabilities, batches_itself=True)


@pytest.mark.parametrize("kind", ["step model", "hole sampler"])
def test_a_run_on_a_backend_that_batches_itself_is_cancelled_at_its_next_call(
        tiny: TransformersBackend, gate: Gate, kind: str) -> None:
    # vLLM in process (its own step model) and a vLLM server (a hole sampler): no
    # ForwardScheduler sees their calls, so the run checks its cancellation at each one.
    template = 'Q: {{ q }}{{ wait() }}\nA: {{ gen a regex="[a-z]{2,6}" heal=false }}\n'
    backend: Any = (SelfBatching(tiny.model, tiny.tokenizer, "tiny-self-batching")
                    if kind == "step model" else ScriptedServer(tiny, ["ab", "cd"]))
    asgi = app({"gated": qrun.Query(template, functions={"wait": gate.wait})}, model=backend)
    service = asgi.state.qrun
    assert service.runner.forwards is None
    with alarm(120), serving(asgi) as url:
        late = post(url, "gated", {"inputs": {"q": "slow"}, "options": {"timeout": 0.2}})
        assert (late.status_code, late.json()["error"]["code"]) == (504, "timeout")
        ticket = next(iter(service.runs.running))
        gate.open.set()
        wait_until(lambda: service.runs.active == 0)
        with pytest.raises(RunCancelled):  # not run to its end
            ticket.future.result()
        answer = post(url, "gated", {"inputs": {"q": "next"}})
    assert answer.status_code == 200, answer.text
    if kind == "hole sampler":  # the cancelled run never asked the server
        assert len(backend.requests) == 1 and answer.json()["vars"]["a"] == "ab"

def _send_and_leave(url: str, path: str, body: bytes, gate: Gate, runs: int,
                    service: Service) -> list[Any]:
    """POST `body` to `path` on a raw connection, close it once `runs` runs wait at the gate,
    and return those runs' tickets once the server has cancelled them all."""
    host, port = url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)))
    client.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
    wait_until(lambda: gate.arrived == runs)
    tickets = list(service.runs.running)
    assert len(tickets) == runs
    client.close()
    wait_until(lambda: all(ticket.cancelled.is_set() for ticket in tickets))
    return tickets


def _counter(url: str, name: str) -> float:
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    return float(next(line.split()[1] for line in lines if line.startswith(name + " ")))


@pytest.mark.parametrize("path", ["/v1/templates/gated/run", "/v1/templates/gated/batch"])
def test_a_stream_or_a_batch_whose_client_goes_away_cancels_its_runs(
        server: tuple[str, Service], gate: Gate, path: str) -> None:
    url, service = server
    if path.endswith("/run"):
        body, runs = json.dumps({"inputs": {"q": "never read"}, "stream": True}).encode(), 1
    else:  # three lines: the server's three slots
        body, runs = b'{"q": "a"}\n{"q": "b"}\n{"q": "c"}\n{"q": "d"}\n', 3
    cancelled = _counter(url, "qrun_runs_cancelled_total")
    with alarm(120):
        tickets = _send_and_leave(url, path, body, gate, runs, service)
        gate.open.set()
        wait_until(lambda: service.runs.active == 0 and service.runs.queued == 0)
        for ticket in tickets:  # each ended at its next forward, not with a result
            with pytest.raises(RunCancelled):
                ticket.future.result()
        assert _counter(url, "qrun_runs_cancelled_total") == cancelled + runs
        assert gate.arrived == runs  # the batch's fourth line never started
        answer = post(url, "person", {"inputs": {"name": "Ada"}})  # the server goes on
    assert answer.status_code == 200, answer.text

WAIT_FOR_FILE = """
import os
import time

def wait() -> str:
    while not os.path.exists(os.environ["QRUN_TEST_FLAG"]):
        time.sleep(0.01)
    return ""

functions = {"wait": wait}
"""


class ServeProcess:
    """`qrun serve FOLDER` in a subprocess on a free port, the folder holding the gated
    template, whose host function waits for the file `flag` (the test decides when its runs
    go on)."""

    def __init__(self, tmp_path: Path, model: str, *flags: str) -> None:
        (tmp_path / "gated.tmpl").write_text(GATED)
        (tmp_path / "wait.py").write_text(WAIT_FOR_FILE)
        self.flag = tmp_path / "go"
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qrun.cli", "serve", str(tmp_path),
             "--functions", str(tmp_path / "wait.py"), "--model", model,
             "--port", str(port), "--log-level", "warning", *flags],
            stderr=subprocess.PIPE, text=True,
            env={**os.environ, "QRUN_TEST_FLAG": str(self.flag), "QRUN_API_KEY": ""})
        self.url = f"http://127.0.0.1:{port}"

    def metric(self, name: str) -> str:
        try:
            lines = httpx.get(f"{self.url}/metrics").text.splitlines()
        except httpx.TransportError:
            assert self.proc.poll() is None, self.proc.communicate()[1]
            return ""
        return next((line.split()[1] for line in lines if line.startswith(name + " ")), "")

    def health(self) -> int:
        return httpx.get(f"{self.url}/healthz").status_code

    def close(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.communicate(timeout=60)[1]


def stream(url: str, name: str, body: Any) -> list[tuple[str, Any]]:
    with httpx.stream("POST", f"{url}/v1/templates/{name}/run", json={**body, "stream": True},
                      timeout=120) as response:
        assert response.status_code == 200
        return sse_events(response.iter_lines())


def test_sigterm_drains_new_requests_503_while_those_accepted_finish_then_exits_0(
        tmp_path: Path, tiny_folder: str) -> None:
    server = ServeProcess(tmp_path, tiny_folder, "--max-running", "1")
    try:
        with alarm(300), ThreadPoolExecutor(3) as pool:
            wait_until(lambda: server.metric("qrun_running_runs") == "0.0")
            running = pool.submit(post, server.url, "gated", {"inputs": {"q": "running"}})
            wait_until(lambda: server.metric("qrun_running_runs") == "1.0")
            queued = pool.submit(stream, server.url, "gated", {"inputs": {"q": "queued"}})
            wait_until(lambda: server.metric("qrun_queue_depth") == "1.0")
            # A batch's second line is submitted only after its first ends: during the drain.
            batch = pool.submit(httpx.post, f"{server.url}/v1/templates/gated/batch",
                                content=b'{"q": "b1"}\n{"q": "b2"}\n', timeout=120,
                            headers=NDJSON)
            wait_until(lambda: server.metric("qrun_queue_depth") == "2.0")
            server.proc.send_signal(signal.SIGTERM)
            wait_until(lambda: server.health() == 503)  # still listening: a load balancer sees
            health = httpx.get(f"{server.url}/healthz").json()
            assert health["status"] == "draining" and health["error"]["code"] == "draining"
            refused = post(server.url, "gated", {"inputs": {"q": "too late"}})
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "draining"
            assert refused.headers["Retry-After"] == "1"
            assert refused.headers["Connection"] == "close"
            assert server.metric("qrun_queue_depth") == "2.0"  # still held, not dropped
            server.flag.write_text("")
            response = running.result()
            assert response.status_code == 200, response.text
            assert response.json()["text"].startswith("Q: running\nA: ")
            events = queued.result()
            assert events[-1][0] == "done", events
            assert events[-1][1]["text"].startswith("Q: queued\nA: ")
            rows = [json.loads(line) for line in batch.result().text.splitlines()]
            assert [row["text"][:6] for row in rows] == ["Q: b1\n", "Q: b2\n"]
            assert server.proc.wait() == 0
    finally:
        stderr = server.close()
    assert "Traceback" not in stderr, stderr


def test_past_the_drain_timeout_the_runs_left_are_answered_503_and_it_exits_0(
        tmp_path: Path, tiny_folder: str) -> None:
    # Also: the command serves a folder, and bound beyond the loopback it warns.
    server = ServeProcess(tmp_path, tiny_folder, "--drain-timeout", "1", "--host", "0.0.0.0")
    try:
        with alarm(300), ThreadPoolExecutor(2) as pool:
            wait_until(lambda: server.metric("qrun_running_runs") == "0.0")
            held = pool.submit(post, server.url, "gated", {"inputs": {"q": "held"}})
            streamed = pool.submit(stream, server.url, "gated", {"inputs": {"q": "held too"}})
            wait_until(lambda: server.metric("qrun_running_runs") == "2.0")
            server.proc.send_signal(signal.SIGTERM)
            response = held.result()  # answered although its run is still in the host function
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "draining"
            kind, data = streamed.result()[-1]
            assert kind == "error" and data["error"]["code"] == "draining"
            server.flag.write_text("")
            assert server.proc.wait() == 0
    finally:
        stderr = server.close()
    assert "Traceback" not in stderr, stderr
    assert "warning: 0.0.0.0 is reachable from other machines" in stderr



@pytest.mark.parametrize(("limits", "message"), [
    ({"max_running": 0}, "max_running must be ≥ 1, got 0"),
    ({"max_queue": True}, "max_queue must be an integer ≥ 0, got True"),
    ({"max_body_bytes": 1.5}, "max_body_bytes must be an integer ≥ 1, got 1.5"),
])
def test_a_bad_limit_of_app_is_a_usage_error_before_the_model_loads(
        tmp_path: Path, limits: dict[str, Any], message: str) -> None:
    # ServeOptions (qrun/serve/protocol.py) checks app()'s limits and the flags alike.
    (tmp_path / "person.tmpl").write_text(PERSON)
    with pytest.raises(UsageError, match=re.escape(message)):
        app([str(tmp_path)], model="no-such-model", **limits)


@pytest.mark.parametrize(("flag", "value"), [("--max-input-chars", "0"),
                                             ("--max-input-depth", "-1"),
                                             ("--max-queue", "-1")])
def test_a_bad_limit_flag_is_a_usage_error_before_the_model_loads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    from qrun.cli import main

    (tmp_path / "person.tmpl").write_text(PERSON)
    assert main(["serve", str(tmp_path), "--model", "no-such-model", flag, value]) == 2
    assert f"{flag} must be ≥" in capsys.readouterr().err
