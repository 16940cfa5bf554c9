"""Macros, while, try/except and host functions run end to end on the tiny model
(docs/language.md §21-§22): inline calls keep their text and tokens, hidden ones take them back
(the context is as if the call never ran), return values, bounded recursion, errors inside a
macro positioned with a note naming the call, host functions sync and async with timeouts,
exceptions, plain-data checks, try/except, run_tool, and the trace's records of each call."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import EvaluationError, LimitError, TemplateErrors
from tests.hang import alarm


def run(model: TransformersBackend, template: str, functions: Any = None,
        limits: qrun.Limits | None = None, **inputs: object) -> qrun.Result:
    options = qrun.RunOptions(limits=limits) if limits is not None else None
    return qrun.Query(template, functions=functions).run(
        model=model, max_tokens=3, seed=7, options=options, **inputs)


def context_text(model: TransformersBackend, result: qrun.Result) -> str:
    return model.tokenizer.decode(result.token_ids)


# ---- macros ------------------------------------------------------------------------------------


def test_an_inline_call_keeps_its_text_and_tokens(model: TransformersBackend) -> None:
    template = ('{% macro ask(q, tone="plainly") %}[{{ tone }}] {{ q }}: {{ gen a max_tokens=3 }}'
                '{% endmacro %}Start {{ ask("why") }} end')
    r = run(model, template)
    assert r.text.startswith("Start [plainly] why: ") and r.text.endswith(" end")
    # The call's captures are its own: none reach the result.
    assert "a" not in r.vars
    assert context_text(model, r).endswith(r.text)


def test_a_hidden_call_leaves_the_context_as_if_it_never_ran(
        model: TransformersBackend) -> None:
    template = ('{% macro think(q) %}Thinking about {{ q }}: {{ gen t max_tokens=4 }}'
                '{% return t | length %}{% endmacro %}'
                'Before. {% set n = think("x") %}After {{ n }}.')
    r = run(model, template)
    assert "Thinking" not in r.text
    assert r.text.startswith("Before. After ") and r.text.endswith(".")
    int(r.text.removeprefix("Before. After ").removesuffix("."))  # the returned length
    # The context holds only the kept text: the hidden body's tokens were cropped.
    assert context_text(model, r) == r.text
    assert r.stats.rollback_tokens > 0


def test_a_hidden_call_with_a_fork_inside_keeps_the_text_before_it(
        model: TransformersBackend) -> None:
    # A fork takes the context's last unfed token back to read it with each branch's text
    # (Session.share); inside a hidden call that token is from before the call's mark, and
    # must still be in the context afterwards (examples/skeleton.tmpl lost a newline here).
    template = ('{% macro many(xs) %}{% fork x in xs %}{{ x }}: {{ gen v max_tokens=2 }}'
                '{% endfork %}{% return v %}{% endmacro %}'
                'Before.\n{% set vs = many(["a", "b"]) %}After {{ vs | length }}.\n')
    r = run(model, template)
    assert r.text == "Before.\nAfter 2.\n"
    assert context_text(model, r) == r.text


def test_a_hidden_call_without_return_is_its_text(model: TransformersBackend) -> None:
    r = run(model, '{% macro shout(x) %}{{ x | upper }}!{% endmacro %}'
                   '{{ shout("hi") | lower }} {% set s = shout("a") %}{{ s ~ s }}')
    assert r.text == "hi! A!A!"


def test_an_inline_call_emits_its_return_value_after_its_text(
        model: TransformersBackend) -> None:
    r = run(model, "{% macro f(x) %}<{{ x }}>{% return x * 2 %}{% endmacro %}{{ f(21) }}")
    assert r.text == "<21>42"


def test_a_macro_sees_inputs_and_top_level_sets_not_the_callers_loop(
        model: TransformersBackend) -> None:
    template = ("{% macro m() %}{{ who }}/{{ greeting }}{% endmacro %}"
                "{% set greeting = 'hi' %}{% for i in [1] %}{{ m() }}{% endfor %}")
    assert run(model, template, who="Ann").text == "Ann/hi"
    with pytest.raises(TemplateErrors, match="unknown variable|used before"):
        qrun.Query("---\ninputs: []\n---\n{% macro m() %}{{ i }}{% endmacro %}"
                   "{% for i in [1] %}{{ m() }}{% endfor %}")


def test_recursion_is_bounded_by_the_call_depth(model: TransformersBackend) -> None:
    template = ("{% macro fact(n) %}{% if n <= 1 %}{% return 1 %}{% endif %}"
                "{% return n * fact(n - 1) %}{% endmacro %}{{ fact(k) }}")
    assert run(model, template, k=10).text == "3628800"
    with alarm(60), pytest.raises(LimitError, match="calls nested more than 40 deep") as info:
        run(model, "{% macro down(n) %}{{ down(n + 1) }}{% endmacro %}{{ down(0) }}")
    assert "in macro 'down' called at" in str(info.value)
    with alarm(60), pytest.raises(LimitError, match="calls nested more than 5 deep"):
        run(model, template, k=10, limits=qrun.Limits(call_depth=5))


def test_an_error_inside_a_macro_points_inside_with_a_note_naming_the_call(
        model: TransformersBackend) -> None:
    template = "{% macro f(d) %}\nvalue: {{ d.missing }}{% endmacro %}\n\n{{ f(data) }}"
    with pytest.raises(EvaluationError) as info:
        run(model, template, data={"a": 1})
    err = info.value
    assert (err.span.line, err.span.column) == (2, 11)
    assert err.notes[-1] == "in macro 'f' called at <string>:4:4"


def test_default_arguments_are_evaluated_per_call(model: TransformersBackend) -> None:
    r = run(model, "{% macro f(a, b=a * 2) %}{{ a }}+{{ b }} {% endmacro %}"
                   "{{ f(1) }}{{ f(2, b=0) }}")
    assert r.text == "1+2 2+0 "


# ---- while -------------------------------------------------------------------------------------


def test_while_with_break_continue_and_list_captures(model: TransformersBackend) -> None:
    template = ("{% set n = 0 %}{% while n < 10 %}{% set n = n + 1 %}"
                "{% if n == 2 %}{% continue %}{% endif %}({{ n }}:{{ gen x max_tokens=1 }})"
                "{% if n == 4 %}{% break %}{% endif %}{% endwhile %}|{{ x | length }}")
    r = run(model, template)
    assert r.text.endswith("|3") and len(r["x"]) == 3
    assert r.text.startswith("(1:") and "(3:" in r.text and "(2:" not in r.text


def test_a_while_that_never_ends_fails_with_the_budget_error(model: TransformersBackend) -> None:
    with alarm(60), pytest.raises(LimitError, match="evaluation steps") as info:
        run(model, "x\n{% while true %}{% endwhile %}")
    assert info.value.span.line == 2


# ---- host functions -----------------------------------------------------------------------------


def registry() -> qrun.Functions:
    functions = qrun.Functions()

    @functions.register
    def add(a: int, b: int = 1) -> int:
        """Add two numbers."""
        return a + b

    @functions.register(name="shout")
    async def upper(text: str) -> str:
        await asyncio.sleep(0)
        return text.upper()

    @functions.register
    def boom() -> int:
        raise ValueError("nope")

    @functions.register
    def sleepy(seconds: float) -> str:
        time.sleep(seconds)
        return "awake"

    @functions.register
    async def snooze(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "awake"

    @functions.register
    def thing() -> object:
        return threading.Lock()

    return functions


def test_sync_and_async_functions_are_called_like_builtins(model: TransformersBackend) -> None:
    r = run(model, '{{ add(2) }} {{ add(a=2, b=5) }} {{ shout("hi") }} {{ "x" | shout }}',
            registry())
    assert r.text == "3 7 HI X"
    assert r.stats.host_calls == 4 and r.stats.host_s > 0
    calls = r.recorder.to_dict()["calls"]
    assert [c["name"] for c in calls] == ["add", "add", "shout", "shout"]
    assert calls[1]["kwargs"] == {"a": 2, "b": 5} and calls[1]["result"] == 7


def test_async_functions_work_inside_a_running_event_loop(model: TransformersBackend) -> None:
    async def main() -> str:
        return run(model, '{{ shout("in a loop") }}', registry()).text

    assert asyncio.run(main()) == "IN A LOOP"


def test_a_failure_is_a_positioned_error_and_try_handles_it(model: TransformersBackend) -> None:
    with pytest.raises(EvaluationError, match=r"boom\(\) failed: ValueError: nope") as info:
        run(model, "ok\n  {{ boom() }}", registry())
    assert (info.value.span.line, info.value.span.column) == (2, 6)
    r = run(model, "A{% try %}B {{ gen g max_tokens=2 }}{{ boom() }}C{% except err %}"
                   "[{{ err }}]{% endtry %}D", registry())
    assert r.text == "A[boom() failed: ValueError: nope]D"
    assert context_text(model, r) == r.text  # the failed body left the context too
    assert r.recorder.to_dict()["calls"][0]["error"] == "boom() failed: ValueError: nope"


def test_try_streams_a_body_only_when_it_succeeds(model: TransformersBackend) -> None:
    shown: list[str] = []
    query = qrun.Query("{% try %}good {{ add(1) }}{% except %}bad{% endtry %} "
                       "{% try %}lost{{ boom() }}{% except %}kept{% endtry %}",
                       functions=registry())
    r = query.run(model=model, on_text=shown.append)
    assert r.text == "good 2 kept" and "".join(shown) == r.text


def test_try_does_not_catch_limits(model: TransformersBackend) -> None:
    with alarm(60), pytest.raises(LimitError):
        run(model, "{% try %}{% while true %}{% endwhile %}{% except %}caught{% endtry %}")


def test_a_call_taking_too_long_times_out(model: TransformersBackend) -> None:
    limits = qrun.Limits(call_timeout_s=0.05)
    for name in ("sleepy", "snooze"):
        with alarm(60), pytest.raises(EvaluationError,
                                      match=rf"{name}\(\) took longer than 0.05s"):
            run(model, f"{{{{ {name}(5) }}}}", registry(), limits)
    assert run(model, "{{ sleepy(0) }}", registry(),
               qrun.Limits(call_timeout_s=None)).text == "awake"


def test_arguments_and_results_are_plain_data(model: TransformersBackend) -> None:
    with pytest.raises(EvaluationError, match="thing.. returned a value that is not plain data"):
        run(model, "{{ thing() }}", registry())
    r = run(model, "{{ add(n) }}", registry(), n=True)  # a bool is plain data (and an int)
    assert r.text == "2"


def test_arity_and_unknown_names_are_compile_errors() -> None:
    with pytest.raises(TemplateErrors, match=r"add\(\) takes 1 to 2 arguments, got 3"):
        qrun.Query("{{ add(1, 2, 3) }}", functions=registry())
    with pytest.raises(TemplateErrors, match=r"add\(\) is missing argument 'a'"):
        qrun.Query("{{ add(b=1) }}", functions=registry())
    with pytest.raises(TemplateErrors, match="unknown function 'add'") as info:
        qrun.Query("{{ add(1) }}")
    assert "functions=" in str(info.value)
    with pytest.raises(TemplateErrors, match="did you mean 'add'"):
        qrun.Query("{{ ad(1) }}", functions=registry())


def test_inputs_are_never_callable(model: TransformersBackend) -> None:
    with pytest.raises(qrun.UsageError):
        run(model, "{{ f }}", f=len)
    with pytest.raises(TemplateErrors, match="unknown function 'f'"):
        qrun.Query("{{ f(1) }}")


OFFER_ADD = '{% set offered = tools(["add"]) %}'


def test_run_tool_calls_the_named_function_with_keyword_arguments(
        model: TransformersBackend) -> None:
    call = {"name": "add", "arguments": {"a": 40, "b": 2}}
    assert run(model, OFFER_ADD + "{{ run_tool(c) }}", registry(), c=call).text == "42"
    with pytest.raises(EvaluationError, match="'rm' is not a function this template"):
        run(model, OFFER_ADD + "{{ run_tool(c) }}", registry(),
            c={"name": "rm", "arguments": {}})
    with pytest.raises(EvaluationError, match=r"add\(\) has no argument 'z'"):
        run(model, OFFER_ADD + "{{ run_tool(c) }}", registry(),
            c={"name": "add", "arguments": {"z": 1}})


def test_run_tool_reaches_only_what_the_template_names_or_offers(
        model: TransformersBackend) -> None:
    """Issue #38: run_tool(name_from_input) could call any registered function, also one no
    template names. A template reaches the functions it calls by name and those tools()
    offered it (all of them after a bare tools())."""
    def call(name: str, **arguments: Any) -> dict[str, Any]:
        return {"name": name, "arguments": arguments}

    with pytest.raises(EvaluationError, match=r"'sleepy' is not a function this template "
                                              r"calls or offers with tools\(\) \(it may call: "
                                              r"add\)") as info:
        run(model, OFFER_ADD + "{{ run_tool(c) }}", registry(), c=call("sleepy", seconds=0))
    assert "boom" not in info.value.message  # the other registered names are not shown
    with pytest.raises(EvaluationError, match="it may call: none"):
        run(model, "{{ run_tool(c) }}", registry(), c=call("add", a=1))
    # Called by name elsewhere in the template (a macro's body counts):
    text = "{% macro m() %}{{ add(1) }}{% endmacro %}{{ run_tool(c) }}"
    assert run(model, text, registry(), c=call("add", a=1, b=1)).text == "2"
    # A bare tools() offers every registered function, a fork's branch sees what was offered.
    assert run(model, "{% set t = tools() %}{{ run_tool(c) }}", registry(),
               c=call("shout", text="hi")).text == "HI"
    forked = ('{% set t = tools(["shout"]) %}{% fork i in [1, 2] %}{% set r = run_tool(c) %}'
              '{{ gen x max_tokens=1 }}{% endfork %}{{ x | length }}')
    assert run(model, forked, registry(), c=call("shout", text="hi")).text == "2"


def test_a_dict_of_callables_and_tool_specs() -> None:
    functions = registry()
    tool = functions.tools(["add"])[0]
    assert tool == {"type": "function", "function": {
        "name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                        "b": {"type": "integer"}},
                       "required": ["a"], "additionalProperties": False}}}
    query = qrun.Query("{{ double(2) }}", functions={"double": lambda x: 2 * x})
    assert "double" in query.functions
    with pytest.raises(qrun.UsageError, match="builtin"):
        qrun.Functions({"len": len})


def test_a_program_compiled_elsewhere_needs_its_functions(model: TransformersBackend) -> None:
    program = qrun.compile_source("{{ add(1) }}", functions=registry().signatures())
    with pytest.raises(EvaluationError, match="no host function 'add' is registered"):
        qrun.Query(program).run(model=model)
    assert qrun.Query(program, functions=registry()).run(model=model).text == "2"


def test_run_many_calls_host_functions_in_each_run(model: TransformersBackend) -> None:
    query = qrun.Query("{{ add(n) }}:{{ gen x max_tokens=1 }}", functions=registry())
    results = query.run_many([{"n": 1}, {"n": 2}, {"n": 3}], model=model, batch_size=2)
    assert [r.text.split(":")[0] for r in results if isinstance(r, qrun.Result)] == \
        ["2", "3", "4"]


def test_the_trace_shows_each_call(model: TransformersBackend) -> None:
    from qrun.trace import to_json, validate

    r = run(model, '{{ add(1) }}{% try %}{{ boom() }}{% except %}x{% endtry %}', registry())
    trace = r.trace()
    validate(trace)
    assert [(c["name"], c["result"], c["error"]) for c in trace["calls"]] == [
        ("add", 2, None), ("boom", None, "boom() failed: ValueError: nope")]
    assert '"calls": [{"name": "add"' in to_json(trace)
    page = r.to_html()
    assert "<h2>Host calls</h2>" in page and "boom() failed: ValueError: nope" in page


# ---- call("file.tmpl") ---------------------------------------------------------------------------


def test_call_runs_a_file_with_its_inputs_inline_or_hidden(
        model: TransformersBackend, tmp_path: Path) -> None:
    (tmp_path / "greet.tmpl").write_text("Hello {{ who | title }}{% set n = 1 %}"
                                         "{{ gen g max_tokens=2 }}.", encoding="utf-8")
    main = tmp_path / "main.tmpl"
    main.write_text('A {{ call("greet.tmpl", who="ann") }} B {% set s = call("greet.tmpl", '
                    'who="bo") %}[{{ s[:8] }}]', encoding="utf-8")
    query = qrun.Query.from_file(main)
    assert "g" in query.program.captures  # a run that calls holes loads the model's weights
    r = query.run(model=model, max_tokens=3, seed=3)
    assert r.text.startswith("A Hello Ann") and r.text.endswith(" B [Hello Bo]")
    assert "g" not in r.vars and "n" not in r.vars
    assert context_text(model, r) == r.text  # the hidden call left nothing behind


def test_call_is_checked_when_the_template_compiles(tmp_path: Path) -> None:
    (tmp_path / "f.tmpl").write_text("{{ a }}{{ b | default(1) }}", encoding="utf-8")
    (tmp_path / "loop.tmpl").write_text('{{ call("loop.tmpl") }}', encoding="utf-8")

    def messages(text: str) -> list[str]:
        path = tmp_path / "t.tmpl"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(TemplateErrors) as info:
            qrun.Query.from_file(path)
        return [e.message for e in info.value.errors]

    assert messages('{{ call("f.tmpl") }}') == ["call(\"f.tmpl\") is missing input 'a'"]
    assert messages('{{ call("f.tmpl", a=1, c=2) }}') == ["f.tmpl has no input 'c'"]
    assert messages("{{ call(name) }}") == [
        "call() takes the template file's name as a string literal, then its inputs by name"]
    assert messages('{{ call("../outside.tmpl") }}')[0].startswith(
        'cannot include "../outside.tmpl"')
    assert messages('{{ call("loop.tmpl") }}')[0].startswith("include cycle")
    assert messages('{{ call("none.tmpl") }}')[0].endswith("not found")
    with pytest.raises(TemplateErrors, match="needs a folder"):
        qrun.Query('{{ call("f.tmpl", a=1) }}')


def test_an_error_in_a_called_file_points_into_it(
        model: TransformersBackend, tmp_path: Path) -> None:
    (tmp_path / "bad.tmpl").write_text("line\n{{ d.k }}", encoding="utf-8")
    query = qrun.Query('x {{ call("bad.tmpl", d={}) }}', include_dir=tmp_path)
    with pytest.raises(EvaluationError) as info:
        query.run(model=model)
    err = info.value
    assert err.source.name.endswith("bad.tmpl") and err.span.line == 2
    assert err.notes[-1] == "in call('bad.tmpl') at <string>:1:6"


def test_the_docs_examples_of_sections_21_and_22_run(
        model: TransformersBackend, tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs/language.md").read_text("utf-8")
    section = text[text.index("## 21. Macros"):]
    examples = re.findall(r"^```jinja\n(.*?)^```", section, flags=re.M | re.S)
    # docs/language.md §21.2 gives the file its example calls: written beside, not run alone.
    (called,) = [e for e in examples if e.startswith("Summarize in")]
    examples.remove(called)
    assert len(examples) == 4
    (tmp_path / "summarize.tmpl").write_text(called, "utf-8")
    functions = qrun.Functions({"calc": lambda expression: len(expression)})
    inputs = {"topic": "tides", "document": "A long text.", "expression": "1+1"}
    for example in examples:
        query = qrun.Query(example, include_dir=tmp_path, functions=functions)
        assert query.warnings == ()
        r = query.run({k: v for k, v in inputs.items() if k in query.inputs}, model=model,
                      max_tokens=4, seed=0)
        assert r.text


def test_a_hole_argument_may_call_host_functions_and_macros(model: TransformersBackend) -> None:
    functions = qrun.Functions({"digits": lambda n: f"[0-9]{{{n}}}"})
    r = run(model, "{% macro n() %}{% return 3 %}{% endmacro %}"
                   "{{ gen x regex=digits(n()) }}", functions)
    assert len(r["x"]) == 3 and r["x"].isdigit()


def test_tools_gives_the_registered_functions_as_tool_specs(model: TransformersBackend) -> None:
    r = run(model, '{% set t = tools(["add"]) %}{{ t[0].function.name }} '
                   "{{ t[0].function.parameters.required }} {{ tools() | length }}", registry())
    assert r.text == f'add ["a"] {len(registry())}'
    with pytest.raises(EvaluationError, match="no host function named 'rm'"):
        run(model, '{{ tools(["rm"]) }}', registry())
    with pytest.raises(qrun.UsageError, match="reserved"):
        qrun.Functions({"tools": len})


def test_a_hidden_call_right_after_a_hole_keeps_the_holes_value(
        model: TransformersBackend) -> None:
    # The hole's tokens past its value (an overshoot, held for the next text) are settled
    # before the call, so rolling the call back leaves the value whole in the context.
    template = ('{% macro m() %}!{{ gen z max_tokens=2 }}{% endmacro %}'
                '{% for i in range(4) %}<{{ gen a max_tokens=4 stop=" " }}{% set s = m() %}'
                ' {% endfor %}')
    r = run(model, template)
    assert context_text(model, r) == r.text
    assert r.text == "".join(f"<{value} " for value in r["a"])


def test_a_timeout_counts_the_calls_own_time_not_a_wait_behind_others(
        model: TransformersBackend) -> None:
    # Sixteen branches call a 0.5 s function at once with a 0.9 s timeout: each call's own
    # time is within it, whatever the others do (a shared pool of 8 queued half of them
    # past it).
    def slow(x: int) -> int:
        time.sleep(0.5)
        return x

    limits = qrun.Limits(call_timeout_s=0.9)
    r = qrun.Query("{% fork t in range(16) %}{{ slow(t) }}{{ gen v max_tokens=1 }}"
                   "{% endfork %}", functions={"slow": slow}).run(
        model=model, options=qrun.RunOptions(limits=limits))
    assert r.stats.host_calls == 16 and len(r["v"]) == 16


def test_a_runtime_failure_inside_a_call_is_not_taken_for_the_templates_error(
        model: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # The evaluator makes an EvaluationError of a KeyError (the template's `d["x"]`); one out
    # of the runtime running a macro is a bug of qrun's, which `{% try %}` must not swallow.
    from qrun.lang.evaluate import CallFailure
    from qrun.runtime.calls import CallRunner

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("echo")

    monkeypatch.setattr(CallRunner, "macro", broken)
    template = ("{% macro m() %}x{% endmacro %}"
                "{% try %}{% set v = m() %}{% except err %}caught{% endtry %}")
    with pytest.raises(CallFailure, match="KeyError"):
        run(model, template)


def test_a_macro_whose_default_calls_it_stops_at_the_call_depth(
        model: TransformersBackend) -> None:
    """Issue #38: the depth was counted after the defaults were evaluated, so a default that
    called its own macro recursed until Python's stack ran out (an internal error)."""
    with pytest.raises(LimitError, match="calls nested more than 40 deep"):
        run(model, "{% macro m(x=m()) %}a{% endmacro %}{{ m() }}")
    with pytest.raises(LimitError, match="calls nested more than 5 deep"):
        run(model, "{% macro a(x=b()) %}a{% endmacro %}{% macro b(y=a()) %}b{% endmacro %}"
                   "{{ a() }}", limits=qrun.Limits(call_depth=5))
    # A default that calls another macro, once, still works; the depth is given back.
    text = ("{% macro two() %}2{% endmacro %}{% macro show(x=two()) %}[{{ x }}]{% endmacro %}"
            "{{ show() }}{{ show() }}{{ show(1) }}")
    assert run(model, text).text == "[2][2][1]"
