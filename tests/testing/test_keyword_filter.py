"""`qrun test -k` (qrun/testing/keyword.py): pytest's keyword expressions, parsed, not eval'd."""

from __future__ import annotations

import pytest

from qrun.errors import UsageError
from qrun.testing.keyword import keyword_filter

IDS = ["ex/classify.tmpl::praise", "ex/classify.tmpl::sampled", "ex/extract.tmpl::invoice"]


@pytest.mark.parametrize("expression, chosen", [
    ("classify", [0, 1]),
    ("CLASSIFY and not sampled", [0]),
    ("invoice or praise", [0, 2]),
    ("not (classify or invoice)", []),
    ("extract.tmpl::", [2]),
])
def test_keyword_expressions_choose_cases(expression: str, chosen: list[int]) -> None:
    match = keyword_filter(expression)
    assert [i for i, name in enumerate(IDS) if match(name)] == chosen


@pytest.mark.parametrize("expression", ["", "a and", "(a", "a )", "and a", "a b",
                                        "__import__('os')"])
def test_malformed_expressions_are_usage_errors(expression: str) -> None:
    with pytest.raises(UsageError, match="-k"):
        keyword_filter(expression)


def test_deep_nesting_is_a_usage_error_not_a_crash() -> None:
    with pytest.raises(UsageError, match="nest at most"):
        keyword_filter("(" * 3000 + "a" + ")" * 3000)
    with pytest.raises(UsageError, match="nest at most"):
        keyword_filter("not " * 3000 + "a")
