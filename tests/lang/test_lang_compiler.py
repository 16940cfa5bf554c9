"""Compiler semantics beyond the goldens: inputs (declared and inferred), captures, flow-sensitive
name checks, hole lowering into the IR, text merging, front matter defaults, and the public
entry points."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import qrun.lang
from qrun.constraint.patterns import PATTERNS
from qrun.errors import TemplateErrors
from qrun.lang import compile_file, compile_source, compile_template, ir
from qrun.lang import expr as ex
from qrun.options import ModelOptions, RunOptions


def ops_of(text: str) -> tuple[ir.Op, ...]:
    return compile_source(text).ops


def test_public_api() -> None:
    assert set(qrun.lang.__all__) == {"parse", "build_ast", "compile_template",
                                      "compile_source", "compile_file"}


def test_free_variables_are_inputs_in_first_use_order() -> None:
    program = compile_source("{{ b }}{% if a %}{{ c.d }}{% endif %}{{ b }}{{ len(e) }}")
    assert program.inputs == ("b", "a", "c", "e")
    assert not program.inputs_declared


def test_declared_inputs_keep_their_order_even_if_unused() -> None:
    program = compile_source("---\ninputs: [z, y, unused]\n---\n{{ y }}{{ z }}")
    assert program.inputs == ("z", "y", "unused")
    assert program.inputs_declared


def test_declared_empty_inputs() -> None:
    program = compile_source("---\ninputs: []\n---\nhi")
    assert program.inputs == () and program.inputs_declared
    with pytest.raises(TemplateErrors, match="unknown variable 'x'"):
        compile_source("---\ninputs: []\n---\n{{ x }}")


def test_captures_in_source_order_and_usable_later() -> None:
    program = compile_source(
        "{{ gen b }}{% if b %}{{ select a options=['x'] }}{% else %}{{ gen a }}{% endif %}"
        "{{ a }}{{ b }}")
    assert program.captures == ("b", "a")
    assert program.inputs == ()


def test_same_capture_in_exclusive_branches_is_fine() -> None:
    text = "{% if c %}{{ gen a }}{% elif d %}{{ gen a }}{% else %}{{ gen a }}{% endif %}{{ a }}"
    assert compile_source(text).captures == ("a",)


def test_capture_in_loop_is_a_list_and_defined_after_the_loop() -> None:
    (loop, value) = ops_of("{% for x in xs %}{{ gen item }}{% endfor %}{{ item }}")
    assert isinstance(loop, ir.For) and isinstance(value, ir.EmitValue)
    (gen,) = loop.body
    assert isinstance(gen, ir.Gen) and gen.in_loop and gen.name == "item"


def test_loop_variables_are_scoped() -> None:
    program = compile_source("{% for x in xs %}{{ x }}{{ loop.index }}{% endfor %}{{ x }}")
    assert program.inputs == ("xs", "x")  # the last x is a free variable, not the loop's


def test_nested_loops_see_outer_variables() -> None:
    program = compile_source(
        "{% for a in xs %}{% for b in a %}{{ a }}{{ b }}{{ loop.first }}{% endfor %}{% endfor %}")
    assert program.inputs == ("xs",)


def test_set_is_visible_after_if_only_when_set_on_every_branch() -> None:
    compile_source("{% if c %}{% set a = 1 %}{% else %}{% set a = 2 %}{% endif %}{{ a }}")
    with pytest.raises(TemplateErrors, match="not set on every path"):
        compile_source("{% if c %}{% set a = 1 %}{% elif d %}{% set a = 2 %}{% endif %}{{ a }}")


def test_set_can_rebind() -> None:
    (first, second, value) = ops_of("{% set a = 1 %}{% set a = a + 1 %}{{ a }}")
    assert isinstance(second, ir.Set) and second.name == "a"


def test_gen_params_lowering() -> None:
    (gen,) = ops_of('{{ gen a max_tokens=8 stop=["x", "y"] temperature=0.5 top_p=0.9 top_k=5 '
                    'seed=1 heal=false }}')
    assert isinstance(gen, ir.Gen)
    p = gen.params
    assert isinstance(p.max_tokens, ex.Const) and p.max_tokens.value == 8
    assert isinstance(p.stop, ex.ListExpr) and len(p.stop.items) == 2
    assert isinstance(p.temperature, ex.Const) and p.temperature.value == 0.5
    assert isinstance(p.heal, ex.Const) and p.heal.value is False
    assert p.constraint is None and not gen.in_loop


def test_gen_params_default_to_none() -> None:
    (gen,) = ops_of("{{ gen a }}")
    assert isinstance(gen, ir.Gen) and gen.params == ir.GenParams()


def test_named_pattern_becomes_regex_const() -> None:
    (gen,) = ops_of("{{ gen n regex=INT }}")
    assert isinstance(gen, ir.Gen) and isinstance(gen.params.constraint, ir.Regex)
    pattern = gen.params.constraint.pattern
    assert isinstance(pattern, ex.Const) and pattern.value == PATTERNS["INT"]
    assert gen.params.constraint.stdlib_name == "INT"


@pytest.mark.parametrize("name", ["INT", "FLOAT", "BOOL", "DATE", "TIME", "DATETIME", "EMAIL",
                                  "URL", "UUID", "PHONE_US", "WORD", "LINE"])
def test_documented_patterns_resolve(name: str) -> None:
    (gen,) = ops_of(f"{{{{ gen v regex={name} }}}}")
    assert isinstance(gen, ir.Gen) and isinstance(gen.params.constraint, ir.Regex)
    assert gen.params.constraint.stdlib_name == name


def test_uppercase_regex_name_is_never_an_input() -> None:
    assert compile_source("{{ gen v regex=INT }}").inputs == ()


def test_literal_and_variable_regex_and_json() -> None:
    (a, b, c) = ops_of('{{ gen a regex="[a-z]+" }}{{ gen b regex=pat }}{{ gen c json=schema }}')
    assert isinstance(a, ir.Gen) and isinstance(b, ir.Gen) and isinstance(c, ir.Gen)
    constraint = a.params.constraint
    assert isinstance(constraint, ir.Regex) and constraint.stdlib_name is None
    assert isinstance(constraint.pattern, ex.Const) and constraint.pattern.value == "[a-z]+"
    assert isinstance(b.params.constraint, ir.Regex) and b.params.constraint.stdlib_name is None
    assert isinstance(c.params.constraint, ir.JsonSchema)


def test_select_lowering() -> None:
    (sel,) = ops_of('{{ select c options=["a", "b"] temperature=0 normalize="mean" }}')
    assert isinstance(sel, ir.Select)
    assert isinstance(sel.options, ex.ListExpr) and not sel.in_loop
    assert isinstance(sel.normalize, ex.Const) and sel.normalize.value == "mean"


def test_non_literal_arguments_are_left_to_the_runtime() -> None:
    gen, select = ops_of("{{ gen a max_tokens=n temperature=t stop=s }}"
                         "{{ select b options=opts }}")
    assert isinstance(gen, ir.Gen) and isinstance(select, ir.Select)
    params = gen.params
    assert [getattr(params, k) for k in ("max_tokens", "temperature", "stop")] == [
        ex.Name("n", params.max_tokens.span), ex.Name("t", params.temperature.span),  # type: ignore[union-attr]
        ex.Name("s", params.stop.span)]  # type: ignore[union-attr]
    assert select.options == ex.Name("opts", select.options.span)


def test_text_is_merged_and_empty_text_dropped() -> None:
    ops = ops_of("a{# c #}b{% raw %}{{ x }}{% endraw %}c {{- '' -}}  \n")
    assert isinstance(ops[0], ir.EmitText) and ops[0].text == "ab{{ x }}c"
    assert len(ops) == 2 and isinstance(ops[1], ir.EmitValue)


def test_merged_text_span_covers_both_parts() -> None:
    (text,) = ops_of("ab{# c #}\ncd")
    assert isinstance(text, ir.EmitText)
    assert (text.span.line, text.span.column, text.span.end_line) == (1, 1, 2)


def test_roles_and_branches_structure() -> None:
    (role,) = ops_of("{% user %}{% if a %}x{% endif %}{% enduser %}")
    assert isinstance(role, ir.Role) and role.role == "user"
    (branch,) = role.body
    assert isinstance(branch, ir.If) and branch.orelse == ()


def test_front_matter_defaults() -> None:
    program = compile_source('---\nmodel: "org/model name"\ntemperature: 1\ntop_p: 0.5\n'
                             "seed: 3\nmax_tokens: 10\ndevice: cuda:1\ndtype: bfloat16\n---\n")
    assert program.options == RunOptions(temperature=1.0, top_p=0.5, seed=3, max_tokens=10)
    assert program.model == ModelOptions(model="org/model name", device="cuda:1",
                                         dtype="bfloat16")
    assert isinstance(program.options.temperature, float)


def test_front_matter_lines_keep_body_positions() -> None:
    with pytest.raises(TemplateErrors) as info:
        compile_source("---\nmodel: m\n---\nline four\n  {{ gen a max_tokens=0 }}")
    assert (info.value.first.span.line, info.value.first.span.column) == (5, 23)


def test_crlf_front_matter() -> None:
    program = compile_source("---\r\nseed: 1\r\n---\r\nhi")
    assert program.options.seed == 1
    assert isinstance(program.ops[0], ir.EmitText) and program.ops[0].text == "hi"


def test_compile_template_and_compile_file(tmp_path: Path) -> None:
    path = tmp_path / "t.tmpl"
    path.write_text("Q: {{ q }}\r\n{{ gen a }}", encoding="utf-8")
    program = compile_file(path)
    assert program.source.name == str(path)
    # Newlines are normalized as Jinja does (lang/text.py): CRLF in the file is "\n".
    assert isinstance(program.ops[2], ir.EmitText) and program.ops[2].text == "\n"
    source = program.source
    again = compile_template(qrun.lang.build_ast(qrun.lang.parse(source), source), source)
    assert again == program


def test_program_is_hashable_and_equal_across_compiles() -> None:
    text = '{% for x in xs %}{{ gen a regex=INT stop=["\\n"] }}{% endfor %}'
    assert compile_source(text).ops == compile_source(text).ops
    assert hash(compile_source(text).ops) == hash(compile_source(text).ops)


def test_literal_constraints_are_lowered_once_and_kept_in_the_ir(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import qrun.constraint.spec

    calls: list[str] = []
    real = qrun.constraint.spec.compile_dfa

    def counting(pattern: str) -> object:
        calls.append(pattern)
        return real(pattern)

    monkeypatch.setattr(qrun.constraint.spec, "compile_dfa", counting)
    fresh = f"[0-9]+{uuid.uuid4().hex}"  # never lowered before in this process
    text = (f'{{% for x in xs %}}{{{{ gen a regex="{fresh}" }}}}{{{{ gen b regex=INT }}}}'
            f'{{{{ gen c regex="{fresh}" }}}}{{% endfor %}}')
    ops = ops_of(text)
    ops_of(text)  # a second compile reuses the lowered constraint too
    assert calls.count(fresh) == 1
    gens = [op for op in ir.walk(ops) if isinstance(op, ir.Gen)]
    specs = [g.params.constraint.lowered for g in gens if g.params.constraint is not None]
    assert [s.pattern if s else None for s in specs] == [fresh, PATTERNS["INT"], fresh]
    assert [s.value_type if s else None for s in specs] == ["text", "int", "text"]


def test_non_literal_patterns_and_schemas_compile_and_are_left_to_the_runtime() -> None:
    # (tests/runtime/test_executor.py runs them and checks the run-time errors.)
    ops = ops_of('{% set p = "(a)\\\\1" %}{{ gen a regex=p }}{{ gen b regex=q }}'
                 '{{ gen c json=s }}{{ gen d json={"type": t} }}')
    gens = [op for op in ops if isinstance(op, ir.Gen)]
    kinds = [type(g.params.constraint).__name__ for g in gens]
    assert kinds == ["Regex", "Regex", "JsonSchema", "JsonSchema"]
