"""One lowering for every user of a constraint (qrun/constraint/spec.py lower): what each kind
lowers to, its errors with their place inside the constraint, lowering once per distinct value
per process, and the compiler, the runtime and qrun.Matcher agreeing because they all call it."""

from __future__ import annotations

import json
import uuid
from typing import Any

import numpy as np
import pytest

import qrun
import qrun.constraint.spec as spec_module
from qrun.backends.transformers import TransformersBackend
from qrun.constraint.patterns import PATTERNS
from qrun.constraint.spec import DFA, LLGUIDANCE, LoweringError, lower, typed_value


def fresh(text: str) -> str:
    """`text` made unique, so this process has never lowered it."""
    return f"{text}{uuid.uuid4().hex[:8]}"


def test_each_kind_lowers_to_its_engine_and_value_type() -> None:
    regex = lower("regex", "[0-9]+")
    assert (regex.pattern, regex.engine, regex.value_type) == ("[0-9]+", DFA, "text")
    assert regex.description == 'regex="[0-9]+"'
    named = lower("pattern", "INT")
    assert (named.pattern, named.value_type, named.description) == (PATTERNS["INT"], "int",
                                                                    "regex=INT")
    options = lower("options", ["a.b", "c"])
    assert options.engine == DFA and options.pattern == r"(?:a\.b|c)"
    schema = lower("json", {"type": "integer"})
    assert (schema.engine, schema.value_type) == (LLGUIDANCE, "json")
    assert "%json" in schema.pattern
    assert lower("json", '{"type": "integer"}') == schema  # its JSON text: the same spec
    grammar = lower("grammar", 'start: "a" | "b"')
    assert (grammar.engine, grammar.value_type) == (LLGUIDANCE, "text")


def test_a_value_is_lowered_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    check_schema, compile_dfa = spec_module.check_schema, spec_module.compile_dfa
    monkeypatch.setattr(spec_module, "check_schema",
                        lambda schema, *rest: calls.append(schema) or check_schema(schema, *rest))
    monkeypatch.setattr(spec_module, "compile_dfa",
                        lambda pattern: calls.append(pattern) or compile_dfa(pattern))
    schema = {"type": "object", "properties": {fresh("p"): {"type": "integer"}}}
    first = lower("json", schema)
    assert lower("json", json.loads(json.dumps(schema))) is first  # an equal value
    bad = fresh("[a-")
    for _ in range(2):
        with pytest.raises(LoweringError):
            lower("regex", bad)
    assert calls == [schema, bad]


def test_property_order_is_part_of_a_schema() -> None:
    # llguidance writes properties in the schema's order: two orders are two constraints.
    name, age = fresh("name"), fresh("age")
    one = {"type": "object", "properties": {name: {"type": "string"}, age: {"type": "integer"}},
           "required": [name, age]}
    other = {"type": "object", "properties": {age: {"type": "integer"}, name: {"type": "string"}},
             "required": [name, age]}
    assert lower("json", one).pattern != lower("json", other).pattern


@pytest.mark.parametrize(("kind", "value", "message", "where"), [
    ("regex", "ab(c", "missing )", {"offset": 2}),
    ("regex", 5, "regex must be a string, got int", {"wrong_type": True}),
    ("pattern", "EMIAL", "unknown pattern 'EMIAL'", {"notes": ("did you mean 'EMAIL'?",)}),
    ("options", [], "options must be a non-empty list", {"wrong_type": True}),
    ("json", "{not json", "the JSON Schema is not valid JSON", {}),
    ("json", [1], "json must be a JSON Schema object, got list", {"wrong_type": True}),
    ("json", {"type": "string", "pattern": "(?<=a)b"}, "JSON Schema:", {}),
    ("grammar", 'start: "a"\nb: %oops', "grammar:", {"line": 2}),
    ("grammar", "  ", "grammar must be a non-empty string", {"wrong_type": True}),
])
def test_errors_say_why_and_where(kind: str, value: Any, message: str,
                                  where: dict[str, Any]) -> None:
    with pytest.raises(LoweringError) as caught:
        lower(kind, value)
    error = caught.value
    assert message in error.message
    for field, expected in where.items():
        got = getattr(error, field)
        assert got == expected if field != "notes" else expected[0] in got


