"""The transformers adapter passes the KV cache under the name the installed transformers
takes (backends/transformers.py cache_argument): from 5.2x on `past_key_values` still works
but prints a FutureWarning at every run, in the middle of the CLI's output. The suite's
settings ignore FutureWarnings (pyproject.toml), so these tests turn them into errors."""

from __future__ import annotations

import warnings
from typing import Any

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


class _NewModel:
    """A forward as transformers 5.2x writes it."""

    def forward(self, input_ids: Any = None, cache: Any = None, use_cache: Any = None) -> None:
        pass


class _OldModel:
    """A forward as transformers before 5.2x writes it."""

    def forward(self, input_ids: Any = None, past_key_values: Any = None,
                use_cache: Any = None) -> None:
        pass


def test_the_cache_goes_under_the_name_forward_takes() -> None:
    assert cache_argument(_NewModel()) == "cache"
    assert cache_argument(_OldModel()) == "past_key_values"


def test_an_unreadable_signature_falls_back_to_past_key_values() -> None:
    assert cache_argument(object()) == "past_key_values"
