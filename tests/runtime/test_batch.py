"""Batched runs: the same results as sequential uncached runs, one forward per step for the
whole batch, failures kept to their own run."""

from __future__ import annotations

from typing import Any

from doubles import SteeredModel

import qrun
from qrun.backends.prefix_cache import PrefixCache
from qrun.backends.transformers import TransformersBackend
from qrun.errors import QrunError
from qrun.runtime.result import SelectRecord

TEMPLATE = (
    "{% system %}You answer briefly.{% endsystem %}{% user %}{{ q }}{% enduser %}"
    "{% assistant %}Answer: {{ gen a max_tokens=6 stop=\"\\n\" }}\n"
    "Code: {{ gen c regex=\"[A-Z]{2}-[0-9]{1,3}\" }}\n"
    "Sure? {{ select s options=[\"yes\", \"no\", \"maybe not\"] }}{% endassistant %}"
)
INPUTS = [{"q": f"Question number {i}: what is {i} + {i}?"} for i in range(9)]


def test_batched_equals_sequential_uncached(tiny: TransformersBackend) -> None:
    query = qrun.Query(TEMPLATE)
    sequential = query.run_many(INPUTS, model=tiny)
    backend = SteeredModel(tiny, name="counting", prefix_cache=PrefixCache())
    batched = query.run_many(INPUTS, model=backend, batch_size=4)
    results = [r for r in batched if isinstance(r, qrun.Result)]
    singles = [r for r in sequential if isinstance(r, qrun.Result)]
    assert len(results) == len(singles) == len(INPUTS)
    assert [r.vars for r in results] == [r.vars for r in singles]
    for b, s in zip(results, singles, strict=True):
        b_select, s_select = b.holes["s"], s.holes["s"]
        assert isinstance(b_select, SelectRecord) and isinstance(s_select, SelectRecord)
        for option, logprob in s_select.option_logprobs.items():
            assert abs(b_select.option_logprobs[option] - logprob) < 1e-3
    assert [r.text for r in results] == [r.text for r in singles]
    per_run_calls = sum(r.stats.forward_calls for r in results)
    assert backend.calls < per_run_calls / 2  # forwards were shared across runs
    assert results[1].stats.cached_tokens > 0


def test_a_bad_input_fails_alone(tiny: TransformersBackend) -> None:
    inputs: list[dict[str, Any]] = [*INPUTS[:3], {"not_q": 1}, *INPUTS[3:5]]
    seen: list[int] = []
    results = qrun.Query(TEMPLATE).run_many(inputs, model=tiny, batch_size=3,
                                            on_result=lambda i, _: seen.append(i))
    assert isinstance(results[3], QrunError) and "missing input 'q'" in str(results[3])
    good = [r for i, r in enumerate(results) if i != 3]
    assert all(isinstance(r, qrun.Result) for r in good)
    assert sorted(seen) == list(range(len(inputs)))


def test_batch_size_one_and_empty_inputs(tiny: TransformersBackend) -> None:
    query = qrun.Query(TEMPLATE)
    assert query.run_many([], model=tiny, batch_size=4) == []
    one = query.run_many(INPUTS[:1], model=tiny, batch_size=4)
    assert isinstance(one[0], qrun.Result)
