"""How a hole ended is data (docs/language.md §7.1, §15.2): the stop string that fired is in the
hole's record, and `keep_stop=true` keeps it in the value and the context (LMQL's STOPS_AT).
On the real SmolLM2 tokenizer with the tiny model steered to write chosen tokens, and on a
scripted server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doubles import ScriptedServer, SteeredModel, script

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import TemplateErrors
from qrun.runtime.result import GenRecord


def steered(tiny: TransformersBackend, before_hole: str, texts: list[str]) -> SteeredModel:
    tokens = [t for text in texts for t in tiny.encode(text)]
    return SteeredModel(tiny, script(len(tiny.encode(before_hole, special=True)), tokens))


def gen_record(result: qrun.Result, name: str) -> GenRecord:
    record = result.holes[name]
    assert isinstance(record, GenRecord)
    return record


def check_the_one_error(template: str, message: str, column: int) -> None:
    """The template does not compile, for one reason: `message`, at `column` of its line."""
    with pytest.raises(TemplateErrors) as caught:
        qrun.Query(template)
    (error,) = caught.value.errors
    assert message in error.message and error.span.column == column


def test_the_stop_that_fired_is_in_the_record(tiny: TransformersBackend) -> None:
    backend = steered(tiny, "X: ", ["a", "!", "b", "\n"])
    result = qrun.Query('X: {{ gen v stop=["\\n", "!"] max_tokens=6 heal=false }}').run(
        model=backend, speculate=False)
    record = gen_record(result, "v")
    assert (result["v"], record.finish, record.stop) == ("a", "stop", "!")
    assert record.to_dict()["stop"] == "!"


def test_no_stop_fired_is_none(tiny: TransformersBackend) -> None:
    backend = steered(tiny, "X: ", ["a", "b", "c"])
    result = qrun.Query('X: {{ gen v stop="!" max_tokens=2 heal=false }}').run(
        model=backend, speculate=False)
    record = gen_record(result, "v")
    assert record.finish == "max_tokens" and record.stop is None


def test_keep_stop_keeps_it_in_the_value_and_the_context(tiny: TransformersBackend) -> None:
    backend = steered(tiny, "X: ", ["a", ".", "\n", "b"])
    result = qrun.Query('X: {{ gen v stop="." keep_stop=true max_tokens=6 heal=false }}'
                        "\nY").run(model=backend, speculate=False)
    record = gen_record(result, "v")
    assert (result["v"], record.finish, record.stop) == ("a.", "stop", ".")
    assert result.text == "X: a.\nY"
    assert tiny.tokenizer.decode(result.token_ids) == result.text


def test_keep_stop_inside_a_token(tiny: TransformersBackend) -> None:
    # " end" holds the stop "en" and a "d" past it: the value keeps " en", and the "d" is
    # taken back (the next text does not begin with it).
    backend = SteeredModel(tiny, script(len(tiny.encode("X:")), tiny.encode(" end.")))
    result = qrun.Query('X:{{ gen v stop="en" keep_stop=true max_tokens=6 heal=false }}\nY'
                        ).run(model=backend, speculate=False)
    assert result["v"] == " en" and result.text == "X: en\nY"
    assert result.stats.boundary_dropped == 1
    assert tiny.tokenizer.decode(result.token_ids) == result.text


def test_keep_stop_on_a_server(tiny: TransformersBackend) -> None:
    server = ScriptedServer(tiny, ["ok.\nmore"])
    result = qrun.Query('V: {{ gen v stop="." keep_stop=true heal=false }}').run(model=server)
    assert result["v"] == "ok." and gen_record(result, "v").stop == "."


@pytest.mark.parametrize(("template", "message", "column"), [
    ('{{ gen v keep_stop=true }}', "keep_stop without stop=", 10),
    ('{{ gen v regex=INT stop="." keep_stop=true }}', "keep_stop cannot be used with regex=", 29),
])
def test_keep_stop_needs_a_stop_and_no_constraint(template: str, message: str,
                                                   column: int) -> None:
    check_the_one_error(template, message, column)


# ---- `holes.NAME`: the template reads how a hole ended ----------------------------------------


def test_a_template_reads_how_a_hole_ended(tiny: TransformersBackend) -> None:
    backend = steered(tiny, "X: ", ["a", "!", "b"])
    result = qrun.Query(
        'X: {{ gen v stop=["\\n", "!"] max_tokens=6 heal=false }}|'
        "{{ holes.v.finish }}|{{ holes.v.stop }}|{{ holes.v.text }}"
    ).run(model=backend, speculate=False)
    assert result.text == "X: a|stop|!|a"
    assert "holes" not in result.vars


def test_a_loop_hole_has_one_ending_per_round(tiny: TransformersBackend) -> None:
    result = qrun.Query(
        'X: {% for i in range(2) %}{{ gen v stop="!" max_tokens=2 heal=false }};'
        "{% endfor %}{{ holes.v | length }} {{ holes.v[0].finish }} {{ holes.v[-1].text }}"
    ).run(model=tiny, seed=1)
    first, last = result.hole_lists["v"]
    assert result.text.endswith(f";2 {first.finish} {last.text}")


def test_keep_going_until_a_stop_fired(tiny: TransformersBackend) -> None:
    # LMQL-style: a hole that ran out of tokens can be detected and treated differently.
    backend = steered(tiny, "X: ", ["a", "b", "c"])
    result = qrun.Query(
        'X: {{ gen v stop="." max_tokens=2 heal=false }}'
        '{% if holes.v.finish != "stop" %}...{% endif %}').run(model=backend, speculate=False)
    assert result.text == "X: ab..."


@pytest.mark.parametrize(("template", "message", "column"), [
    ("{{ holes.answr.finish }}{{ gen answer }}", "'holes' has no hole 'answr'", 4),
    ("{{ holes.answer.finish }}{{ gen answer }}", "'answer' is used before it is captured", 4),
    ("{% if x %}{{ gen a }}{% endif %}{{ holes.a.stop }}",
     "'a' is not captured on every path", 36),
    ("{% set holes = 1 %}", "'holes' is reserved", 8),
    ("{% for x in [1] %}{{ holes.x.finish }}{% endfor %}{{ gen x }}",
     "'x' is used before it is captured", 22),
    ("{{ gen holes }}", "'holes' is reserved", 8),
    # issue #38: passed --check and failed at run time, after the model ran
    ('{{ select c options=["a", "b"] }}{{ holes.c.option_probs }}',
     "'holes.c' has no attribute 'option_probs'", 37),
    ("{{ gen a }}{{ holes.a.finsh }}", "'holes.a' has no attribute 'finsh'", 15),
])
def test_holes_are_checked_when_the_template_compiles(template: str, message: str,
                                                      column: int) -> None:
    check_the_one_error(template, message, column)


def test_every_field_check_knows_is_in_a_hole_ending(tiny: TransformersBackend) -> None:
    from qrun.lang.evaluate import HOLE_ENDING_FIELDS

    ending = qrun.Query("{{ gen a max_tokens=2 }}{{ holes.a | tojson }}").run(model=tiny)
    assert sorted(json.loads(ending.text[len(ending["a"]):])) == sorted(HOLE_ENDING_FIELDS)


def test_is_defined_guards_a_hole_on_some_paths(tiny: TransformersBackend) -> None:
    query = qrun.Query("{% if x %}{{ gen a max_tokens=1 }}{% endif %}"
                       "{% if holes.a is defined %}ran{% else %}skipped{% endif %}")
    assert query.run(model=tiny, x=False).text == "skipped"
    assert query.run(model=tiny, x=True).text.endswith("ran")


def test_the_docs_example_runs(tiny: TransformersBackend) -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs/language.md").read_text()
    section = docs.split("### 7.6 How a hole ended")[1]
    example = section.split("```\n")[1]
    result = qrun.Query(example).run(model=tiny, seed=2)
    record = gen_record(result, "answer")
    ending = ("(cut short)" if record.finish == "max_tokens"
              else f"(ended by {json.dumps(record.stop)})")
    assert result.text.endswith(ending)


def test_the_longest_stop_at_a_place_is_kept(tiny: TransformersBackend) -> None:
    backend = steered(tiny, "X: ", ["a", "\n\n", "b"])
    for stops in ('["\\n", "\\n\\n"]', '["\\n\\n", "\\n"]'):
        result = qrun.Query(f"X: {{{{ gen v stop={stops} keep_stop=true max_tokens=4 "
                            "heal=false }}").run(model=backend, speculate=False)
        assert result["v"] == "a\n\n" and gen_record(result, "v").stop == "\n\n"


def test_a_guarded_hole_ending_is_known_in_the_guard(tiny: TransformersBackend) -> None:
    query = qrun.Query("{% if x %}{{ gen a max_tokens=1 }}{% endif %}"
                       "{% if holes.a is defined %}[{{ holes.a.finish }}]{% endif %}")
    assert query.run(model=tiny, x=True).text.endswith("[max_tokens]")
    assert query.run(model=tiny, x=False).text == ""
