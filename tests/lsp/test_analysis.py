"""The language server's analysis functions (qrun/lsp/), without the protocol: each takes a
document's text and path and gives plain data, so what it says is checked here directly."""

from __future__ import annotations

from pathlib import Path

import pytest

from qrun.errors import TemplateErrors
from qrun.lang import compile_file
from qrun.lsp.analysis import Range, analyze
from qrun.lsp.completion import ARGUMENT, CAPTURE, INPUT, PATTERN, completion
from qrun.lsp.definition import definition
from qrun.lsp.diagnostics import ERROR, WARNING, diagnostics
from qrun.lsp.hover import hover
from qrun.lsp.symbols import HOLE, symbols

TYPED = """---
inputs:
  topic:
    type: string
    description: what to write about
  count: integer = 3
---
About {{ topic }}, {{ count }} times:
{% for i in range(count) %}{{ gen line stop="\\n" }}{% endfor %}
When: {{ gen when regex=DATE }}
{{ select mood options=["good", "bad"] }} {{ when }}
"""


def _labels(text: str, line: int, character: int, kind: str | None = None) -> list[str]:
    return [item.label for item in completion(text, "/t/t.tmpl", line, character)
            if kind is None or item.kind == kind]


def test_completion_takes_names_from_the_last_text_that_parsed() -> None:
    typing = TYPED + "{{ "  # does not parse
    names = [item.label for item in completion(typing, "/t/t.tmpl", 11, 3,
                                               analyze(TYPED, "/t/t.tmpl"))]
    assert {"topic", "count", "line", "when", "mood", "i"} <= set(names)


def test_diagnostics_are_what_check_reports_each_error_at_its_place(tmp_path: Path) -> None:
    text = "{{ gen a regex=DAET }}\n{{ gen b max_tokens=0 }}\n{{ nope(1) }}\n"
    path = tmp_path / "t.tmpl"
    path.write_text(text)
    with pytest.raises(TemplateErrors) as raised:
        compile_file(path)
    found = diagnostics(text, str(path))
    assert [(d.range.line + 1, d.range.character + 1, d.message.split("\n")[0])
            for d in found] == [(e.span.line, e.span.column, e.message)
                                for e in raised.value.errors]
    assert len(found) == 3 and all(d.severity == ERROR for d in found)
    assert "note: did you mean 'DATE'?" in found[0].message


def test_a_warning_is_a_diagnostic_of_its_own_severity() -> None:
    text = '---\ninputs:\n  name: string\n---\n{% for c in name %}{{ c }}{% endfor %}'
    [found] = diagnostics(text, "/t/t.tmpl")
    assert found.severity == WARNING and found.range.line == 4
    assert found.message.startswith("'name' is declared as string, so a loop over it")


def test_an_include_outside_the_folder_is_refused_as_the_compiler_refuses_it(
        tmp_path: Path) -> None:
    (tmp_path / "secret.tmpl").write_text("x")
    (tmp_path / "inner").mkdir()
    text = '{% include "../secret.tmpl" %}'
    [found] = diagnostics(text, str(tmp_path / "inner" / "t.tmpl"))
    assert "outside the folder" in found.message
    assert definition(text, str(tmp_path / "inner" / "t.tmpl"), 0, 14) is None


def test_definition_of_an_include_a_call_and_a_capture(tmp_path: Path) -> None:
    (tmp_path / "part.tmpl").write_text("Part\n")
    (tmp_path / "sub.tmpl").write_text("{{ gen s }}\n")
    path = str(tmp_path / "t.tmpl")
    text = ('{% include "part.tmpl" %}\n{{ gen answer }}\n{{ call("sub.tmpl") }} '
            "{{ answer | upper }}\n")
    assert definition(text, path, 0, 14) == definition(text, path, 0, 2)
    include = definition(text, path, 0, 14)
    assert include is not None and include.path == str(tmp_path / "part.tmpl")
    called = definition(text, path, 2, 10)
    assert called is not None and called.path == str(tmp_path / "sub.tmpl")
    capture = definition(text, path, 2, 28)
    assert capture is not None and capture.path == path
    assert capture.range == Range(1, 7, 1, 13)


def test_hover_on_an_input_shows_its_declared_type_and_uses() -> None:
    found = hover(TYPED, "/t/t.tmpl", 7, 10)
    assert found is not None and found.range == Range(7, 9, 7, 14)
    assert "**input, required** `topic`" in found.markdown
    assert "what to write about" in found.markdown
    assert '"type": "string"' in found.markdown
    assert "used at 8:10" in found.markdown
    count = hover(TYPED, "/t/t.tmpl", 7, 23)
    assert count is not None and "default `3`" in count.markdown


