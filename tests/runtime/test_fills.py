"""Known values (runtime/fills.py, docs/language.md §16.1): a filled hole is fixed text, checked
against the hole, captured typed, marked "filled" in its record, trace and stats; the rest is
generated. And Result.output, the typed record of a template with `output:`
(docs/language.md §4.2)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from doubles import SteeredModel, script

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import InputError, UsageError
from qrun.lang.declared import first_problem

TEMPLATE = """Name: {{ gen name stop="\\n" max_tokens=6 }}
Age: {{ gen age regex=INT max_tokens=4 }}
Mood: {{ select mood options=["happy", "sad"] }}
Data: {{ gen data json={"type": "object", "properties": {"a": {"type": "integer"}}, \
"required": ["a"]} max_tokens=20 }}
Next: {{ gen next max_tokens=5 }}"""


def test_filled_holes_are_fixed_text_and_typed(tiny: TransformersBackend) -> None:
    query = qrun.Query(TEMPLATE)
    result = query.run(model=tiny, seed=1, fill={"name": "Ada", "age": 36, "mood": "sad",
                                                 "data": {"a": 7}})
    assert result.text.startswith('Name: Ada\nAge: 36\nMood: sad\nData: {"a": 7}\nNext: ')
    assert result.vars["name"] == "Ada"
    assert result.vars["age"] == 36
    assert result.vars["mood"] == "sad"
    assert result.vars["data"] == {"a": 7}
    assert [result.holes[n].finish for n in ("name", "age", "mood", "data")] == ["filled"] * 4
    assert result.holes["next"].finish != "filled"
    assert result.stats.filled_holes == 4
    trace = result.trace()
    assert [hole["finish"] for hole in trace["holes"]][:4] == ["filled"] * 4


def test_a_filled_run_continues_as_if_the_value_were_template_text(
        tiny: TransformersBackend) -> None:
    """The KV cache is fed the value as fixed text: what follows is generated exactly as
    after the same text written in the template."""
    filled = qrun.Query("Q: {{ gen a regex=INT }} is the answer. {{ gen b max_tokens=8 }}").run(
        model=tiny, seed=3, fill={"a": "42"})
    written = qrun.Query("Q: 42 is the answer. {{ gen b max_tokens=8 }}").run(
        model=tiny, seed=3)
    assert filled.text == written.text
    assert filled.token_ids == written.token_ids
    assert filled.vars["b"] == written.vars["b"]


def test_json_hole_takes_json_text_or_a_value(tiny: TransformersBackend) -> None:
    query = qrun.Query('{{ gen d json={"type": "array", "items": {"type": "integer"}} }}')
    assert query.run(model=tiny, fill={"d": "[1,2]"}).text == "[1, 2]"
    assert query.run(model=tiny, fill={"d": [3]}).vars["d"] == [3]


def test_loop_hole_takes_one_value_per_iteration(tiny: TransformersBackend) -> None:
    query = qrun.Query("{% for i in range(3) %}- {{ gen x regex=INT max_tokens=3 }}\n"
                       "{% endfor %}")
    result = query.run(model=tiny, seed=0, fill={"x": [5, "6"]})
    assert result.vars["x"][:2] == [5, 6]
    assert len(result.vars["x"]) == 3
    assert [r.finish for r in result.hole_lists["x"]][:2] == ["filled", "filled"]
    assert result.hole_lists["x"][2].finish != "filled"


@pytest.mark.parametrize(("fill", "message"), [
    ({"age": "4x"}, "does not match its constraint regex=INT"),
    ({"age": "12345678901234567890"}, "over its max_tokens=4"),
    ({"name": "A\nB"}, 'contains its stop string "\\n"'),
    ({"mood": "cross"}, 'is not one of its options ["happy", "sad"]'),
    ({"data": {"a": "x"}}, "does not match its constraint json="),
    ({"data": {"b": 2}}, "does not match its constraint json="),  # "a" is required
])
def test_a_value_that_breaks_the_hole_is_an_input_error(
        tiny: TransformersBackend, fill: dict[str, Any], message: str) -> None:
    query = qrun.Query(TEMPLATE, "t.tmpl")
    with pytest.raises(InputError) as info:
        query.run(model=tiny, fill=fill)
    assert message in info.value.message
    name = next(iter(fill))
    assert f"hole '{name}'" in info.value.message
    line = {"name": 1, "age": 2, "mood": 3, "data": 4}[name]
    assert info.value.span.line == line
    assert info.value.exit_code == 2


def test_value_checked_before_any_model_work(tiny: TransformersBackend) -> None:
    """A later hole's bad value is refused before the first hole is generated."""
    query = qrun.Query("{{ gen a max_tokens=3 }} {{ gen b regex=INT }}")
    text: list[str] = []
    with pytest.raises(InputError):
        query.run(model=tiny, fill={"b": "x"}, on_text=text.append)
    assert text == []


