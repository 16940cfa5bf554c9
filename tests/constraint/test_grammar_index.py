"""LlgIndex / LlgCursor (qrun/constraint/grammar_index.py) and the grammar text
(qrun/constraint/grammar/text.py) on the real SmolLM2 vocabulary and a byte vocabulary: masks agree
with what llguidance consumes, any tokenization of a valid text is accepted, EOS only where
complete, special tokens never, healed prefixes, layouts and closed objects, fast-forward bytes,
budgets that close the value, rollback and copies, and errors located in the schema or the Lark
text."""

from __future__ import annotations

import copy
import json
import random
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import jsonschema
import numpy as np
import pytest

from qrun.constraint import grammar_index
from qrun.constraint.grammar import (
    FLEXIBLE,
    JsonFormat,
    check_lark,
    check_schema,
    json_grammar,
    lark_grammar,
    with_prefix,
)
from qrun.constraint.grammar import text as grammar_text
from qrun.constraint.grammar.text import GrammarError
from qrun.constraint.grammar_index import LlgCache, LlgCursor, LlgIndex, greedy_tokens
from qrun.constraint.vocab import Vocabulary
from qrun.runtime.generate import generate
from qrun.runtime.hole import GenRequest
from qrun.runtime.sampler import SamplingParams, new_generator
from qrun.runtime.session import Session
from tests.hang import alarm, wait_until

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age"],
}
TREE = {
    "$defs": {"node": {"type": "object", "required": ["value"], "additionalProperties": False,
                       "properties": {"value": {"type": "integer"},
                                      "kids": {"type": "array",
                                               "items": {"$ref": "#/$defs/node"}}}}},
    "$ref": "#/$defs/node",
}
ARITHMETIC = ('start: expr\nexpr: term (("+" | "-") term)*\nterm: factor (("*" | "/") factor)*\n'
              'factor: NUMBER | "(" expr ")"\nNUMBER: /[0-9]+/\n')


@pytest.fixture(scope="module")
def person(smol_vocab: Vocabulary) -> LlgIndex:
    return LlgIndex(json_grammar(PERSON), smol_vocab)


def walk(index: LlgIndex, tokens: list[int]) -> LlgCursor | None:
    """Feed tokens, each checked against the mask; None when one is refused."""
    cursor = index.start()
    for token in tokens:
        if not cursor.allowed()[token]:
            return None
        cursor.advance(token)
    return cursor


def random_tokens(vocab: Vocabulary, data: bytes, rng: random.Random) -> list[int]:
    out, pos = [], 0
    while pos < len(data):
        sizes = [n for n in range(1, min(8, len(data) - pos) + 1)
                 if vocab.is_token(data[pos:pos + n])]
        size = rng.choice(sizes)
        out.append(vocab.ids_of(data[pos:pos + size])[0])
        pos += size
    return out


@pytest.mark.parametrize("text", [b"", b'{"name": "Al', b'{"name": "Al", "age": 4',
                                  b'{"name": "x", "age": 1, "tags": ['])
def test_the_mask_is_what_llguidance_consumes(person: LlgIndex, smol_vocab: Vocabulary,
                                              text: bytes) -> None:
    cursor = person.start()
    assert cursor.advance_bytes(text)
    mask = cursor.allowed()
    ordinary = [t for t, data in enumerate(smol_vocab.token_bytes) if data is not None]
    sample = random.Random(len(text)).sample(ordinary, 2000) + mask.nonzero()[0].tolist()
    for token in sample:
        assert bool(mask[token]) == (cursor.matcher.validate_tokens([token]) == 1), token


def test_every_tokenization_of_a_valid_text_is_accepted(
        person: LlgIndex, smol_vocab: Vocabulary, smol_tokenizer: Any) -> None:
    text = '{"name": "Zoë Ødegaard", "age": 37, "tags": ["a b", "ç"], "extra": {"x": [1, 2.5e3]}}'
    jsonschema.validate(json.loads(text), PERSON)
    rng = random.Random(7)
    tokenizations = [smol_tokenizer.encode(text)] + [
        random_tokens(smol_vocab, text.encode(), rng) for _ in range(5)]
    for tokens in tokenizations:
        cursor = walk(person, tokens)
        assert cursor is not None and cursor.can_end(), tokens


