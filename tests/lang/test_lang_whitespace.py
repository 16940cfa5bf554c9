"""Whitespace rules (Jinja's trim_blocks + lstrip_blocks, plus `-` control): one test per rule,
on the fixed text the compiler emits. `render` runs a program's text, values, branches and loops
without a model (roles become <role>...</role>); one test renders real chat markers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.lang import compile_source, ir
from qrun.lang.evaluate import LoopInfo, evaluate


def render(text: str, **inputs: Any) -> str:
    program = compile_source(text)
    out: list[str] = []

    def run(ops: tuple[ir.Op, ...], scope: Mapping[str, Any]) -> None:
        local = dict(scope)
        for op in ops:
            match op:
                case ir.EmitText(text=fixed):
                    out.append(fixed)
                case ir.EmitValue(expr=value):
                    out.append(str(evaluate(value, local, program.source)))
                case ir.Set(name=name, expr=value):
                    local[name] = evaluate(value, local, program.source)
                case ir.If(branches=branches, orelse=orelse):
                    body = next((b.body for b in branches
                                 if evaluate(b.condition, local, program.source)), orelse)
                    run(body, local)
                case ir.For(targets=(target,), iterable=iterable, body=body):
                    items = list(evaluate(iterable, local, program.source))
                    for index, item in enumerate(items):
                        run(body, {**local, target: item, "loop": LoopInfo(index, len(items))})
                case ir.Role(role=role, body=body):
                    out.append(f"<{role}>")
                    run(body, local)
                    out.append(f"</{role}>\n")
                case _:
                    raise AssertionError(f"render() does not run {op}")

    run(program.ops, inputs)
    return "".join(out)


# ---- (a) trim_blocks: the first newline after a block tag or comment goes --------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("{% if a %}\nx\n{% endif %}\ny", "x\ny"),
    ("{% set v = 1 %}\n{{ v }}", "1"),
    ("{% if a %}\n\nx{% endif %}", "\nx"),  # only the first newline
    ("{% if a %}  \nx{% endif %}", "  \nx"),  # not directly after the tag: kept
    ("{% if a %}\n{% endif %}\n", ""),
])
def test_newline_after_block_tag_is_removed(text: str, expected: str) -> None:
    assert render(text, a=True) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("{# note #}\nx", "x"),
    ("a {# note #}\nb", "a b"),
    ("{# one #}\n{# two #}\nx", "x"),
    ("{# note #}\n\nx", "\nx"),
])
def test_newline_after_comment_is_removed(text: str, expected: str) -> None:
    assert render(text) == expected


def test_crlf_and_cr_newlines_are_normalized_before_trimming() -> None:
    # As Jinja does: "\r\n" and a lone "\r" are newlines, written "\n" (lang/text.py).
    assert render("{% if a %}\r\nx\r\n{% endif %}\r\n{# c #}\r\ny\r\n", a=True) == "x\ny\n"
    assert render("{% if a %}\r\rx{% endif %}", a=True) == "\nx"
    assert render("{% if a %}\rx\r{% endif %}\ry", a=True) == "x\ny"


# ---- (b) lstrip_blocks: indentation before a block tag or comment goes -----------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("<ul>\n  {% for x in xs %}\n  <li>{{ x }}</li>\n  {% endfor %}\n</ul>\n",
     "<ul>\n  <li>a</li>\n  <li>b</li>\n</ul>\n"),
    ("  {% if a %}x{% endif %}", "x"),  # at the start of the template
    ("\t \t{# c #}\nx", "x"),  # tabs and spaces, before a comment
    ("a  {% if a %}x{% endif %}", "a  x"),  # text before the tag on its line: kept
    ("{% if a %}\n  {% endif %}|", "|"),  # after the trimmed newline: indentation
])
def test_indentation_before_block_tag_is_removed(text: str, expected: str) -> None:
    assert render(text, a=True, xs=["a", "b"]) == expected


def test_indentation_after_a_tag_on_the_same_line_is_kept() -> None:
    assert render("{{ a }}  {% if a %}x{% endif %}", a=1) == "1  x"
    assert render("{% set v = 2 %}  {% if v %}x{% endif %}") == "  x"


def test_lstrip_follows_front_matter() -> None:
    assert render("---\nseed: 1\n---\n  {% if a %}\nx\n  {% endif %}\n", a=True) == "x\n"


def test_nested_blocks_on_their_own_lines_leave_no_blank_lines() -> None:
    text = ("{% for x in xs %}\n"
            "  {% if x %}\n"
            "- {{ x }}\n"
            "  {% else %}\n"
            "- (empty)\n"
            "  {% endif %}\n"
            "{% endfor %}\n"
            "done\n")
    assert render(text, xs=["a", "", "b"]) == "- a\n- (empty)\n- b\ndone\n"


# ---- {{ ... }} tags, raw blocks and explicit `-` -------------------------------------------------


@pytest.mark.parametrize("text", [
    "{{ a }}\n  {{ a }}\n",
    '  {{ gen x }}\n{{ select y options=["p"] }}\n',
])
def test_interpolation_and_holes_are_unaffected(text: str) -> None:
    program = compile_source(text, "t.tmpl")
    texts = [op.text for op in program.ops if isinstance(op, ir.EmitText)]
    assert "".join(texts) == "".join(line[:line.index("{{")] + "\n"
                                     for line in text.splitlines())
    assert texts[-1] == "\n"


def test_raw_contents_are_verbatim_and_raw_tags_are_block_tags() -> None:
    text = "a\n  {% raw %}\n  {{ x }}\n  {% if %}\n  {% endraw %}\nb"
    assert render(text) == "a\n\n  {{ x }}\n  {% if %}\n  b"
    (op,) = compile_source(text).ops
    assert isinstance(op, ir.EmitText) and op.span.line == 1


def test_raw_dash_still_strips_inside() -> None:
    assert render("x {%- raw -%}  {{ y }}  {%- endraw -%}  z") == "x{{ y }}z"


@pytest.mark.parametrize(("text", "expected"), [
    ("a  \n {%- if a -%} \n b \n {%- endif -%} \n c", "abc"),
    ("a \n {#- c -#} \n b", "ab"),
    ("a  {{- v -}}  \n b", "a1b"),
    ("{% if a -%}\n\n  x{% endif %}", "x"),  # `-` strips more than the trim rule
    ("{% if a %}\n\n  x  \n  {%- endif %}", "\n  x"),
])
def test_dash_control_still_works(text: str, expected: str) -> None:
    assert render(text, a=True, v=1) == expected


def test_text_span_points_at_kept_text() -> None:
    program = compile_source("{% if a %}\n   {% if b %}\n  x\n{% endif %}{% endif %}")
    (outer,) = program.ops
    assert isinstance(outer, ir.If)
    (inner,) = outer.branches[0].body
    assert isinstance(inner, ir.If)
    (text,) = inner.branches[0].body
    assert isinstance(text, ir.EmitText) and text.text == "  x\n"
    assert (text.span.line, text.span.column, text.span.end_line) == (3, 1, 4)


def test_chat_turns_on_their_own_lines_have_no_blank_lines(tiny: TransformersBackend) -> None:
    template = ("{# a comment line #}\n"
                "{% user %}Hi{% enduser %}\n"
                "{% assistant %}{{ gen x max_tokens=2 }}{% endassistant %}\n")
    result = qrun.Query(template).run(model=tiny)
    assert result.text == (f"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
                           f"{result['x']}<|im_end|>\n")