def test_hover_on_a_hole_its_capture_and_a_pattern_name() -> None:
    in_loop = hover(TYPED, "/t/t.tmpl", 8, 35)
    assert in_loop is not None
    assert in_loop.markdown.startswith("**gen** `line` → list (one per loop iteration) of (str)")
    assert '`stop="\\n"`' in in_loop.markdown
    select = hover(TYPED, "/t/t.tmpl", 10, 5)
    assert select is not None and 'options: `["good", "bad"]`' in select.markdown
    used = hover(TYPED, "/t/t.tmpl", 10, 46)
    assert used is not None and used.markdown.startswith("**gen** `when` → str")
    pattern = hover(TYPED, "/t/t.tmpl", 9, 26)
    assert pattern is not None and pattern.markdown.startswith("**pattern** `DATE`")
    assert "02-29" in pattern.markdown
    assert hover(TYPED, "/t/t.tmpl", 7, 2) is None  # plain text


def test_hover_knows_nothing_of_a_template_that_does_not_parse() -> None:
    assert hover("{{ gen x regex=DATE }}{% if %}", "/t/t.tmpl", 0, 16) is None


def test_completion_by_place() -> None:
    text = TYPED + "{{ gen x  }}{{ gen y regex=D }}{{ topic | up }}{% en %}{{ s }}{# to #}"
    line = TYPED.count("\n")
    assert _labels(text, line, 9) == _labels(text, line, 9, ARGUMENT)
    assert "max_tokens" in _labels(text, line, 9) and "options" not in _labels(text, line, 9)
    assert _labels(text, line, 28) == _labels(text, line, 28, PATTERN)
    assert "DATE" in _labels(text, line, 28)
    assert "upper" in _labels(text, line, 45)
    assert "endfor" in _labels(text, line, 52)
    names = _labels(text, line, 59)
    assert {"gen", "select", "topic", "count", "when", "mood", "x", "y"} <= set(names)
    assert "topic" in _labels(text, line, 59, INPUT) and "when" in _labels(text, line, 59,
                                                                             CAPTURE)
    assert _labels(text, line, 67) == []  # in a comment
    assert _labels(text, 7, 3) == []  # in text


def test_completion_of_select_arguments_leaves_out_those_given() -> None:
    text = '{{ select c options=["a"]  }}'
    assert _labels(text, 0, 26) == ["temperature", "normalize"]
    assert _labels('{{ gen c stop="a b  }}', 0, 18) == []  # inside a string


def test_symbols_are_the_inputs_and_the_holes_in_source_order() -> None:
    found = symbols(TYPED, "/t/t.tmpl")
    assert [(s.name, s.kind) for s in found] == [
        ("topic", "input"), ("count", "input"), ("line", HOLE), ("when", HOLE), ("mood", HOLE)]
    assert found[2].detail == "gen hole (in a loop: a list)"
    assert found[3].selection == Range(9, 13, 9, 17)


@pytest.mark.parametrize("text", [
    "{{ " + "[" * 5000 + "x" + "]" * 5000 + " }}",
    "{% if x %}" * 500,
    "{{ x }}" * 20_000,
    "---\n" + "a: [" * 200 + "\n---\n",
    "\x00\ud800{{",
    "{{ gen x json={'type': 'object', 'properties': {'a': {'$ref': '#/x'}}} }}",
])
def test_a_hostile_document_gets_errors_never_an_exception(text: str) -> None:
    found = diagnostics(text, "/t/t.tmpl")
    assert found and all(d.severity == ERROR for d in found)
    for line in range(2):
        hover(text, "/t/t.tmpl", line, 3)
        completion(text, "/t/t.tmpl", line, 3)
        definition(text, "/t/t.tmpl", line, 3)
    symbols(text, "/t/t.tmpl")


def test_the_servers_warm_up_freezes_its_heap_and_leaves_the_collector_on() -> None:
    import gc

    from qrun.lsp.server import warm_up

    try:
        warm_up()
        assert gc.get_freeze_count() > 0
        assert gc.isenabled()  # the analysis's pause (qrun/collector.py) was lifted
    finally:
        gc.unfreeze()


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("template", sorted(EXAMPLES.glob("*.tmpl")), ids=lambda p: p.name)
def test_every_example_that_check_accepts_has_no_diagnostic(template: Path) -> None:
    """The editor and `qrun --check --functions` compile through one front end (issue #36):
    an example whose functions file (the .py of its name, if any) `--check` takes gets no
    error in the editor when the server has it (`qrun lsp --functions`)."""
    from qrun.cli.functions_file import load_functions

    beside = template.with_suffix(".py")
    functions = load_functions(str(beside)).signatures() if beside.is_file() else None
    compile_file(template, functions=functions)  # what `qrun --check` does: it accepts
    found = diagnostics(template.read_text(), str(template), functions)
    assert [d for d in found if d.severity == ERROR] == []


def test_a_host_function_is_unknown_to_the_editor_without_its_file() -> None:
    template = EXAMPLES / "calculator.tmpl"
    found = diagnostics(template.read_text(), str(template))
    assert any("unknown function 'calc'" in d.message for d in found if d.severity == ERROR)
