"""Soundness of json= and grammar= holes (llguidance, qrun/constraint/grammar_index.py), end to end
on the tiny model at temperature 1: every value validates against its JSON Schema (the `jsonschema`
validator, formats asserted) or is a sentence of its grammar (checked by a Matcher and by parsing
it), in the fixed layout, within max_tokens, and the rendered text is exactly fixed text + values;
healing, fast-forward, stop strings, speculation, batching, the server replay and the trace record
work as for regex holes.

Budgets are the greedy shortest completion's tokens (LlgCursor.completion) plus a slack of 0, 1 or
12 tokens: the budget-aware mask must close every value in time."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from doubles import ScriptedServer

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.constraint.grammar import json_grammar, lark_grammar, with_prefix
from qrun.constraint.grammar_index import LlgIndex, greedy_tokens
from qrun.errors import ConstraintError

SCHEMAS: list[Any] = [
    {"type": "object",
     "properties": {"name": {"type": "string", "maxLength": 6},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"]},
    {"type": "object",
     "properties": {"id": {"type": "integer", "minimum": -5, "maximum": 5},
                    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                             "minItems": 1, "maxItems": 3},
                    "owner": {"type": "object",
                              "properties": {"active": {"type": "boolean"},
                                             "nick": {"type": "string", "maxLength": 3}},
                              "required": ["active"]}},
     "required": ["id", "tags", "owner"]},
    {"anyOf": [{"type": "integer", "minimum": 10, "maximum": 99},
               {"type": "string", "maxLength": 3}, {"type": "null"}]},
    {"type": "array", "maxItems": 2,
     "items": {"type": "object", "required": ["x", "y"],
               "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                              "y": {"enum": [1, "two", None]}}}},
    {"enum": ["alpha", "beta", 3, True, None]},
    {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
    {"type": "object", "required": ["when", "score"],
     "properties": {"when": {"type": "string", "format": "date"},
                    "score": {"type": "number", "minimum": 0, "maximum": 1},
                    "unit": {"type": ["string", "null"], "maxLength": 2}}},
    # Recursion, oneOf, patternProperties and any value: beyond any regex.
    {"$defs": {"node": {"type": "object", "required": ["v"],
                        "properties": {"v": {"type": "integer"},
                                       "kids": {"type": "array", "maxItems": 2,
                                                "items": {"$ref": "#/$defs/node"}}}}},
     "$ref": "#/$defs/node"},
    {"oneOf": [{"type": "object", "required": ["kind", "r"],
                "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}}},
               {"type": "object", "required": ["kind", "w"],
                "properties": {"kind": {"const": "square"}, "w": {"type": "integer"}}}]},
    {"type": "object", "patternProperties": {"^x-": {"type": "integer"}},
     "additionalProperties": {"type": "boolean"}, "maxProperties": 3},
    {},
    {"type": "object", "properties": {"a": {"type": "string"}},
     "dependencies": {"a": ["b"]}, "not": {"required": ["c"]}},
]
ARITHMETIC = ('start: expr\nexpr: term (("+" | "-") term)*\nterm: factor (("*" | "/") factor)*\n'
              'factor: NUMBER | "(" expr ")"\nNUMBER: /[1-9][0-9]{0,2}/\n')
JSON_LIST = ('start: "[" item (", " item)* "]"\nitem: %json {"type": "object", "required": '
             '["n"], "properties": {"n": {"type": "integer", "minimum": 0}}, '
             '"additionalProperties": false}\n')
SQL = ('start: "SELECT " cols " FROM " NAME (" WHERE " NAME " = " NUMBER)?\n'
       'cols: "*" | NAME (", " NAME)*\nNAME: /[a-z][a-z_]{0,7}/\nNUMBER: /[0-9]{1,4}/\n')
GRAMMARS = [ARITHMETIC, JSON_LIST, SQL]
_FORMATS = jsonschema.FormatChecker()
RUNS = 6


def need(tiny: TransformersBackend, grammar: str) -> int:
    """Tokens of the greedy shortest completion at the start of `grammar`."""
    completion = LlgIndex(grammar, tiny.vocabulary).start().completion()
    assert completion is not None
    tokens = greedy_tokens(tiny.vocabulary, completion)
    assert tokens is not None
    return max(1, len(tokens))


def fixed_layout(text: str) -> bool:
    """Whether JSON text uses only the fixed layout's whitespace (", " and ": ")."""
    outside = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    return re.search(r"\s", outside.replace(", ", ",").replace(": ", ":")) is None


def run(tiny: TransformersBackend, kind: str, constraints: list[Any], seed: int,
        check: Callable[[Any, str], None], **options: Any) -> qrun.Result:
    """One template with a hole per constraint (passed as inputs), checked value by value and
    as a whole."""
    parts, inputs, labels = [], {}, []
    for i, constraint in enumerate(constraints):
        grammar = json_grammar(constraint) if kind == "json" else lark_grammar(constraint)
        budget = need(tiny, grammar) + (0, 1, 12)[(seed + i) % 3]
        inputs[f"c{i}"], inputs[f"m{i}"] = constraint, budget
        heal = "" if (seed + i) % 4 else " heal=false"
        labels.append(f"\nitem {i}: ")
        parts.append(f"{labels[-1]}{{{{ gen h{i} {kind}=c{i} max_tokens=m{i}{heal} }}}}")
    result = qrun.Query("".join(parts) + "\nend").run(inputs, model=tiny, temperature=1.0,
                                                      seed=seed, **options)
    values = []
    for i, constraint in enumerate(constraints):
        record = result.holes[f"h{i}"]
        context = f"hole {i} seed {seed}: {record.text!r}"
        assert record.finish in ("eos", "match", "max_tokens", "boundary"), context
        value_tokens = len(record.token_ids) - record.prefix_tokens
        assert value_tokens <= inputs[f"m{i}"], context
        check(constraint, record.text)
        if kind == "json":
            assert result[f"h{i}"] == json.loads(record.text), context
        values.append(labels[i] + record.text)
    assert result.text == "".join(values) + "\nend"
    return result