@pytest.mark.parametrize("text", [
    b'{"name": "x"}', b'{"age": 1, "name": "x"}', b'{"name": 1, "age": 1}',
    b'{"name": "x", "age": -1}', b'{"name": "x", "age": 1, "tags": [1]}',
    b'{"name": "0123456789abc", "age": 1}', b'{"name":"x","age":1}', b' {"name": "x", "age": 1}',
])
def test_invalid_texts_and_other_layouts_are_refused(person: LlgIndex, text: bytes) -> None:
    assert not person.accepts(text)


def test_eos_only_where_the_value_is_complete(person: LlgIndex, smol_vocab: Vocabulary) -> None:
    eos = smol_vocab.eos_token_ids[0]
    cursor = person.start()
    cursor.advance_bytes(b'{"name": "x", "age": 1')
    assert not cursor.allowed()[eos] and not cursor.can_end() and cursor.can_continue()
    cursor.advance_bytes(b"}")
    mask = cursor.allowed()
    assert cursor.can_end() and mask.nonzero()[0].tolist() == [eos]
    assert not cursor.can_continue()


def test_special_tokens_are_never_allowed(smol_vocab: Vocabulary) -> None:
    special = [t for t, data in enumerate(smol_vocab.token_bytes) if data is None
               and t not in smol_vocab.eos_token_ids]
    index = LlgIndex(lark_grammar(f"start: <[{special[0]}]> | \"a\""), smol_vocab)
    cursor = index.start()
    assert not cursor.allowed()[special].any()
    assert not cursor.consume(special[0])
    with pytest.raises(ValueError):
        cursor.advance(special[0])


def test_a_vocabulary_without_eos_gets_one_of_its_own(byte_vocab: Vocabulary) -> None:
    plain = Vocabulary.from_token_bytes(list(byte_vocab.token_bytes[:264]), [])
    cursor = LlgIndex(lark_grammar('start: "ab"'), plain).start()
    assert cursor.allowed().shape == (264,)
    assert cursor.advance_bytes(b"ab") and cursor.can_end()
    assert not cursor.allowed().any()  # complete, and no EOS id to allow


def test_additional_properties_are_allowed_unless_closed(smol_vocab: Vocabulary) -> None:
    text = b'{"name": "x", "age": 1, "nick": "y"}'
    assert LlgIndex(json_grammar(PERSON), smol_vocab).accepts(text)
    closed = LlgIndex(json_grammar(PERSON, JsonFormat(closed=True)), smol_vocab)
    assert not closed.accepts(text) and closed.accepts(b'{"name": "x", "age": 1}')
    # An object the schema does not describe stays open: `{"type": "object"}` is any object.
    loose = LlgIndex(json_grammar({"type": "object"}, JsonFormat(closed=True)), smol_vocab)
    assert loose.accepts(b'{"q": [1]}')


def test_the_flexible_layout_takes_any_serialization(smol_vocab: Vocabulary) -> None:
    value = {"name": "x", "age": 1, "tags": ["a", "b"]}
    flexible = LlgIndex(json_grammar(PERSON, FLEXIBLE), smol_vocab)
    for text in (json.dumps(value), json.dumps(value, separators=(",", ":")),
                 json.dumps(value, indent=2), json.dumps(value, indent="\t")):
        assert flexible.accepts(text.encode()), text
    assert not flexible.accepts(b' {"name": "x", "age": 1}')  # nothing before the value


def test_recursive_schema(smol_vocab: Vocabulary) -> None:
    tree = LlgIndex(json_grammar(TREE), smol_vocab)
    assert tree.accepts(b'{"value": 1, "kids": [{"value": 2, "kids": [{"value": 3}]}]}')
    assert not tree.accepts(b'{"value": 1, "kids": [{"value": 2, "other": 3}]}')


def test_a_healed_prefix_comes_first(smol_vocab: Vocabulary, smol_tokenizer: Any) -> None:
    healed = LlgIndex(with_prefix(json_grammar(PERSON), " "), smol_vocab)
    assert healed.accepts(b' {"name": "x", "age": 1}')
    assert not healed.accepts(b'{"name": "x", "age": 1}')
    tokens = smol_tokenizer.encode(' {"name": "x", "age": 1}')
    assert smol_vocab.token_bytes[tokens[0]] == b' {"'  # spans the prefix and the value
    cursor = walk(healed, tokens)
    assert cursor is not None and cursor.can_end()
    arithmetic = LlgIndex(with_prefix(lark_grammar(ARITHMETIC), '= "\\'), smol_vocab)
    assert arithmetic.accepts(b'= "\\(1+2)*3') and not arithmetic.accepts(b"(1+2)*3")


