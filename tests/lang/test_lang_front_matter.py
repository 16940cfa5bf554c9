"""The front matter's YAML (qrun/lang/front_matter.py): today's `key: value` files read as they
did, values and positions of YAML entries, and hostile YAML refused with a position."""

from __future__ import annotations

import pytest

from qrun.errors import TemplateError, TemplateErrors, TemplateSyntaxError
from qrun.lang import ast, compile_source
from qrun.lang.build import build_ast
from qrun.lang.front_matter import MAX_FRONT_MATTER_DEPTH, MAX_FRONT_MATTER_SIZE
from qrun.lang.parser import parse
from qrun.source import Source


def build(text: str) -> ast.Template:
    source = Source("t.tmpl", text)
    return build_ast(parse(source), source)


def errors_of(text: str) -> tuple[TemplateError, ...]:
    with pytest.raises(TemplateErrors) as info:
        compile_source(text, "t.tmpl")
    return tuple(info.value.errors)


# Front matter as the `key: value` lines before YAML read it, and what it meant then.
OLD_STYLE = [
    ("model: smollm2\ntemperature: 0.7\n", {"model": "smollm2"}, {"temperature": 0.7}),
    ("temperature: 1e-3\n", {}, {"temperature": 0.001}),  # a float (qrun/yaml_data.py)
    ('seed: "12"\nmax_tokens: \'40\'\n', {}, {"seed": 12, "max_tokens": 40}),
    ("top_p: 0.9\ntop_k: 5\n", {}, {"top_p": 0.9, "top_k": 5}),
    ("model: HuggingFaceTB/SmolLM2-135M-Instruct\ndevice: cuda:0\ndtype: float16\n",
     {"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "device": "cuda:0", "dtype": "float16"},
     {}),
    ("model: ./models/tiny model.gguf\n", {"model": "./models/tiny model.gguf"}, {}),
    ("# a comment\n\nmodel: smollm2\n  # indented comment\n", {"model": "smollm2"}, {}),
]


@pytest.mark.parametrize(("front", "model", "options"), OLD_STYLE)
def test_old_style_front_matter_reads_as_before(front: str, model: dict[str, object],
                                               options: dict[str, object]) -> None:
    program = compile_source(f"---\n{front}---\nhi")
    for key, value in model.items():
        assert getattr(program.model, key) == value
    for key, value in options.items():
        assert getattr(program.options, key) == value


def test_old_style_inputs_list_stays_untyped() -> None:
    program = compile_source("---\ninputs: [question, 'context']\n---\n{{ question }}"
                             "{{ context }}")
    assert program.inputs == ("question", "context")
    assert program.input_types == {}
    assert program.input_schema["properties"] == {"question": {}, "context": {}}


def test_entry_keeps_text_data_and_positions() -> None:
    template = build("---\nmodel: smollm2\ninputs:\n  name: string\n  tags: list[string]\n"
                     "---\nx")
    assert template.front_matter is not None
    model, inputs = template.front_matter.entries
    assert (model.key, model.value, model.data, model.scalar) == ("model", "smollm2",
                                                                  "smollm2", "smollm2")
    assert inputs.data == {"name": "string", "tags": "list[string]"}
    assert inputs.scalar is None
    tags = inputs.span_of(("tags",))
    assert (tags.line, tags.column) == (5, 9)
    key = inputs.span_of(("tags",), key=True)
    assert (key.line, key.column) == (5, 3)


def test_dates_and_merge_keys_stay_text() -> None:
    template = build('---\ninputs:\n  day: {type: string, default: 2024-01-02}\n---\n')
    assert template.front_matter is not None
    assert template.front_matter.entries[0].data == {
        "day": {"type": "string", "default": "2024-01-02"}}


HOSTILE = [
    ("alias", "inputs: &a [x]\nmodel: *a\n", 1, 9, "anchors and aliases"),
    ("billion-laughs", 'inputs:\n  a: &a ["lol","lol"]\n  b: &b [*a,*a,*a]\n  c: [*b,*b]\n',
     2, 6, "anchors and aliases"),
    ("python-tag", "model: !!python/object/apply:os.system ['echo hi']\n", 1, 8, "YAML tags"),
    ("binary-tag", "model: !!binary aGk=\n", 1, 8, "YAML tags"),
    ("local-tag", "model: !mine x\n", 1, 8, "YAML tags"),
    ("not-a-mapping", "- a\n- b\n", 1, 1, "'key: value' lines"),
    ("scalar", "not a pair\n", 1, 1, "'key: value' lines"),
    ("bad-yaml", "model: a: b\n", 1, 9, "not valid YAML"),
    ("unclosed-flow", "inputs: [a, b\n", 2, 1, "not valid YAML"),
    ("tab-indent", "inputs:\n\tname: string\n", 2, 1, "not valid YAML"),
    ("non-string-key", "inputs:\n  1: string\n", 2, 3, "must be a string"),
    ("nested-duplicate", "inputs:\n  a: string\n  a: integer\n", 3, 3, "given twice"),
    ("deep", "inputs: " + "[" * (MAX_FRONT_MATTER_DEPTH + 1) + "]" * (MAX_FRONT_MATTER_DEPTH + 1)
     + "\n", 1, 8 + MAX_FRONT_MATTER_DEPTH, "levels deep"),  # the mapping is a level
]


@pytest.mark.parametrize(("front", "line", "column", "message"),
                         [case[1:] for case in HOSTILE], ids=[case[0] for case in HOSTILE])
def test_hostile_front_matter_is_a_positioned_error(front: str, line: int, column: int,
                                                    message: str) -> None:
    errors = errors_of(f"---\n{front}---\nbody")
    assert len(errors) == 1, [e.render() for e in errors]
    err = errors[0]
    assert isinstance(err, TemplateSyntaxError), err.render()
    assert message in err.message, err.render()
    assert (err.span.line, err.span.column) == (line + 1, column), err.render()


def test_front_matter_size_is_bounded() -> None:
    front = "# " + "x" * MAX_FRONT_MATTER_SIZE + "\n"
    errors = errors_of(f"---\n{front}---\nbody")
    assert "characters long" in errors[0].message
    assert (errors[0].span.line, errors[0].span.column) == (1, 1)


def test_top_level_duplicate_key_names_the_first() -> None:
    errors = errors_of("---\nseed: 1\nseed: 2\n---\n")
    assert "given twice" in errors[0].message and errors[0].span.line == 3


def test_list_value_for_a_setting_is_refused() -> None:
    errors = errors_of("---\ntemperature: [1]\n---\n")
    assert "'temperature' must be" in errors[0].message
    assert (errors[0].span.line, errors[0].span.column) == (2, 14)


def test_plain_values_are_yaml_1_2_json_types_not_yaml_1_1() -> None:
    template = build("---\ninputs:\n  a: {enum: [yes, no, on, off, true, FALSE], default: yes}\n"
                     "  b: {type: string, examples: [0123, '1:30', 1:30, .nan, .inf, 0x1F]}\n"
                     "  c: {type: number, maximum: 1e3, minimum: -1.5e-2, default: 0}\n"
                     "  d: {enum: [~, null, 12, -3, .5]}\n---\n")
    assert template.front_matter is not None
    data = template.front_matter.entries[0].data
    assert data["a"] == {"enum": ["yes", "no", "on", "off", True, False], "default": "yes"}
    assert data["b"]["examples"] == ["0123", "1:30", "1:30", ".nan", ".inf", "0x1F"]
    assert data["c"]["maximum"] == 1000 and isinstance(data["c"]["maximum"], float)
    assert data["c"]["minimum"] == -0.015 and data["c"]["default"] == 0
    assert data["d"] == {"enum": [None, None, 12, -3, 0.5]}


def test_an_enum_of_yes_and_no_is_two_strings() -> None:
    program = compile_source("---\ninputs:\n  answer: enum[yes, no]\n  also: {enum: [yes, no]}\n"
                             "---\n{{ answer }}{{ also }}")
    assert program.input_schema["properties"]["also"]["enum"] == ["yes", "no"]


@pytest.mark.parametrize(("front", "line", "column", "message"), [
    ("tests: 5\n", 2, 8, "'tests' must be a list of cases"),
    ("tests: {inputs: {}}\n", 2, 8, "'tests' must be a list of cases"),
    ("tests:\n  - expect: {text: a}\n  - just text\n", 4, 5, "a case in front matter 'tests' "
     "is a mapping"),
])
def test_tests_block_that_is_no_list_of_cases_is_a_compile_error(
        front: str, line: int, column: int, message: str) -> None:
    err, = errors_of(f"---\n{front}---\nhi")
    assert message in err.message, err.render()
    assert (err.span.line, err.span.column) == (line, column)
    program = compile_source("---\ntests:\n  - expect: {text: hi}\n---\nhi")
    assert program.tests is not None