def test_the_compiler_keeps_a_literal_spec_the_run_uses(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    query = qrun.Query('{{ gen n regex="[1-9][0-9]?" }} {{ gen j json={"type": "boolean"} }}')

    def no_lowering(*args: Any) -> Any:
        raise AssertionError("a literal constraint was lowered again at run time")

    monkeypatch.setattr("qrun.runtime.constraints.lower", no_lowering)
    result = query.run(model=tiny, seed=1, temperature=1.0)
    assert 1 <= int(result.vars["n"]) <= 99 and isinstance(result.vars["j"], bool)


def test_a_computed_constraint_is_lowered_once_per_distinct_value(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    compile_dfa = spec_module.compile_dfa
    monkeypatch.setattr(spec_module, "compile_dfa",
                        lambda pattern: calls.append(pattern) or compile_dfa(pattern))
    a, b = fresh("a"), fresh("b")
    query = qrun.Query("{% for p in patterns %}{{ gen v regex=p max_tokens=12 }};{% endfor %}")
    result = query.run({"patterns": [a, b, a, a, b]}, model=tiny, seed=0)
    assert result.vars["v"] == [a, b, a, a, b]
    assert sorted(calls) == sorted([a, b])


def test_matcher_and_holes_refuse_alike(tiny: TransformersBackend) -> None:
    bad = '{"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}}}'
    with pytest.raises(qrun.ConstraintError) as by_matcher:
        qrun.Matcher(tiny, json=bad)
    with pytest.raises(qrun.TemplateErrors) as by_compiler:
        qrun.Query("{{ gen v json=" + bad + " }}").check()
    with pytest.raises(qrun.ConstraintError) as by_runtime:
        qrun.Query("{{ gen v json=s }}").run({"s": bad}, model=tiny)
    messages = {by_matcher.value.message, by_compiler.value.errors[0].message,
                by_runtime.value.message}
    assert len(messages) == 1 and "/properties/a" in messages.pop()


def test_a_matcher_compiles_a_new_schema_once(tiny: TransformersBackend,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue #24 item 4: qrun.Matcher builds a dict schema's index directly (the build is
    # llguidance's check) instead of lower()'s check and then a build; a refused one still
    # gets lower()'s located error, the same as from its JSON text.
    import qrun.constraint.grammar.text as grammar_text

    checks: list[str] = []
    validate = grammar_text.validate
    monkeypatch.setattr(grammar_text, "validate", lambda grammar, *a, **k: (
        checks.append(grammar) or validate(grammar, *a, **k)))
    schema = {"type": "object", "properties": {"once": {"type": "integer"}},
              "required": ["once"], "title": fresh("compiled once")}
    matcher = qrun.Matcher(tiny, json=schema)
    assert matcher.consume_text('{"once": 12}') and matcher.accepting()
    text = json.dumps({**schema, "title": fresh("as text")})
    assert qrun.Matcher(tiny, json=text).consume_text('{"once": 3}')
    assert checks == []
    bad = '{"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}}}'
    with pytest.raises(qrun.ConstraintError) as from_dict:
        qrun.Matcher(tiny, json=json.loads(bad))
    with pytest.raises(qrun.ConstraintError) as from_text:
        qrun.Matcher(tiny, json=bad)
    assert from_dict.value.message == from_text.value.message
    assert "/properties/a" in from_dict.value.message
    # Located once, by lower() (the refusal of the direct build is not located again).
    checks.clear()
    with pytest.raises(qrun.ConstraintError):
        qrun.Matcher(tiny, json={**json.loads(bad), "title": fresh("located once")})
    once = len(checks)
    checks.clear()
    grammar_text.check_schema({**json.loads(bad), "title": fresh("located")})
    assert once == len(checks) > 0


# ---- the size limits of a constraint (grammar/limits.py) reach every lowering ----------------

GRAMMAR = 'start: "yes" | "no" | "maybe" | "later"'  # 41 characters
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                           "c": {"type": "integer"}}}  # 3 optional


def test_a_run_checks_constraints_under_its_own_limits(tiny: TransformersBackend) -> None:
    query = qrun.Query("{{ gen g grammar=lark }} {{ gen j json=s }}")
    inputs = {"lark": GRAMMAR, "s": SCHEMA}
    result = query.run(inputs, model=tiny, seed=0)
    assert result.vars["g"] in ("yes", "no", "maybe", "later")
    with pytest.raises(qrun.ConstraintError) as tight:
        query.run(inputs, model=tiny, limits=qrun.Limits(grammar_chars=20))
    assert "grammar_chars" in " ".join(tight.value.notes)
    with pytest.raises(qrun.ConstraintError) as crowded:
        query.run(inputs, model=tiny, limits=qrun.Limits(optional_properties=2))
    assert "optional_properties" in " ".join(crowded.value.notes)


def test_a_literal_is_checked_again_when_a_run_lowers_the_limits(
        tiny: TransformersBackend) -> None:
    query = qrun.Query("{{ gen g grammar='" + GRAMMAR.replace('"', '\\"') + "' }}")
    assert query.run(model=tiny, seed=0).vars["g"] in ("yes", "no", "maybe", "later")
    with pytest.raises(qrun.ConstraintError, match="grammar"):
        query.run(model=tiny, limits=qrun.Limits(grammar_chars=20))


def test_a_literal_over_the_default_limits_is_a_compile_error_that_says_how() -> None:
    crowded = {"type": "object",
               "properties": {f"p{i}": {"type": "integer"} for i in range(4_001)}}
    with pytest.raises(qrun.TemplateErrors) as caught:
        qrun.Query("{{ gen j json=" + json.dumps(crowded) + " }}")
    error = caught.value.errors[0]
    assert "optional properties" in error.message
    assert any("qrun.Limits(optional_properties=" in note for note in error.notes)


def test_matcher_takes_limits(tiny: TransformersBackend) -> None:
    assert qrun.Matcher(tiny, grammar=GRAMMAR).consume_text("maybe")
    with pytest.raises(qrun.ConstraintError) as caught:
        qrun.Matcher(tiny, grammar=GRAMMAR, limits=qrun.Limits(grammar_chars=20))
    assert "Matcher(..., limits=qrun.Limits(grammar_chars=" in " ".join(caught.value.notes)
    with pytest.raises(qrun.UsageError, match="limits must be a qrun.Limits"):
        qrun.Matcher(tiny, grammar=GRAMMAR, limits={"grammar_chars": 5})  # type: ignore[arg-type]


def test_a_named_pattern_keeps_its_type_under_a_runs_limits(tiny: TransformersBackend) -> None:
    # A run with its own limits used to lower regex=INT again as a plain regex: "313".
    query = qrun.Query("{{ gen x regex=INT max_tokens=3 }} {{ gen b regex=BOOL }}")
    for limits in (None, qrun.Limits(grammar_chars=200_000)):
        result = query.run(model=tiny, seed=0, limits=limits)
        assert isinstance(result.vars["x"], int) and isinstance(result.vars["b"], bool)


@pytest.mark.parametrize("names", [{"enum": ["a"], "pattern": "("},
                                   {"enum": ["a"], "minLength": "x"},
                                   {"enum": ["a"], "type": "nonsense"}])
def test_a_name_schema_the_validator_cannot_read_is_a_located_refusal(
        tiny: TransformersBackend, names: dict[str, Any]) -> None:
    schema = {"type": "object", "propertyNames": names}
    with pytest.raises(qrun.TemplateErrors) as caught:
        qrun.Query("{{ gen x json=" + json.dumps(schema) + " }}")
    assert "/propertyNames" in caught.value.errors[0].message
    with pytest.raises(qrun.ConstraintError):
        qrun.Matcher(tiny, json=schema)


def test_annotation_formats_leave_property_names_alone_too(tiny: TransformersBackend) -> None:
    schema = {"type": "object", "propertyNames": {"enum": ["a", "b@c.d"], "format": "email"}}
    assert qrun.Matcher(tiny, json=schema, formats="annotation").consume_text('{"a": 1}')
    assert not qrun.Matcher(tiny, json=schema, formats="known").consume_text('{"a": 1}')


@pytest.mark.parametrize("closed", ["no", [], 1])
def test_matcher_checks_closed(tiny: TransformersBackend, closed: Any) -> None:
    with pytest.raises(qrun.UsageError, match="closed must be true or false, got "):
        qrun.Matcher(tiny, json={"type": "object"}, closed=closed)


def test_closed_and_formats_have_one_check_and_one_wording(tiny: TransformersBackend) -> None:
    # JsonFormat.checked: a literal argument at --check (lang/args.py), a computed one when
    # its hole runs (runtime/constraints.py), and qrun.Matcher's options.
    wording = 'closed must be true or false, got "no"'
    with pytest.raises(qrun.TemplateErrors, match=wording):
        qrun.Query('{{ gen v json={"type": "object"} closed="no" }}')
    query = qrun.Query('{{ gen v json={"type": "object"} closed=c max_tokens=5 }}')
    with pytest.raises(qrun.EvaluationError, match=wording):
        query.run({"c": "no"}, model=tiny)
    with pytest.raises(qrun.UsageError, match=wording):
        qrun.Matcher(tiny, json={"type": "object"}, closed="no")
    with pytest.raises(qrun.UsageError, match='layout must be "flexible" or "fixed", got "x"'):
        qrun.Matcher(tiny, json={"type": "object"}, layout="x")
    tools = qrun.Query('{{ gen v tools=t formats=f max_tokens=5 }}')
    with pytest.raises(qrun.EvaluationError,
                       match='formats must be "assert", "known" or "annotation", got 3'):
        tools.run({"t": [{"name": "now"}], "f": 3}, model=tiny)


@pytest.mark.parametrize("given", [{"regex": "4[0-9]"}, {"json": {"enum": [42, 43]}}])
def test_matcher_rolls_back_and_resets_on_its_cursor(tiny: TransformersBackend,
                                                      given: dict[str, Any]) -> None:
    # Matcher moves the hole's own cursor (MaskCursor, LlgCursor): rollback is the cursor's.
    vocab = tiny.vocabulary
    four, two, three = (vocab.ids_of(digit)[0] for digit in (b"4", b"2", b"3"))
    eos = min(vocab.eos_token_ids)
    matcher = qrun.Matcher(tiny, **given)
    start = matcher.allowed()
    assert matcher.consume(four) and matcher.consume(two) and matcher.accepting()
    assert not matcher.consume(four)  # "424": refused, and nothing changes
    assert matcher.consume(eos) and not matcher.allowed().any()
    matcher.rollback(2)  # the EOS and the "2"
    assert not matcher.accepting() and matcher.consume(three) and matcher.accepting()
    matcher.reset()
    assert np.array_equal(matcher.allowed(), start) and not matcher.accepting()
    with pytest.raises(ValueError, match="cannot roll back 1 tokens"):
        matcher.rollback(1)


@pytest.mark.parametrize(("text", "value_type"), [
    ("1e400", "float"), ("-1e400", "float"), ('{"a": 1e400}', "json"), ("[NaN]", "json"),
    ("Infinity", "json")])
def test_typed_value_refuses_numbers_json_cannot_carry(text: str, value_type: str) -> None:
    with pytest.raises(ValueError, match="range|not a JSON number"):
        typed_value(text, value_type)
    assert typed_value("1e300", "float") == 1e300
    assert typed_value('{"a": 1.5e3, "b": 2}', "json") == {"a": 1500.0, "b": 2}
