"""Query.arun (qrun/runtime/runner.py, docs/serve.md §3): awaited runs of concurrent
coroutines share the model's forwards, each with the result a run alone gives."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.runtime.runner import Runner
from tests.hang import alarm, wait_until
from tests.serve.serving import Gate

GATED = 'Q: {{ q }}{{ wait() }}\nA: {{ gen a regex="[a-z]{2,6}" }} {{ gen n regex="[0-9]{2}" }}\n'


def test_concurrent_aruns_are_batched_and_equal_runs_alone(tiny: TransformersBackend) -> None:
    gate = Gate()
    query = qrun.Query(GATED, functions={"wait": gate.wait})
    questions = ["apples?", "a longer question about pears?", "why?"]
    batches: list[int] = []
    stop = Runner.of(tiny).watch_batches(batches.append)

    async def main() -> list[qrun.Result]:
        tasks = [asyncio.create_task(query.arun({"q": q}, model=tiny)) for q in questions]
        await asyncio.to_thread(wait_until, lambda: gate.arrived == 3)
        gate.open.set()
        return await asyncio.gather(*tasks)

    with alarm(120):
        results = asyncio.run(main())
    stop()
    for q, result in zip(questions, results, strict=True):
        alone = query.run({"q": q}, model=tiny)
        assert (result.text, result.vars) == (alone.text, alone.vars)
    assert max(batches) == 3


def test_an_arun_error_is_raised_to_the_awaiting_coroutine(tiny: TransformersBackend) -> None:
    query = qrun.Query('Start {{ gen x regex="[0-9]{5}" max_tokens=2 }}')
    with alarm(60), pytest.raises(qrun.GenerationError) as failure:
        asyncio.run(query.arun(model=tiny))
    assert failure.value.span.column == 7


def test_astream_yields_text_then_holes_then_the_result(tiny: TransformersBackend) -> None:
    query = qrun.Query('Name: {{ name }}.\nAge: {{ gen age regex="[0-9]{1,2}" }}\n'
                       'City: {{ gen city regex="[A-Z][a-z]{2,7}" }}\n')

    async def main() -> list[qrun.RunEvent]:
        return [event async for event in query.astream({"name": "Ada"}, model=tiny)]

    with alarm(60):
        events = asyncio.run(main())
    assert events[-1].kind == "done" and events[-1].result is not None
    result = events[-1].result
    assert "".join(e.text for e in events if e.kind == "text") == result.text
    assert [(e.name, e.value) for e in events if e.kind == "hole"] == list(result.vars.items())
    kinds = [e.kind for e in events]
    assert kinds.index("text") < kinds.index("hole")
    assert result.vars == query.run({"name": "Ada"}, model=tiny).vars


def test_leaving_astream_early_and_closing_the_loop_logs_nothing(
        tiny: TransformersBackend, caplog: pytest.LogCaptureFixture) -> None:
    # The caller breaks out after the first event and asyncio.run closes the loop while the
    # run is still in a host call in its thread; the run then ends (cancelled at its next
    # forward) and its last event has no loop to go to: dropped, no "Event loop is closed"
    # traceback in the log (issue #38).
    release = threading.Event()
    threads: list[threading.Thread] = []  # the host call's, once it has begun

    def slow() -> str:
        threads.append(threading.current_thread())
        release.wait(60)
        return "."

    query = qrun.Query("A {{ slow() }} B {{ gen b max_tokens=4 }}",
                       functions=qrun.Functions({"slow": slow}))
    # "A " is streamed before the host call
    leave_the_stream(query, lambda: bool(threads), release, model=tiny)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")], \
        caplog.text


def test_a_run_left_while_its_particles_step_stops_at_their_next_step(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # A particle step's forward goes through the cancellable model as a run's other forwards
    # do: a run whose stream was left while its particles were stepping ends at their next
    # step, not after the hole's last (6 steps before: token by token, TAIL_BYTES 0).
    from qrun.runtime import particles as particles_module

    monkeypatch.setattr(particles_module, "TAIL_BYTES", 0)
    steps: list[int] = []
    left = threading.Event()
    step = particles_module.resampled

    def resampled_held(*args: object) -> object:
        steps.append(len(steps))
        if len(steps) == 1:
            left.wait(60)  # the caller leaves the stream meanwhile
        return step(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(particles_module, "resampled", resampled_held)
    query = qrun.Query('A {{ gen x regex="[ab]{12}" sampler="smc" particles=4 }} B')
    leave_the_stream(query, lambda: bool(steps), left, model=tiny, temperature=1.0, seed=1)
    assert steps == [0], steps


def leave_the_stream(query: qrun.Query, begun: Callable[[], bool], release: threading.Event,
                     **options: Any) -> None:
    """Break out of `query.astream(**options)` after its first event once `begun()` holds,
    let asyncio.run close the loop, then `release` the run (held meanwhile in its thread) and
    check that it ends."""

    async def main() -> None:
        async for _ in query.astream(**options):
            await asyncio.to_thread(wait_until, begun)
            break

    with alarm(60):
        asyncio.run(main())
        runs = [t for t in threading.enumerate() if t.name.startswith("qrun-run-")]
        release.set()
        for thread in runs:
            thread.join(60)
    assert runs and not any(thread.is_alive() for thread in runs)
