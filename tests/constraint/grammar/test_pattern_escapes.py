"""Patterns whose classes leave out `"` or `\\` (qrun/constraint/grammar/pattern_escapes.py):
llguidance 1.7 reads a class holding every control character as also taking the JSON escapes
`\\"` and `\\\\`, so `{"pattern": "^[^\\"]+$"}` took `a"b`. After the rewrite a Matcher takes
a string only when the `jsonschema` validator says it is valid, and every valid string
without U+0000 (the one character the rewrite gives up)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import jsonschema
import llguidance
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from qrun.constraint.grammar import check_schema, rewrite
from qrun.constraint.grammar.pattern_escapes import safe_pattern
from qrun.constraint.grammar_index import llg_tokenizer
from qrun.constraint.vocab import Vocabulary
from qrun.matcher import Matcher

# The cases of the report: classes that leave out `"` or `\\` but hold the control
# characters (negated, positive, or merged by an alternation), and classes that are right as
# written (they leave out a control character). The last is MaskBench's
# JsonSchemaStore---libman.json `destination`.
PATTERNS = [
    '^[^"]+$',
    "^[^\\\\]+$",
    "^[\\x00-!#-\\U0010ffff]+$",
    '^(?:[\\x00-\\x0f]|[\\x10-\\x1f]|[^"\\x00-\\x1f])+$',
    '^[^"\\n]*$',
    "^\\p{Cc}*$",
    "^[^\\t]+$",
    "^[^/]+$",
    '^[a-z"\\\\]+$',
    '^[^\\\\/:\\*\\?"<>\\|\\x01-\\x1f]+$',
]
STRINGS = ['a"b', "a\\b", "ab", "a\tb", "a/b", '"', "\\", "", "a\nb", "\x01\x1f", 'x\x01"']
# The alphabet of the random strings: both escaped characters, control characters, U+0000.
ALPHABET = ['"', "\\", "a", "z", "/", "\t", "\n", "\x01", "\x1f", "\x00", "\u00e9", " "]


# Python's `re` (the validator's) has no `\\p{..}`: the same class written out.
REFERENCE = {"^\\p{Cc}*$": "^[\\x00-\\x1f\\x7f-\\x9f]*$"}


def _valid(schema: Any, value: Any) -> bool:
    if schema.get("pattern") in REFERENCE:
        schema = {**schema, "pattern": REFERENCE[schema["pattern"]]}
    return bool(jsonschema.Draft202012Validator(schema).is_valid(value))


def _taken(matcher: Matcher, value: Any) -> bool:
    matcher.reset()
    return matcher.consume_text(json.dumps(value, ensure_ascii=False)) and matcher.accepting()


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_matcher_takes_exactly_the_valid_strings(pattern: str,
                                                      smol_vocab: Vocabulary) -> None:
    schema = {"type": "string", "pattern": pattern}
    matcher = Matcher(SimpleNamespace(vocabulary=smol_vocab), json=schema)
    for value in STRINGS:
        assert _taken(matcher, value) == _valid(schema, value), (pattern, value)


@pytest.mark.parametrize("pattern", ['^[^"]+$', "^[^\\\\]*$", '[^"]',
                                     '^(?:[\\x00-\\x0f]|[\\x10-\\x1f]|[^"\\x00-\\x1f])*$'])
def test_random_strings_are_taken_only_when_valid(pattern: str,
                                                  smol_vocab: Vocabulary) -> None:
    schema = {"type": "string", "pattern": pattern}
    matcher = Matcher(SimpleNamespace(vocabulary=smol_vocab), json=schema)

    @settings(max_examples=120, deadline=None, database=None)
    @given(st.lists(st.sampled_from(ALPHABET), max_size=6).map("".join))
    def agree(value: str) -> None:
        taken, valid = _taken(matcher, value), _valid(schema, value)
        assert not taken or valid, value  # sound
        if "\x00" not in value:
            assert taken == valid, value  # and complete but for U+0000

    agree()


def test_libman_destination(smol_vocab: Vocabulary) -> None:
    """MaskBench's JsonSchemaStore---libman.json: an invalid instance was taken."""
    schema = {"type": "object", "properties": {"destination": {
        "type": "string", "pattern": "^[^\\\\]+$"}}, "required": ["destination"]}
    matcher = Matcher(SimpleNamespace(vocabulary=smol_vocab), json=schema)
    assert _taken(matcher, {"destination": "wwwroot/lib/jquery"})
    assert not _taken(matcher, {"destination": "wwwroot\\lib"})


