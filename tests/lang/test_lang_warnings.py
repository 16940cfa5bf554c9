"""Compile-time warnings (docs/language.md §9, §13; lang/lint.py): a loop's capture, the list of
its values, compared with one literal value. Each warning has its position, message and notes,
like an error, and never stops the compile."""

from __future__ import annotations

from pathlib import Path

import pytest

import qrun
from qrun.errors import TemplateWarning
from qrun.lang import compile_source

DOCS = Path(__file__).resolve().parents[2] / "docs/language.md"


def warnings_of(text: str) -> tuple[TemplateWarning, ...]:
    return compile_source(text, "t.tmpl").warnings


LOOP = '{% for i in range(3) %}{{ gen m }}{% if m == "a" %}x{% endif %}{% endfor %}'


def test_a_loop_capture_compared_with_a_string_is_a_warning_at_the_comparison() -> None:
    warning, = warnings_of(LOOP)
    assert (warning.span.line, warning.span.column) == (1, 41)
    assert (warning.span.end_line, warning.span.end_column) == (1, 49)
    assert warning.message.startswith("'m' is a list here")
    assert "so `m == \"a\"` is always false" in warning.message
    assert warning.notes[0] == 'compare the latest value: `m[-1] == "a"`'
    assert warning.notes[1] == '`"a" in m` asks whether any value is "a"'
    assert warning.render().startswith("t.tmpl:1:41: warning: 'm' is a list here")


def test_the_docs_example_is_this_warning() -> None:
    text = '{% for i in range(3) %}\n{{ gen m }}{% if m == "a" %}!{% endif %}\n{% endfor %}'
    warning, = warnings_of(text)
    assert warning.render() in DOCS.read_text(encoding="utf-8")


@pytest.mark.parametrize(("comparison", "column", "outcome"), [
    ('m != "b"', 4, "is always true"),
    ('"b" == m', 4, "is always false"),
    ("m == 3", 4, "is always false"),
    ("m == -1.5", 4, "is always false"),
    ("m == none", 4, "is always false"),
    ('m in ["a", "b"]', 4, "is always false"),
    ('m not in ["a", "b"]', 4, "is always true"),
    ('m in "abc"', 4, "fails when it runs"),
    ('1 < m == "a"', 8, "is always false"),  # one link of a chain
    ('(m == "a") or x', 5, "is always false"),
])
def test_comparisons_that_warn(comparison: str, column: int, outcome: str) -> None:
    # After the loop, at any depth of nested loops: the name is the list.
    text = ("{% for i in xs %}{% for j in ys %}{{ gen m }}{% endfor %}{% endfor %}\n"
            f"{{{{ {comparison} }}}}")
    warning, = warnings_of(text)
    assert (warning.span.line, warning.span.column) == (2, column)
    assert f"` {outcome}" in warning.message
    assert "m[-1]" in warning.notes[0]


@pytest.mark.parametrize("text", [
    '{% for i in xs %}{{ gen m }}{% if m[-1] == "a" %}!{% endif %}{% endfor %}',
    '{% for i in xs %}{{ gen m }}{{ m | length }}{% endfor %}{{ m | length == 3 }}',
    '{% for i in xs %}{{ gen m }}{% endfor %}{{ "a" in m }}{{ "a" not in m }}',
    '{% for i in xs %}{{ gen m }}{% endfor %}{{ m == other }}{{ m == ["a", "b"] }}',
    '{% for i in xs %}{{ gen m }}{% endfor %}{{ m[0] == "a" and m | first == "b" }}',
    '{{ gen m }}{{ m == "a" }}',  # outside a loop the value is one string
    '{% for i in xs %}{% if i %}{{ gen m }}{% endif %}{% endfor %}'
    '{% for m in ys %}{{ m == "a" }}{% endfor %}',  # a loop variable hides the capture
    '{% if c %}{{ gen m }}{% else %}{% for i in xs %}{{ gen m }}{% endfor %}{% endif %}'
    '{{ m == "a" }}',  # one value on one path, a list on the other
])
def test_comparisons_that_do_not_warn(text: str) -> None:
    assert warnings_of(text) == ()


def test_inside_the_loop_branch_the_capture_is_a_list() -> None:
    text = ('{% if c %}{% for i in xs %}{{ gen m }}{% endfor %}{{ m == "a" }}'
            "{% else %}{{ gen m }}{% endif %}")
    warning, = warnings_of(text)
    assert warning.span.column == 54


def test_a_warning_in_an_included_file_is_reported_there(tmp_path: Path) -> None:
    (tmp_path / "part.tmpl").write_text('{{ gen m }}\n{% if m == "x" %}!{% endif %}',
                                        encoding="utf-8")
    (tmp_path / "main.tmpl").write_text(
        '{% for i in range(2) %}\n{% include "part.tmpl" %}\n{% endfor %}', encoding="utf-8")
    warning, = qrun.Query.from_file(tmp_path / "main.tmpl").warnings
    assert warning.source.name.endswith("part.tmpl")
    assert (warning.span.line, warning.span.column) == (2, 7)
    assert warning.notes[-1] == f"included from {tmp_path / 'main.tmpl'}:2:1"


def test_query_exposes_warnings_and_they_do_not_stop_the_compile() -> None:
    query = qrun.Query(LOOP)
    assert query.warnings == query.program.warnings and len(query.warnings) == 1
    assert isinstance(query.warnings[0], qrun.TemplateWarning)
    assert str(query.warnings[0]) == query.warnings[0].render()
    assert qrun.Query('{{ gen m }}{{ m == "a" }}').warnings == ()


def test_several_warnings_come_in_source_order() -> None:
    text = ('{% for i in xs %}{{ gen m }}{{ gen n }}{% endfor %}'
            '{{ n == "b" }}\n{{ m == "a" }}{{ m != 1 }}')
    assert [(w.span.line, w.span.column) for w in warnings_of(text)] == [(1, 55), (2, 4),
                                                                           (2, 18)]


def test_a_particles_block_without_a_hole_is_a_warning_at_its_tag() -> None:
    warning, = warnings_of("A {% particles 4 %}hello {{ x }}{% endparticles %}")
    assert (warning.span.line, warning.span.column) == (1, 3)
    assert warning.message.startswith("this particles block has no hole")
    # A hole, or a call that may hold one (a macro's), anywhere inside: no warning.
    for body in ('{{ gen y regex="(a|b)" }}', '{% if x %}{{ select y options=["a"] }}{% endif %}',
                 "{{ m() }}"):
        text = ('{% macro m() %}{{ gen z regex="(a|b)" }}{% endmacro %}'
                f"A {{% particles 4 %}}{body}{{% endparticles %}}")
        assert not warnings_of(text), body
