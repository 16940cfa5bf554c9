"""A JSON Schema with more optional properties at one place than llguidance's parser rows hold
is a `--check` error with its JSON pointer (qrun/constraint/grammar/schema_size.py), and the
limit is raised with ConstraintLimits (qrun.Limits). Before, an object of 10,000 optional
properties passed `--check` (after a 2 s compile) and the run then stopped at `{"` with
"Current row has 40007 items; max is 20000"."""

from __future__ import annotations

from typing import Any

import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.constraint.grammar import FIXED, FLEXIBLE, ConstraintLimits, check_schema, json_grammar
from qrun.constraint.grammar.limits import DEFAULT
from qrun.constraint.grammar.schema_size import crowded_place
from qrun.constraint.grammar_index import LlgIndex
from qrun.constraint.vocab import Vocabulary
from qrun.errors import ConstraintError


def optional(n: int, prefix: str = "p", required: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object",
                           "properties": {f"{prefix}{i}": {"type": "integer"} for i in range(n)}}
    if required is not None:
        out["required"] = required
    return out


@pytest.mark.parametrize("fmt", [FIXED, FLEXIBLE])
def test_the_parser_row_is_4_items_per_optional_property_plus_7(
        byte_vocab: Vocabulary, fmt: Any) -> None:
    # The measurement the limit rests on: 1,000 optional properties need a row of 4,007
    # items after `{"`; ConstraintLimits gives llguidance rows of 5 x optional_properties.
    grammar = json_grammar(optional(1_000), fmt)
    tight = LlgIndex(grammar, byte_vocab, ConstraintLimits(optional_properties=801)).start()
    with pytest.raises(ValueError, match="Current row has 4007 items; max is 4005"):
        tight.advance_bytes(b'{"')
    roomy = LlgIndex(grammar, byte_vocab, ConstraintLimits(optional_properties=802)).start()
    assert roomy.advance_bytes(b'{"p1": 1}') and roomy.can_end()


def test_10000_optional_properties_are_refused_at_once_with_the_pointer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    schema = {"type": "object", "properties": {"inner": optional(10_000)}}

    def no_compile(*args: object, **kwargs: object) -> None:
        raise AssertionError("llguidance compiled a schema refused by its size (14 s)")

    monkeypatch.setattr("qrun.constraint.grammar.text.validate", no_compile)
    error = check_schema(schema)
    assert error is not None and error.pointer == "/properties/inner/properties"
    assert error.limit == "optional_properties"
    assert error.reason.startswith("10,000 optional properties may come at one place")
    assert f"more than the {DEFAULT.optional_properties:,} qrun accepts" in error.reason


def test_at_the_limit_it_compiles_and_reads_a_key(byte_vocab: Vocabulary) -> None:
    schema = optional(DEFAULT.optional_properties)
    assert check_schema(schema) is None
    cursor = LlgIndex(json_grammar(schema), byte_vocab).start()
    assert cursor.advance_bytes(b'{"p3999": 1}') and cursor.can_end()


@pytest.mark.parametrize(("schema", "pointer", "count"), [
    # anyOf/oneOf/allOf members start at the same place: their properties add up
    ({"anyOf": [optional(60, "a"), optional(60, "b")]}, "", 120),
    ({"type": "array", "items": {"oneOf": [optional(60, "a"), {"type": "null"},
                                           optional(50, "b")]}}, "/items", 110),
    # a $ref brings its target's properties (a recursive one is followed once)
    ({"$defs": {"o": optional(150)}, "anyOf": [{"$ref": "#/$defs/o"}]}, "", 150),
    ({"$defs": {"o": optional(150)}, "$ref": "#/$defs/o"}, "", 150),
])
def test_optional_properties_are_counted_where_they_meet(schema: dict[str, Any], pointer: str,
                                                         count: int) -> None:
    assert crowded_place(schema, 100) == (pointer, count)


@pytest.mark.parametrize("schema", [
    optional(150, required=[f"p{i}" for i in range(60)]),  # required ones come one by one
    {"type": "object", "properties": {"a": optional(90), "b": optional(90)}},  # two places
    {"$defs": {"o": {"anyOf": [optional(90), {"$ref": "#/$defs/o"}]}}, "$ref": "#/$defs/o"},
])
def test_places_below_the_limit_pass(schema: dict[str, Any]) -> None:
    assert crowded_place(schema, 100) is None


def test_a_raised_limit_lets_the_schema_through() -> None:
    schema = optional(150)
    error = check_schema(schema, limits=ConstraintLimits(optional_properties=100))
    assert error is not None and error.pointer == "/properties"
    assert check_schema(schema, limits=ConstraintLimits(optional_properties=200)) is None


def test_qrun_limits_carry_the_constraint_limits_and_their_defaults() -> None:
    assert qrun.Limits().constraints() == DEFAULT
    raised = qrun.Limits(optional_properties=9_000, grammar_chars=1, grammar_depth=2)
    assert raised.constraints() == ConstraintLimits(grammar_chars=1, grammar_depth=2,
                                                    optional_properties=9_000)
    with pytest.raises(qrun.UsageError, match="optional_properties must be a positive"):
        qrun.Limits(optional_properties=0)
    with pytest.raises(ValueError, match="grammar_depth must be a positive"):
        ConstraintLimits(grammar_depth=True)


def test_the_matcher_refuses_it_with_the_pointer(tiny: TransformersBackend) -> None:
    with pytest.raises(ConstraintError, match=r"optional properties .* \(at /properties\)"):
        qrun.Matcher(tiny, json=optional(10_000))


def test_a_schema_in_a_variable_is_refused_before_sampling(tiny: TransformersBackend) -> None:
    # Before: GenerationError at `{"` ("Current row has 40007 items; max is 20000").
    with pytest.raises(ConstraintError) as caught:
        qrun.Query("A: {{ gen w json=s max_tokens=8 }}").run(model=tiny, s=optional(10_000))
    assert "10,000 optional properties may come at one place" in caught.value.message
    assert "(at /properties)" in caught.value.message
