"""A declared input's `pattern` is searched with a time bound (lang/simple_schema.py
pattern_problem; issue #38): a pattern that backtracks catastrophically on a value is an input
error naming it, within seconds, not a run held for minutes. Both ways a type is checked: a
simple schema by qrun, any other by jsonschema with the same bounded search."""

from __future__ import annotations

import pytest

import qrun
from tests.hang import alarm

SLOW = "^(a|aa)+$"  # Fibonacci many ways to split a run of a's; Python's re never ends


@pytest.mark.parametrize("declared", [
    f'{{"type": "string", "pattern": "{SLOW}"}}',  # simple
    f'{{"anyOf": [{{"type": "string", "pattern": "{SLOW}"}}, {{"type": "integer"}}]}}',
])
def test_a_catastrophic_pattern_is_an_input_error_not_a_hang(declared: str) -> None:
    query = qrun.Query(f"---\ninputs:\n  s: {declared}\n---\n{{{{ s }}}}\n")
    with alarm(60), pytest.raises(qrun.UsageError, match="took longer than 1 s") as info:
        query.request({"s": "a" * 60 + "b"})
    assert "a" * 61 not in str(info.value)  # the value is shown cut short
    assert query.request({"s": "aaaa"}) is not None  # a value that fits still passes
