"""schema.survey: the one walk whose findings let the early checks (text.py) and the rewrites
(rewrite.py) skip what cannot apply to a document. A skip is sound only if the survey never
misses a key, never undercounts optional properties and never misses an Infinity or NaN;
where it cannot tell (data that is not plain JSON), it says so and the full checks run."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from qrun.constraint.grammar import FIXED, check_schema, json_grammar
from qrun.constraint.grammar.limits import ConstraintLimits
from qrun.constraint.grammar.schema import non_finite, survey
from qrun.constraint.grammar.schema_size import crowded_place

_NAMES = st.sampled_from(["properties", "required", "type", "a", "b", "not", "format",
                          "patternProperties", "items", "anyOf", "$ref", "x"])
_SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=3) | st.floats()
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(_NAMES, inner, max_size=5), max_leaves=30)


def _all_keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value).union(*(_all_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_all_keys(v) for v in value))
    return set()


@settings(max_examples=300)
@given(_JSON)
@example({"properties": {"a": {}}, "required": [[]]})  # an unhashable name: once a TypeError
def test_the_survey_misses_no_key_no_optional_property_and_no_nan(document: Any) -> None:
    found = survey(document)
    if not isinstance(document, dict | list):
        assert found is None
        return
    assert found is not None
    assert found.keys >= _all_keys(document)
    assert found.non_finite == (non_finite(document) is not None)
    # No place of the value has more optional properties than the survey's sum.
    if isinstance(document, dict):
        assert crowded_place(document, found.optional_properties) is None


def test_the_sum_is_what_a_crowded_place_counts() -> None:
    schema = {"anyOf": [{"properties": {"a": {}, "b": {}}, "required": ["a"]},
                        {"$ref": "#/$defs/c"}],
              "$defs": {"c": {"properties": {"c": {}, "d": {}}}}}
    found = survey(schema)
    assert found is not None and found.optional_properties == 3
    assert crowded_place(schema, 2) == ("", 3)


def test_shared_or_self_holding_data_is_left_to_the_full_checks() -> None:
    shared = {"type": "string"}
    assert survey({"properties": {"a": shared, "b": shared}}) is None
    looped: list[Any] = []
    looped.append(looped)
    assert survey({"enum": looped}) is None
    assert survey({"enum": [(1, 2)]}) is None  # a tuple is not JSON data
    assert survey(True) is None


def test_the_early_checks_find_the_same_on_shared_and_on_copied_data() -> None:
    # A shared subschema makes the survey give up, a deep copy of the same document does
    # not: either way the same checks fire, at the same pointers.
    limits = ConstraintLimits(optional_properties=3)
    crowded = {"properties": {n: {} for n in "abcd"}}
    for shared, expected in [
            ({"type": "number", "maximum": math.inf}, "Infinity or NaN"),
            ({"type": "string", "format": "no-such-format"}, "unknown format"),
            ({"type": "object", "properties": {"a": crowded}}, "optional properties"),
            ({"type": "object", "patternProperties": {"^[^\"]*$": {}},
              "additionalProperties": {"type": "integer"}}, "patternProperties")]:
        document = {"type": "object", "properties": {"x": shared, "y": shared}}
        errors = [check_schema(d, FIXED, limits) for d in (document, copy.deepcopy(document))]
        assert errors[0] is not None and errors[1] is not None, shared
        assert expected in errors[0].reason and str(errors[0]) == str(errors[1])


def test_a_document_without_rewritable_keywords_reaches_llguidance_unchanged() -> None:
    # Nothing to rewrite: the schema's text is the grammar's, key for key (the skipped
    # rewrites would have changed nothing).
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}},
              "required": ["a"], "$defs": {"n": {"type": "integer", "minimum": 0}}}
    body = json_grammar(schema).split("%json ", 1)[1]
    assert {k: v for k, v in json.loads(body).items() if k != "x-guidance"} == schema



def test_the_collector_is_on_after_a_schema_is_written() -> None:
    import gc

    assert gc.isenabled()
    json_grammar({"type": "object"})
    assert gc.isenabled()