def test_forced_bytes_and_the_shortest_completion(person: LlgIndex) -> None:
    cursor = person.start()
    assert cursor.forced_bytes() == b'{"name": "'
    cursor.advance_bytes(b'{"name": "Al')
    assert cursor.forced_bytes() == b""
    assert cursor.completion() == b'", "age": 0}'
    before = cursor.allowed()
    cursor.forced_bytes()
    assert np.array_equal(before, cursor.allowed())
    # Where a choice decides the length, the shorter one is taken (an enum's 3, property b).
    enum = LlgIndex(json_grammar({"enum": ["alpha", "beta", 3]}), person.vocab).start()
    assert enum.completion() == b"3"
    sql = LlgIndex(lark_grammar('start: "SELECT " cols " FROM " NAME\ncols: "*" | NAME ("," '
                                'NAME)*\nNAME: /[a-z]+/'), person.vocab).start()
    completion = sql.completion()
    assert completion is not None and len(completion) <= len(b"SELECT * FROM n")


def write_within_budget(index: LlgIndex, max_tokens: int,
                        choose: Callable[[list[int]], int]) -> tuple[LlgCursor, bytes]:
    """A value written token by token under the budget's masks, `choose` picking each token
    among those allowed, until EOS, the end of the grammar or max_tokens."""
    vocab = index.vocab
    eos = set(vocab.eos_token_ids)
    cursor, out = index.start(), bytearray()
    for step in range(max_tokens):
        token = choose(cursor.allowed(max_tokens - step).nonzero()[0].tolist())
        if token in eos:
            break
        cursor.advance(token)
        out += vocab.token_bytes[token] or b""
        if not cursor.can_continue():
            break
    return cursor, bytes(out)


@pytest.mark.parametrize("max_tokens", [6, 10, 16])
def test_budgets_close_the_value(smol_vocab: Vocabulary, max_tokens: int) -> None:
    tree = LlgIndex(json_grammar(TREE), smol_vocab)
    for seed in range(4):
        cursor, out = write_within_budget(tree, max_tokens, random.Random(seed).choice)
        assert cursor.can_end(), (seed, out)
        jsonschema.validate(json.loads(out), TREE)


EMAIL = {"type": "object", "properties": {"email": {"type": "string", "format": "email"}},
         "required": ["email"], "additionalProperties": False}


def test_a_completion_is_found_inside_an_emails_local_part(smol_vocab: Vocabulary) -> None:
    # ~80 bytes may come there and only `@` leads on: the greedy walk cycles through the
    # others, and the search that takes over must still find the way out.
    email = LlgIndex(json_grammar(EMAIL), smol_vocab)
    for written in (b'{"email": "', b'{"email": "{}K13###rah942PFw25ZkFa8', b'{"email": "a.b'):
        cursor = email.start()
        assert cursor.advance_bytes(written)
        completion = cursor.completion()
        assert completion is not None and len(completion) <= 8, (written, completion)
        assert cursor.advance_bytes(completion) and cursor.can_end()
        jsonschema.validate(json.loads(written + completion), EMAIL)


@pytest.mark.parametrize("max_tokens", [12, 24])
def test_budgets_close_an_email(smol_vocab: Vocabulary, max_tokens: int) -> None:
    # Random tokens keep an email's local part growing; the budget must still close it
    # (before the search, the walk found no completion there and the value broke off).
    email = LlgIndex(json_grammar(EMAIL), smol_vocab)
    for seed in range(4):
        rng = random.Random(seed)

        def stall(allowed: list[int], rng: random.Random = rng) -> int:
            # Anything but the closing quote or `@` while there is a choice: the worst writer.
            stalling = [t for t in allowed
                        if not set(smol_vocab.token_bytes[t] or b"") & set(b'"@}')]
            return rng.choice(stalling or allowed)

        cursor, out = write_within_budget(email, max_tokens, stall)
        assert cursor.can_end(), (seed, out)
        jsonschema.validate(json.loads(out), EMAIL)


def test_rollback_reset_and_copies_are_independent(person: LlgIndex) -> None:
    cursor = person.start()
    cursor.advance_bytes(b'{"name": "x"')
    twin = cursor.copy()
    assert twin.advance_bytes(b', "age": 1}')
    assert twin.can_end() and not cursor.can_end()
    twin.rollback(1)
    assert not twin.can_end()
    close = greedy_tokens(person.vocab, b"}")
    assert close is not None and twin.consume(close[0])
    twin.reset()
    assert twin.forced_bytes() == b'{"name": "'
    assert not cursor.advance_bytes(b"]") and cursor.advance_bytes(b",")
    assert cursor.accepts(b'{"name": "x", "age": 1}') and not cursor.accepts(b'{"name": "x"}')
    with pytest.raises(ValueError, match="cannot roll back -1 tokens"):
        cursor.rollback(-1)