def valid_json(schema: Any, text: str) -> None:
    jsonschema.validate(json.loads(text), schema, format_checker=_FORMATS)
    assert fixed_layout(text), text


def sentence(model: TransformersBackend, grammar: str, text: str) -> None:
    matcher = qrun.Matcher(model, grammar=grammar)
    assert matcher.consume_text(text) and matcher.accepting(), text
    if grammar == ARITHMETIC:
        assert re.fullmatch(r"[0-9+\-*/()]+", text)
        ast.parse(text, mode="eval")
    elif grammar == JSON_LIST:
        items = json.loads(text)
        assert all(set(item) == {"n"} and item["n"] >= 0 for item in items), text
    else:
        assert re.fullmatch(r"SELECT (\*|[a-z_]+(, [a-z_]+)*) FROM [a-z_]+"
                            r"( WHERE [a-z_]+ = [0-9]+)?", text), text


@pytest.mark.parametrize("seed", range(RUNS))
def test_json_holes_always_validate(tiny: TransformersBackend, seed: int) -> None:
    run(tiny, "json", SCHEMAS, seed, valid_json)


@pytest.mark.parametrize("seed", range(RUNS))
def test_grammar_holes_are_always_sentences(tiny: TransformersBackend, seed: int) -> None:
    result = run(tiny, "grammar", GRAMMARS, seed, lambda g, text: sentence(tiny, g, text))
    assert all(isinstance(result[f"h{i}"], str) for i in range(len(GRAMMARS)))


def test_forced_text_is_fast_forwarded_and_the_record_says_so(
        tiny: TransformersBackend) -> None:
    query = qrun.Query('P: {{ gen p json=s max_tokens=30 heal=false }}')
    r = query.run({"s": SCHEMAS[0]}, model=tiny, temperature=1.0, seed=1)
    record = r.holes["p"]
    assert record.forced[0] and r.stats.forced_tokens >= 3  # {"name": " is forced
    assert record.constraint == "json=" + json.dumps(SCHEMAS[0], sort_keys=True)
    trace = r.trace()
    assert any(h["constraint"] == record.constraint for h in trace["holes"])


def test_a_stop_string_ends_a_json_value_only_where_it_is_complete(
        tiny: TransformersBackend) -> None:
    schema = {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3}
    for seed in range(4):
        r = qrun.Query('L: {{ gen l json=s stop="]" max_tokens=30 }}!').run(
            {"s": schema}, model=tiny, temperature=1.0, seed=seed)
        record = r.holes["l"]
        text = record.text + "]" if record.finish == "stop" else record.text
        jsonschema.validate(json.loads(text), schema)


def test_speculation_and_batching_give_the_same_values(tiny: TransformersBackend) -> None:
    query = qrun.Query('A: {{ gen a json=s max_tokens=24 }}\nB: {{ gen b grammar=g '
                       'max_tokens=12 }}')
    inputs = [{"s": SCHEMAS[1], "g": SQL}, {"s": SCHEMAS[7], "g": ARITHMETIC},
              {"s": SCHEMAS[8], "g": SQL}]
    plain = [query.run(i, model=tiny, seed=3, speculate=False) for i in inputs]
    drafted = [query.run(i, model=tiny, seed=3, speculate=True) for i in inputs]
    batched = query.run_many(inputs, model=tiny, batch_size=3, seed=3)
    assert [r.vars for r in drafted] == [r.vars for r in plain]
    assert [r.vars for r in batched if isinstance(r, qrun.Result)] == [r.vars for r in plain]


def test_a_server_gets_the_grammar_and_its_tokens_are_replayed(
        tiny: TransformersBackend) -> None:
    server = ScriptedServer(tiny, ['{"name": "Al", "age": 7}', "(1+2)*3"])
    r = qrun.Query("P:{{ gen p json=s heal=false }} E:{{ gen e grammar=g heal=false }}").run(
        {"s": SCHEMAS[0], "g": ARITHMETIC}, model=server)
    assert r["p"] == {"name": "Al", "age": 7} and r["e"] == "(1+2)*3"
    sent = [request["grammar"] for request in server.requests]
    # The first hole's grammar lets the server go on with the text after it, " E:" (which
    # may end the hole, docs/language.md §14.5); nothing sure follows the last one.
    assert sent[0] == with_prefix(json_grammar(SCHEMAS[0]), "", " E:")
    assert sent[1] == lark_grammar(ARITHMETIC)
    assert all(request["regex"] is None for request in server.requests)
    bad = ScriptedServer(tiny, ['{"name": 1}'])
    with pytest.raises(qrun.GenerationError, match="breaks the constraint"):
        qrun.Query("P:{{ gen p json=s heal=false }}").run({"s": SCHEMAS[0]}, model=bad)


def test_a_server_without_llguidance_is_refused_before_the_run(
        tiny: TransformersBackend) -> None:
    server = ScriptedServer(tiny, [], llguidance=False)
    with pytest.raises(ConstraintError, match="do not run llguidance") as caught:
        qrun.Query("A: {{ gen a max_tokens=3 }}\nP: {{ gen p json=s }}").run(
            {"s": SCHEMAS[0]}, model=server)
    assert (caught.value.span.line, caught.value.span.column) == (2, 18)  # the schema
    assert server.requests == []