def test_pattern_property_names(smol_vocab: Vocabulary) -> None:
    schema = {"type": "object", "patternProperties": {'^[^"]+$': {"type": "integer"}},
              "additionalProperties": False}
    matcher = Matcher(SimpleNamespace(vocabulary=smol_vocab), json=schema)
    for value in [{"ab": 1}, {'a"b': 1}, {"ab": "x"}, {"a\\b": 1}]:
        assert _taken(matcher, value) == _valid(schema, value), value


def test_an_open_pattern_property_is_refused_with_its_place() -> None:
    """Beside an `additionalProperties` schema, a name with `"` would skip it ({'a"b': 1}
    would be taken against `string`): refused, located."""
    schema = {"properties": {"m": {
        "type": "object", "patternProperties": {'^[^"]+$': {"type": "integer"}},
        "additionalProperties": {"type": "string"}}}}
    error = check_schema(schema)
    assert error is not None and error.pointer == '/properties/m/patternProperties/^[^"]+$'
    assert "additionalProperties" in str(error)
    # Right as written, or harmless (a name taken against the pattern's schema when it
    # should be free: fewer values): not refused.
    for extra in (True, False, {}):
        assert check_schema({**schema["properties"]["m"], "additionalProperties": extra}) \
            is None
    assert check_schema({"patternProperties": {"^[a-z]+$": {}},
                         "additionalProperties": {"type": "string"}}) is None


@pytest.mark.parametrize(("pattern", "expected"), [
    ('^[^"]+$', '^[[^"]--\\x00]+$'),
    ("^\\p{Cc}+$", "^[\\p{Cc}--\\x00]+$"),
    ("a\\x00b", "a[\\x00--\\x00]b"),
    ('[^]"]', '[[^]"]--\\x00]'),  # `]` first in a class is itself (regex-syntax)
    ("[[:alpha:]]", "[[[:alpha:]]--\\x00]"),  # nested: not worked out, rewritten
    # Unchanged: no U+0000, or both `"` and `\\` beside it, or no class at all.
    ("^[^\\t]+$", "^[^\\t]+$"), ("[\\s\\S]", "[\\s\\S]"), ("[^\\d]", "[^\\d]"),
    ('[^"\\x00]', '[^"\\x00]'), ("\\bfoo\\b", "\\bfoo\\b"), ("[^\\]]", "[^\\]]"),
    ("\\\\[x", "\\\\[x"),  # an unclosed class: left for llguidance to refuse
])
def test_safe_pattern(pattern: str, expected: str) -> None:
    assert safe_pattern(pattern) == expected


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.sampled_from(ALPHABET), max_size=6).map("".join))
def test_the_rewritten_pattern_loses_only_nul(value: str) -> None:
    """By Python's `regex` (V1 reads `--` as regex-syntax does): the same strings, but
    those with U+0000."""
    for pattern in PATTERNS[:5]:
        before = regex.search(pattern, value) is not None
        after = regex.search(safe_pattern(pattern), value, flags=regex.V1) is not None
        assert after <= before
        if "\x00" not in value:
            assert after == before, (pattern, value)


def test_rewrite_leaves_the_input_and_other_keys() -> None:
    schema = {"type": "string", "pattern": '^[^"]+$', "minLength": 2}
    out = rewrite(schema)
    assert schema["pattern"] == '^[^"]+$'
    assert out == {"type": "string", "pattern": '^[[^"]--\\x00]+$', "minLength": 2}
    assert rewrite(out) == out  # once is enough


@pytest.mark.parametrize("pattern", PATTERNS)
def test_safe_pattern_is_idempotent(pattern: str) -> None:
    once = safe_pattern(pattern)
    assert safe_pattern(once) == once


def test_llguidance_still_needs_it(smol_vocab: Vocabulary) -> None:
    """The bug the rewrite works around, in llguidance itself (no qrun rewrite): when this
    fails, llguidance quotes classes right and pattern_escapes.py can go."""
    tokenizer = llg_tokenizer(smol_vocab)
    grammar = llguidance.grammar_from("json_schema", json.dumps(
        {"type": "string", "pattern": '^[^"]+$'}))
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    for token in tokenizer.tokenize_str(json.dumps('a"b')):
        assert matcher.consume_token(token)
    assert matcher.is_accepting()