def test_masks_are_shared_until_the_state_moves(person: LlgIndex) -> None:
    # As MaskCursor's (the Cursor protocol, qrun/constraint/spec.py): the runtime copies a mask
    # before changing it.
    cursor = person.start()
    mask = cursor.allowed()
    assert cursor.allowed() is mask and not mask.flags.writeable
    cursor.advance_bytes(b"{")
    assert cursor.allowed() is not mask


def test_lark_with_inline_json(smol_vocab: Vocabulary) -> None:
    grammar = 'start: "items: " item ("; " item)*\nitem: %json ' + json.dumps(PERSON)
    index = LlgIndex(lark_grammar(grammar), smol_vocab)
    assert index.accepts(b'items: {"name":"a","age":1}; {"name": "b", "age": 2}')
    assert not index.accepts(b'items: {"name":"a"}')


def test_schema_errors_are_located() -> None:
    schema: dict[str, Any] = {"properties": {"not": {"type": "string"},
                                             "b": {"items": {"uniqueItems": True,
                                                             "type": "array"}},
                                             "c": {"format": "int32"}}}
    # An unknown format is named first (issue #24: formats are asserted); read as qrun did
    # before (unknown formats ignored), the refusal is located inside the items.
    error = check_schema(schema)
    assert error is not None and error.pointer == "/properties/c/format"
    error = check_schema(schema, JsonFormat(formats="known"))
    assert error is not None and error.pointer == "/properties/b/items/uniqueItems"
    assert error.reason == 'Unimplemented keys: ["uniqueItems"]'
    schema = {"anyOf": [{"oneOf": [{"type": "integer"}, {"type": "string"}]},
                        {"oneOf": [{"type": "string"}, {"type": "string", "pattern": "ab"}]}]}
    error = check_schema(schema)
    assert error is not None and error.pointer == "/anyOf/1/oneOf"
    assert check_schema({"id": "x", "x-foo": 1, "example": 3, "type": "string"}) is None
    error = check_schema({"items": [{"minimum": float("nan")}]})
    assert error is not None and error.pointer == "/items/0/minimum"


