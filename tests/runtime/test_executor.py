"""Executing programs end to end on the tiny model, through the Python API."""

from __future__ import annotations

import pytest
import regex

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import EvaluationError, InputError, QrunError


def run(tiny: TransformersBackend, template: str, **inputs: object) -> qrun.Result:
    return qrun.Query(template).run(model=tiny, **inputs)


def test_text_interpolation_and_hole(tiny: TransformersBackend) -> None:
    r = run(tiny, "Hi {{ name }}! {{ gen x max_tokens=3 }}.", name="Ann")
    assert r.text == f"Hi Ann! {r['x']}."
    assert len(r.holes["x"].token_ids) == 3  # type: ignore[union-attr]
    assert r.vars == {"x": r["x"]}


def test_loops_capture_lists_and_expose_loop_info(tiny: TransformersBackend) -> None:
    template = (
        "{% for c in colours %}{{ loop.index }}/{{ loop.index0 }}"
        "{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %}:{{ c }}="
        "{{ gen v max_tokens=1 }};{% endfor %}"
    )
    r = run(tiny, template, colours=["red", "green", "blue"])
    assert isinstance(r["v"], list) and len(r["v"]) == 3
    expected = "".join(
        f"{i + 1}/{i}{'F' if i == 0 else ''}{'L' if i == 2 else ''}:{c}={v};"
        for i, (c, v) in enumerate(zip(["red", "green", "blue"], r["v"], strict=True))
    )
    assert r.text == expected
    assert len(r.holes["v"]) == 3  # type: ignore[arg-type]


def test_a_loop_that_never_runs_captures_an_empty_list(tiny: TransformersBackend) -> None:
    r = run(tiny, "x{% for c in items %}{{ gen v max_tokens=1 }}{% endfor %}", items=[])
    assert r["v"] == [] and r.text == "x"


def test_branches_follow_earlier_captures(tiny: TransformersBackend) -> None:
    template = (
        'Pick: {{ select p options=["yes", "no"] }}'
        '{% if p == "yes" %} Y{% elif p == "no" %} N{% else %} ?{% endif %}'
    )
    r = run(tiny, template)
    assert r.text.endswith(" Y" if r["p"] == "yes" else " N")
    assert set(r["p__logprobs"]) == {"yes", "no"}


def test_set_binds_values(tiny: TransformersBackend) -> None:
    r = run(tiny, '{% set greeting = "Hello, " + name | upper %}{{ greeting }}!', name="bo")
    assert r.text == "Hello, BO!"


def test_roles_use_the_models_chat_markers(tiny: TransformersBackend) -> None:
    r = run(tiny, "{% system %}Be brief.{% endsystem %}{% user %}Hi{% enduser %}"
            "{% assistant %}{{ gen reply max_tokens=2 }}{% endassistant %}")
    assert r.text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        f"<|im_start|>assistant\n{r['reply']}<|im_end|>\n"
    )
    # The markers are the model's special tokens, not their spelled-out characters.
    im_start = tiny.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tiny.encode("<|im_start|>system\n")[0] == im_start


def test_same_seed_same_output_and_seeds_differ(tiny: TransformersBackend) -> None:
    q = qrun.Query("Story: {{ gen s max_tokens=8 temperature=1.0 }}")
    outputs = [q.run(model=tiny, seed=s)["s"] for s in (1, 1, 2, 3)]
    assert outputs[0] == outputs[1]
    assert len(set(outputs)) > 1


def test_missing_inputs_are_reported_together(tiny: TransformersBackend) -> None:
    with pytest.raises(InputError) as info:
        run(tiny, "{{ a }} and {{ b }}")
    assert "'a', 'b'" in info.value.message
    assert (info.value.span.line, info.value.span.column) == (1, 4)


def test_runtime_argument_errors_have_positions(tiny: TransformersBackend) -> None:
    with pytest.raises(EvaluationError) as info:
        run(tiny, "x\n{{ gen v max_tokens=n }}", n="many")
    assert info.value.span.line == 2
    assert "max_tokens" in info.value.message


def test_run_many_keeps_going_after_a_failure(tiny: TransformersBackend) -> None:
    q = qrun.Query("{{ word }}: {{ gen v max_tokens=2 }}")
    results = q.run_many([{"word": "a"}, {}, {"word": "c"}], model=tiny)
    assert isinstance(results[0], qrun.Result) and results[0].text.startswith("a: ")
    assert isinstance(results[1], QrunError)
    assert isinstance(results[2], qrun.Result) and results[2].text.startswith("c: ")


def test_from_file_reports_under_the_path(tmp_path: object, tiny: TransformersBackend) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "q.tmpl"
    path.write_text("A {{ gen x max_tokens=1 }}")
    q = qrun.Query.from_file(path)
    assert q.program.source.name == str(path)
    assert q.run(model=tiny).text.startswith("A ")


@pytest.mark.parametrize(
    "template",
    [
        "Q: {{ q }}\nA: {{ gen a max_tokens=6 stop=[\".\", \"\\n\"] }}\n"
        "Q2: {{ gen b max_tokens=4 }}",
        "{% user %}Hi {{ q }}{% enduser %}{% assistant %}{{ gen a max_tokens=5 stop=\" \" }}"
        "{% endassistant %}",
        "Date: {{ gen d regex=DATE }}; code {{ gen c regex=\"[A-Z]{3}-[0-9]{2}\" }}",
        'x{{ gen a max_tokens=3 stop="e" }}{{ gen b max_tokens=3 stop="a" }}'
        '{{ gen c max_tokens=2 }}',
    ],
)
def test_the_context_is_the_text_the_user_reads(tiny: TransformersBackend, template: str) -> None:
    for seed in range(4):
        r = qrun.Query(template).run(model=tiny, temperature=1.0, seed=seed, q="why?")
        context = tiny.tokenizer.decode(r.token_ids, skip_special_tokens=False)
        assert context == r.text
        assert r.stats.context_tokens == len(r.token_ids)
        assert r.stats.forward_tokens <= r.stats.context_tokens + r.stats.rollback_tokens


def test_a_stop_ends_a_regex_hole_only_where_the_value_matches(
    tiny: TransformersBackend,
) -> None:
    # A "b" ends the hole only where the value before it matches [a-c]+: a "b" at the very
    # start (empty value) is value text, any later "b" is the stop.
    stopped = 0
    for seed in range(12):
        r = run_seeded(tiny, 'x {{ gen v regex="[a-c]+" stop="b" max_tokens=5 }}', seed)
        assert regex.fullmatch("[a-c]+", r["v"])
        assert "b" not in r["v"][1:]
        stopped += r.holes["v"].finish == "stop"  # type: ignore[union-attr]
    assert stopped > 0


def run_seeded(tiny: TransformersBackend, template: str, seed: int) -> qrun.Result:
    return qrun.Query(template).run(model=tiny, temperature=1.0, seed=seed)


def test_an_empty_loop_capture_is_an_empty_list_in_the_template(
    tiny: TransformersBackend,
) -> None:
    r = run(tiny, "{% for x in [] %}{{ gen a }}{% endfor %}[{{ a | join(',') }}]{{ len(a) }}")
    assert r.text == "[]0"
