"""A syntax error does not hide the template's other errors (qrun/lang/recover.py,
docs/language.md §13): its tag is blanked and the rest is parsed and compiled, without the
errors a blanked tag may cause."""

from __future__ import annotations

import pytest

import qrun
from qrun.errors import TemplateErrors


def errors_of(text: str) -> list[tuple[int, int, str]]:
    with pytest.raises(TemplateErrors) as raised:
        qrun.Query(text, name="t.tmpl")
    return [(e.span.line, e.span.column, e.message) for e in raised.value.errors]


def test_errors_before_and_after_a_syntax_error_are_reported() -> None:
    found = errors_of("---\ninputs: [question]\n---\n{{ questoin }}\n{{ gen a regex=EMIAL }}\n"
                      "{% iff x %}\n{{ gen b max_tokens=0 }}\n")
    assert [(line, column) for line, column, _ in found] == [(4, 4), (5, 16), (6, 1), (7, 21)]
    assert "unknown tag 'iff'" in found[2][2]
    assert found[3][2] == "max_tokens must be a positive integer, got 0"


def test_several_syntax_errors_are_each_reported() -> None:
    found = errors_of("{% set x = %}\n{{ y | nope }}\n{{ gen 5 }}\n")
    assert [(line, message.split(":")[0]) for line, _, message in found] == [
        (1, "unexpected '%}'"), (2, "unknown function 'nope'"), (3, "unexpected '5'")]


def test_what_a_blanked_tag_causes_is_not_reported() -> None:
    # The blanked set leaves x unknown; the blanked if leaves its endif alone: neither is
    # the user's mistake.
    assert [m for _, _, m in errors_of("{% set x = %}{{ x }}")] == [
        "unexpected '%}'"]
    found = errors_of("{% if a = 1 %}X{% endif %}\n{{ gen b max_tokens=0 }}\n")
    assert [m.split(":")[0] for _, _, m in found] == ["unexpected '='"]


def test_an_unclosed_tag_is_reported_alone() -> None:
    found = errors_of("Hi {{ gen a regex=EMIAL }} {{ unclosed\n")
    assert len(found) == 1 and "is never closed" in found[0][2]