def _count_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts of rewrites, llguidance checks (no tokenizer) and index builds (a compile
    with the tokenizer) from here on."""
    counts: Counter[str] = Counter()

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(grammar_text, "rewrite", counting("rewrite", grammar_text.rewrite))
    monkeypatch.setattr(grammar_text, "validate", counting("check", grammar_text.validate))
    monkeypatch.setattr(grammar_index, "LlgIndex", counting("build", LlgIndex))
    return counts


def test_a_schema_is_rewritten_and_compiled_once(smol_vocab: Vocabulary,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue #24 item 4: building the index is llguidance's check, so a new schema compiles
    # once (check_schema and then a build compile twice); the grammar text is kept per
    # schema text, so a schema met again is neither rewritten nor compiled.
    counts = _count_calls(monkeypatch)
    schema = {**PERSON, "title": "compiled once"}
    cache = LlgCache()
    index = cache.schema(schema, smol_vocab, FLEXIBLE)
    assert counts == {"rewrite": 1, "build": 1}
    assert cache.schema(json.loads(json.dumps(schema)), smol_vocab, FLEXIBLE) is index
    assert counts == {"rewrite": 1, "build": 1}
    assert index.grammar == json_grammar(schema, FLEXIBLE)
    # Another layout is another grammar.
    assert cache.schema(schema, smol_vocab).grammar != index.grammar
    assert counts == {"rewrite": 3, "build": 2}


def test_the_cache_is_bounded_by_grammar_text(smol_vocab: Vocabulary) -> None:
    small, large = json_grammar({"type": "integer"}), json_grammar(PERSON)
    cache = LlgCache(max_entries=8, max_grammar_chars=len(large) + len(small) - 1)
    first = cache.get(small, smol_vocab)
    assert cache.get(small, smol_vocab) is first  # kept from its second use
    held = cache.get(large, smol_vocab)
    assert cache.get(large, smol_vocab) is held  # both are over the bound: the older goes
    assert cache.get(small, smol_vocab) is not first


def test_a_grammar_compiled_once_is_not_kept_alive(smol_vocab: Vocabulary) -> None:
    # Compiled grammars kept alive slowed llguidance's next compiles (grammar_index.py
    # LlgCache): a grammar asked for once goes with its last user; asked for again, it is
    # compiled again and kept.
    grammar = json_grammar({**PERSON, "title": "once"})
    cache = LlgCache()
    gone = weakref.ref(cache.get(grammar, smol_vocab))
    with alarm(10):  # the build thread lets go of what it built just after returning it
        wait_until(lambda: gone() is None)
    assert gone() is None
    kept = cache.get(grammar, smol_vocab)
    assert kept.accepts(b'{"name": "a", "age": 1}')
    assert cache.get(grammar, smol_vocab) is kept


def test_the_memo_follows_the_schema_text_not_the_object(smol_vocab: Vocabulary) -> None:
    schema = copy.deepcopy(PERSON)
    cache = LlgCache()
    before = cache.schema(schema, smol_vocab)
    schema["properties"]["name"]["maxLength"] = 2
    after = cache.schema(schema, smol_vocab)
    assert before.accepts(b'{"name": "abc", "age": 1}')
    assert not after.accepts(b'{"name": "abc", "age": 1}')
    assert after.accepts(b'{"name": "ab", "age": 1}')


def test_a_refused_schema_is_located(smol_vocab: Vocabulary,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    schema = {"title": "refused",
              "properties": {"b": {"items": {"uniqueItems": True, "type": "array"}}}}
    cache = LlgCache()
    with pytest.raises(GrammarError) as caught:
        cache.schema(schema, smol_vocab)
    assert caught.value.pointer == "/properties/b/items/uniqueItems"
    assert caught.value.reason == 'Unimplemented keys: ["uniqueItems"]'
    counts = _count_calls(monkeypatch)
    # Errors found before any compile keep their pointers.
    for bad, pointer in (([1], ""), ({"items": [{"minimum": float("inf")}]}, "/items/0/minimum"),
                         ({"properties": {"a": {"enum": {1, 2}}}}, "/properties/a/enum")):
        with pytest.raises(GrammarError) as early:
            cache.schema(bad, smol_vocab)
        assert early.value.pointer == pointer
    deep: list[Any] = []
    deep.append(deep)
    with pytest.raises(GrammarError, match="inside itself"):
        cache.schema({"enum": deep}, smol_vocab)
    nested: Any = {}
    for _ in range(100_000):
        nested = {"not": nested}
    with pytest.raises(GrammarError, match="nested too deeply"):
        cache.schema(nested, smol_vocab)
    assert counts["build"] == 0


def test_lark_errors_have_positions(smol_vocab: Vocabulary) -> None:
    error = check_lark("start: expr\nexpr: NUMBER | foo\nNUMBER: /[0-9]+/\n")
    assert error is not None and (error.line, error.reason) == (2, 'unknown name: "foo"')
    with pytest.raises(GrammarError):
        LlgIndex(lark_grammar("start: /(?<=a)b/"), smol_vocab)
    assert check_lark(ARITHMETIC) is None


def _generate(backend: Any, index: LlgIndex, seed: int, max_tokens: int,
              stop: tuple[str, ...] = (), prefix: bytes = b"") -> Any:
    session = Session(backend, backend)
    session.append_text("A record:")
    request = GenRequest("x", max_tokens, stop, SamplingParams(temperature=1.0),
                         new_generator(seed), cursor=index.start(),
                         prefix=prefix)
    return generate(session, request)


@pytest.mark.parametrize("schema", [PERSON, TREE], ids=["person", "tree"])
def test_generate_fills_a_hole_with_valid_json(tiny: Any, schema: dict[str, Any]) -> None:
    # The executor's own hole loop (masks, fast-forward, budget, EOS) with an LlgCursor.
    index = LlgIndex(json_grammar(schema), tiny.vocabulary)
    for seed in range(4):
        record = _generate(tiny, index, seed, max_tokens=40)
        jsonschema.validate(json.loads(record.value), schema)
        assert record.finish in ("eos", "match") and any(record.forced)


def test_generate_with_a_healed_prefix_and_a_stop_string(tiny: Any) -> None:
    index = LlgIndex(with_prefix(json_grammar(PERSON), " "), tiny.vocabulary)
    for seed in range(3):
        record = _generate(tiny, index, seed, max_tokens=40, stop=("}",), prefix=b" ")
        value = record.value + "}" if record.finish == "stop" else record.value
        jsonschema.validate(json.loads(value), PERSON)
