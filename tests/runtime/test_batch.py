"""Batched runs: the same results as sequential uncached runs, one forward per step for the
whole batch, failures kept to their own run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import QrunError
from qrun.runtime.prefix_cache import PrefixCache

TEMPLATE = (
    "{% system %}You answer briefly.{% endsystem %}{% user %}{{ q }}{% enduser %}"
    "{% assistant %}Answer: {{ gen a max_tokens=6 stop=\"\\n\" }}\n"
    "Code: {{ gen c regex=\"[A-Z]{2}-[0-9]{1,3}\" }}\n"
    "Sure? {{ select s options=[\"yes\", \"no\", \"maybe not\"] }}{% endassistant %}"
)
INPUTS = [{"q": f"Question number {i}: what is {i} + {i}?"} for i in range(9)]


class CountingBackend(TransformersBackend):
    """Counts model calls (batched or not) to check runs share forwards."""

    calls = 0

    def forward(self, token_ids: Sequence[int], cache: Any, logits_for: int = 1) -> Any:
        CountingBackend.calls += 1
        return super().forward(token_ids, cache, logits_for)

    def forward_batch(self, items: Any, logits_for: int = 1) -> Any:
        CountingBackend.calls += 1
        return super().forward_batch(items, logits_for)


def test_batched_equals_sequential_uncached(tiny: TransformersBackend) -> None:
    query = qrun.Query(TEMPLATE)
    sequential = query.run_many(INPUTS, model=tiny)
    backend = CountingBackend(tiny.model, tiny.tokenizer, "counting",
                              prefix_cache=PrefixCache())
    CountingBackend.calls = 0
    batched = query.run_many(INPUTS, model=backend, batch_size=4)
    assert all(isinstance(r, qrun.Result) for r in batched)
    values = [{k: v for k, v in r.vars.items() if not k.endswith("__logprobs")}  # type: ignore[union-attr]
              for r in batched]
    assert values == [{k: v for k, v in r.vars.items() if not k.endswith("__logprobs")}  # type: ignore[union-attr]
                      for r in sequential]
    for b, s in zip(batched, sequential, strict=True):
        for option, logprob in s.vars["s__logprobs"].items():  # type: ignore[union-attr]
            assert abs(b.vars["s__logprobs"][option] - logprob) < 1e-3  # type: ignore[union-attr]
    assert [r.text for r in batched] == [r.text for r in sequential]  # type: ignore[union-attr]
    per_run_calls = sum(r.stats.forward_calls for r in batched)  # type: ignore[union-attr]
    assert CountingBackend.calls < per_run_calls / 2  # forwards were shared across runs
    shared = batched[1].stats.cached_tokens  # type: ignore[union-attr]
    assert shared > 0


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
