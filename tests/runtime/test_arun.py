"""Query.arun (qrun/runtime/admission.py, docs/serve.md §3): awaited runs of concurrent
coroutines share the model's forwards, each with the result a run alone gives."""

from __future__ import annotations

import asyncio

import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.runtime.admission import RunScheduler
from tests.hang import alarm
from tests.serve.serving import Gate, wait_until

GATED = 'Q: {{ q }}{{ wait() }}\nA: {{ gen a regex="[a-z]{2,6}" }} {{ gen n regex="[0-9]{2}" }}\n'


def test_concurrent_aruns_are_batched_and_equal_runs_alone(tiny: TransformersBackend) -> None:
    gate = Gate()
    query = qrun.Query(GATED, functions={"wait": gate.wait})
    questions = ["apples?", "a longer question about pears?", "why?"]

    async def main() -> list[qrun.Result]:
        tasks = [asyncio.create_task(query.arun({"q": q}, model=tiny)) for q in questions]
        await asyncio.to_thread(wait_until, lambda: gate.arrived == 3)
        gate.open.set()
        return await asyncio.gather(*tasks)

    with alarm(120):
        results = asyncio.run(main())
    for q, result in zip(questions, results, strict=True):
        alone = query.run({"q": q}, model=tiny)
        assert (result.text, result.vars) == (alone.text, alone.vars)
    forwards = RunScheduler.shared(tiny).forwards
    assert forwards is not None and forwards.largest_batch == 3


def test_an_arun_error_is_raised_to_the_awaiting_coroutine(tiny: TransformersBackend) -> None:
    query = qrun.Query('Start {{ gen x regex="[0-9]{5}" max_tokens=2 }}')
    with alarm(60), pytest.raises(qrun.GenerationError) as failure:
        asyncio.run(query.arun(model=tiny))
    assert failure.value.span.column == 7