@pytest.mark.parametrize(("template", "fill", "message"), [
    ("{{ gen a }}", {"b": "x"}, "no hole of that name"),
    ("{% for i in range(2) %}{{ gen a }}{% endfor %}", {"a": "x"}, "fill it with a list"),
    ("{% fork i in [1, 2] %}{{ gen a }}{% endfork %}", {"a": ["x"]}, "inside a fork"),
    ("{% macro m() %}{{ gen a }}{% endmacro %}{{ m() }}", {"a": "x"}, "no hole of that name"),
])
def test_fills_that_cannot_apply_are_refused(tiny: TransformersBackend, template: str,
                                             fill: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        qrun.Query(template).run(model=tiny, fill=fill)


TYPED = """---
inputs:
  topic: string
output:
  age: integer
  mood: enum[happy, sad]
  tags: list[string]
---
About {{ topic }}. Age: {{ gen age regex=INT max_tokens=4 }}
Mood: {{ select mood options=["happy", "sad"] }}
{% for i in range(2) %}Tag: {{ gen tags stop="\\n" max_tokens=5 }}
{% endfor %}"""


@pytest.mark.parametrize("seed", range(4))
def test_typed_result_fits_its_output_schema_at_temperature_1(tiny: TransformersBackend,
                                                              seed: int) -> None:
    query = qrun.Query(TYPED)
    result = query.run(model=tiny, topic="cats", seed=seed, temperature=1.0)
    assert result.output is not None
    assert set(result.output) == {"age", "mood", "tags"}
    assert isinstance(result.output["age"], int)
    assert query.output_schema is not None
    assert first_problem(query.output_schema, result.output) is None


def test_untyped_template_has_no_output(tiny: TransformersBackend) -> None:
    result = qrun.Query("{{ gen a max_tokens=2 }}").run(model=tiny)
    assert result.output is None


def test_arun_takes_fill(tiny: TransformersBackend) -> None:
    import asyncio

    query = qrun.Query("A: {{ gen a regex=INT }} B: {{ gen b max_tokens=2 }}")
    result = asyncio.run(query.arun(model=tiny, fill={"a": 5}))
    assert result.text.startswith("A: 5 B: ")
    assert result.holes["a"].finish == "filled"


@pytest.mark.parametrize("batch_size", [1, 2])
def test_run_many_takes_one_fill_per_input(tiny: TransformersBackend, batch_size: int) -> None:
    query = qrun.Query("A: {{ gen a regex=INT }} B: {{ gen b max_tokens=2 }}")
    results = query.run_many([{}, {}, {}], model=tiny, batch_size=batch_size, seed=2,
                             fill=[{"a": 1}, None, {"a": "x"}])
    first, second, third = results
    assert isinstance(first, qrun.Result) and first.text.startswith("A: 1 B: ")
    assert isinstance(second, qrun.Result) and second.holes["a"].finish != "filled"
    assert isinstance(third, InputError)  # its own error; the others ran
    with pytest.raises(UsageError, match="one per input"):
        query.run_many([{}, {}], model=tiny, fill=[{"a": 1}])


@pytest.mark.parametrize(("value", "message"), [
    (print, "fill 'a': a builtin_function_or_method is not plain data"),
    ("\ud800", "fill 'a': the string contains a lone surrogate"),
    (["x", {1, 2}], "fill 'a' at [1]: a set is not plain data"),
])
def test_fill_values_are_plain_data(tiny: TransformersBackend, value: Any,
                                    message: str) -> None:
    with pytest.raises(UsageError) as info:
        qrun.Query("{{ gen a }}").run(model=tiny, fill={"a": value})
    assert message in str(info.value)


def test_fill_text_is_never_control_tokens(tiny: TransformersBackend) -> None:
    marker = next(iter(tiny.control_tokens))
    result = qrun.Query("{{ gen a max_tokens=50 }}").run(model=tiny, fill={"a": marker})
    assert result.token_ids == tiny.encode(marker)  # encoded as text
    assert tiny.control_tokens[marker] not in result.token_ids


MIXED = ('{% if a %}{{ gen x regex="[0-9]+" }}{% else %}{% for i in [1, 2] %}'
         '{{ gen x regex="[0-9]+" }};{% endfor %}{% endif %}')


@pytest.mark.parametrize("value", [5, "57"])
def test_a_name_with_a_loop_hole_takes_a_list_on_every_path(tiny: TransformersBackend,
                                                             value: Any) -> None:
    with pytest.raises(UsageError, match="inside a loop: fill it with a list"):
        qrun.Query(MIXED).run({"a": False}, model=tiny, fill={"x": value})


def test_a_name_in_and_out_of_loops_is_checked_where_the_run_goes(
        tiny: TransformersBackend) -> None:
    # The list fits the loop's hole; the if's hole, never reached, is not checked with it.
    result = qrun.Query(MIXED).run({"a": False}, model=tiny, fill={"x": [5, 7]})
    assert result.text == "5;7;"
    assert result.vars["x"] == ["5", "7"]  # a regex that is no named pattern gives text
    with pytest.raises(InputError, match="hole 'x'") as info:
        qrun.Query(MIXED).run({"a": True}, model=tiny, fill={"x": [5, 7]})
    assert info.value.span.column == MIXED.index("{{ gen x") + 1


def test_a_float_past_a_floats_range_is_refused_at_the_hole(tiny: TransformersBackend) -> None:
    # float("1e400") is inf, which the output record (JSON) would give as null.
    template = "x = {{ gen x regex=FLOAT max_tokens=8 }}"
    with pytest.raises(InputError, match="beyond a float's range") as info:
        qrun.Query(template).run(model=tiny, fill={"x": "1e400"})
    assert info.value.span.column == template.index("{{") + 1
    assert qrun.Query(template).run(model=tiny, fill={"x": "1e300"}).vars["x"] == 1e300


def test_a_generated_float_past_a_floats_range_is_a_generation_error(
        tiny: TransformersBackend) -> None:
    template = "x = {{ gen x regex=FLOAT max_tokens=%d }}"
    # Token healing takes back the prompt's last space: the model writes " 1e400..." after "x =".
    tokens = tiny.encode(" 1e400")
    model = SteeredModel(tiny, script(len(tiny.encode("x =")), tokens), "scripted")
    with pytest.raises(qrun.GenerationError, match="beyond a float's range") as info:
        qrun.Query(template % len(tokens)).run(model=model)
    assert info.value.span.column == template.index("{{") + 1


def test_an_output_that_does_not_fit_is_an_error_at_its_hole(tiny: TransformersBackend) -> None:
    # The compiler's proof makes this rare; a program whose output schema was changed after
    # it (dataclasses.replace) stands in for what it may miss.
    template = "---\noutput:\n  a: integer\n---\nA: {{ gen a regex=INT max_tokens=3 }}"
    program = qrun.compile_source(template)
    for schema, wrong, place in [
            ({"type": "object", "properties": {"a": {"type": "string"}}}, "at ['a']", (5, 4)),
            # no hole captures 'b': the error is at the template's start
            ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {}},
              "required": ["b"]}, "'b' is a required property", (1, 1))]:
        changed = dataclasses.replace(program, output_schema=schema)
        with pytest.raises(qrun.GenerationError, match="does not fit") as info:
            qrun.Query(changed).run(model=tiny, fill={"a": 3})
        assert wrong in info.value.message
        assert (info.value.span.line, info.value.span.column) == place


def test_a_filled_value_that_keeps_its_stop_reports_it_as_the_generated_one_does(
        tiny: TransformersBackend) -> None:
    # issue #38: with keep_stop=true, the same text filled or generated ends on its stop, so
    # the template reads `holes.NAME.stop` alike and takes the same path.
    template = ('Colour:{{ gen c stop="." keep_stop=true max_tokens=6 heal=false }}'
                '{% if holes.c.stop %} (ended on {{ holes.c.stop }}){% endif %}')
    tokens = tiny.encode(" Blue.")
    generated = qrun.Query(template).run(
        model=SteeredModel(tiny, script(len(tiny.encode("Colour:")), tokens), "scripted"))
    assert generated["c"] == " Blue." and generated.holes["c"].finish == "stop"
    filled = qrun.Query(template).run(model=tiny, fill={"c": " Blue."})
    assert filled.holes["c"].finish == "filled"
    assert filled.holes["c"].stop == generated.holes["c"].stop == "."
    assert filled.text == generated.text == "Colour: Blue. (ended on .)"
    # A value that does not end on a stop reports none, as a hole ended by max_tokens does.
    assert qrun.Query(template).run(model=tiny, fill={"c": " Blue"}).holes["c"].stop is None
