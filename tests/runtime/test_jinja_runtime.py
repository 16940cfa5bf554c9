"""The Jinja subset run end to end on the tiny model (docs/language.md §9, §2.1, §5): break and
continue around holes (loop captures hold one item per time the hole ran), chat turns closed by
a break, unpacking loops, includes (their text, captures and run-time errors positioned in the
included file) and runs that leave optional inputs out."""

from __future__ import annotations

from pathlib import Path

import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import EvaluationError


def run(model: TransformersBackend, template: str, **inputs: object) -> qrun.Result:
    return qrun.Query(template).run(model=model, max_tokens=2, **inputs)


def test_break_and_continue_around_a_hole(model: TransformersBackend) -> None:
    template = ("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}"
                "<{{ x }}:{{ gen n }}>{% if x == 4 %}{% break %}{% endif %}{% endfor %}"
                "|{{ n | length }}")
    r = run(model, template, xs=[1, 2, 3, 4, 5])
    assert len(r["n"]) == 3 and len(r.hole_lists["n"]) == 3
    assert [rec.value for rec in r.hole_lists["n"]] == r["n"]
    expected = "".join(f"<{x}:{v}>" for x, v in zip([1, 3, 4], r["n"], strict=True))
    assert r.text == expected + "|3"


def test_a_break_before_the_hole_captures_nothing_for_that_iteration(
        model: TransformersBackend) -> None:
    template = ("{% for x in xs %}{% if x == 3 %}{% break %}{% endif %}{{ x }}={{ gen n }};"
                "{% endfor %}{% for y in xs %}{% continue %}{{ gen never }}{% endfor %}"
                "[{{ never | default([]) | length }}]")  # `never` follows a continue: unreachable
    r = run(model, template, xs=[1, 2, 3, 4])
    assert len(r["n"]) == 2 and r["never"] == []
    assert r.text == f"1={r['n'][0]};2={r['n'][1]};[0]"


def test_break_leaves_only_the_innermost_loop(model: TransformersBackend) -> None:
    template = ("{% for a in [1, 2] %}{% for b in [1, 2, 3] %}{% if b == 2 %}{% break %}"
                "{% endif %}{{ a }}{{ b }} {% endfor %}/{% endfor %}")
    assert run(model, template).text == "11 /21 /"


def test_a_break_inside_a_chat_turn_still_closes_the_turn(model: TransformersBackend) -> None:
    template = ("{% for m in ms %}{% user %}{{ m }}{% if loop.index == 2 %}{% break %}{% endif %}"
                "!{% enduser %}{% endfor %}{% assistant %}{{ gen r }}{% endassistant %}")
    r = run(model, template, ms=["a", "b", "c"])
    assert r.text.startswith("<|im_start|>user\na!<|im_end|>\n<|im_start|>user\nb<|im_end|>\n"
                             "<|im_start|>assistant\n")


def test_loops_unpack_pairs(model: TransformersBackend) -> None:
    template = ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}"
                "{% for a, b in pairs %}{{ a ~ b }}{% endfor %}")
    r = run(model, template, d={"x": 1, "y": [2]}, pairs=[["p", 1], "qr"])
    assert r.text == "x=1;y=[2];p1qr"
    with pytest.raises(EvaluationError) as info:
        run(model, "\n{% for a, b in pairs %}{% endfor %}", pairs=[[1, 2, 3]])
    assert info.value.message == "cannot unpack 3 values into 2 names"
    assert (info.value.span.line, info.value.span.column) == (2, 1)


def test_optional_inputs_may_be_left_out(model: TransformersBackend) -> None:
    query = qrun.Query("Hi {{ name | default('you') | title }}"
                       "{% if title is defined %} ({{ title }}){% endif %}.")
    assert query.inputs == () and query.optional_inputs == ("name", "title")
    assert query.run(model=model).text == "Hi You."
    assert query.run(model=model, name="ada lovelace", title="Countess").text == (
        "Hi Ada Lovelace (Countess).")


def test_includes_run_with_their_own_positions(model: TransformersBackend,
                                               tmp_path: Path) -> None:
    (tmp_path / "main.tmpl").write_text(
        'Q: {{ q }}\n{% include "answer.tmpl" %}Done: {{ a }}', encoding="utf-8")
    (tmp_path / "answer.tmpl").write_text(
        "A: {{ gen a max_tokens=2 }}\n{{ 1 // zero if zero is defined else '' }}",
        encoding="utf-8")
    query = qrun.Query.from_file(tmp_path / "main.tmpl")
    r = query.run(model=model, q="why?")
    assert r.text == f"Q: why?\nA: {r['a']}\nDone: {r['a']}"
    with pytest.raises(EvaluationError) as info:
        query.run(model=model, q="why?", zero=0)
    err = info.value
    assert err.source.name == str(tmp_path / "answer.tmpl")
    assert (err.span.line, err.span.column) == (2, 4) and err.message == "division by zero"
