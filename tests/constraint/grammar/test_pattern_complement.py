"""The complement patterns of qrun/constraint/grammar/pattern_complement.py: on random
strings (no line break: Python's `$` also matches before a final one, ECMA-262's does not),
the complement matches exactly where the pattern does not, as `pattern` searches."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qrun.constraint.grammar.pattern_complement import not_pattern

PATTERNS = [r"^[.,*\\\-\s{}()]+$", r"^[a-c]*$", r"^[^abc]+$", r"^\d+$", r"^\S*$", r"(\$)",
            "a", r"[xyz]", r"\w", r"^-+$", r"^\.*$"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_complement_matches_where_the_pattern_does_not(pattern: str) -> None:
    other = not_pattern(pattern)
    assert other is not None

    @settings(max_examples=300, deadline=None, database=None)
    @given(st.text(alphabet="abcxyz019 .,*\\-{}()$\t\u00e9_", max_size=6))
    def complement(text: str) -> None:
        assert (re.search(other, text) is None) == (re.search(pattern, text) is not None), \
            (text, other)

    complement()


@pytest.mark.parametrize("pattern", ["ab", "^a+b$", "[xyz]$", "^[a-c]{2}$", r"\b", "[]a]",
                                     "[^]", "^[[:alpha:]]+$", r"\p{L}", "a|b", r"^\q+$"])
def test_other_shapes_have_no_form_here(pattern: str) -> None:
    assert not_pattern(pattern) is None
