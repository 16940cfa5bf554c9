"""The transformers adapter passes the KV cache under the name the installed transformers
takes (backends/transformers.py cache_argument): from 5.2x on `past_key_values` still works
but prints a FutureWarning at every run, in the middle of the CLI's output. The suite's
settings ignore FutureWarnings (pyproject.toml), so these tests turn them into errors."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import qrun
from qrun.backends.tiny import load_tiny
from qrun.backends.transformers import cache_argument

TEMPLATE = ('Say: {{ gen a max_tokens=3 }} then {{ select b options=["red", "green"] }} '
            'and {{ gen c regex="[0-9]{2}" }}')


def test_runs_single_batched_and_select_warn_nothing() -> None:
    backend = load_tiny(seed=1)
    query = qrun.Query(TEMPLATE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one = query.run(model=backend, seed=0)
        many = query.run_many([{}, {}, {}], model=backend, batch_size=3, seed=0)
    assert len(one.vars["c"]) == 2 and one.vars["b"] in ("red", "green")
    assert [r.text for r in many] == [one.text] * 3


def _model_with(parameter: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(f"def forward(self, input_ids=None, {parameter}=None, use_cache=None): pass", namespace)
    return type(f"Model_{parameter}", (), {"forward": namespace["forward"]})()


@pytest.mark.parametrize("parameter", ["cache", "past_key_values"])
def test_the_cache_goes_under_the_name_forward_takes(parameter: str) -> None:
    assert cache_argument(_model_with(parameter)) == parameter


def test_an_unreadable_signature_falls_back_to_past_key_values() -> None:
    assert cache_argument(object()) == "past_key_values"
