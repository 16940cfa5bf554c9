"""Fast-forward (docs/language.md §14.6, docs/internals.md §6): where a constraint forces text
(JSON keys and separators), its canonical tokens are appended without sampling, flagged in the
hole's record, and fed with the next forward, so a JSON hole costs fewer forwards than it has
tokens."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import regex

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.constraint.regex_index import TokenIndex
from qrun.runtime.result import HoleRecord

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email_verified": {"type": "boolean"},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "email_verified", "role"],
    # Closed: keys the schema does not list are allowed by default (docs/language.md §7.4),
    # and a random model would add some; these tests are about the listed keys being forced.
    "additionalProperties": False,
}



def forced_runs(record: HoleRecord) -> list[list[int]]:
    """Maximal runs of consecutive forced token ids."""
    runs: list[list[int]] = []
    previous = False
    for token, forced in zip(record.token_ids, record.forced, strict=True):
        if forced:
            if not previous:
                runs.append([])
            runs[-1].append(token)
        previous = forced
    return runs


@pytest.mark.parametrize("seed", range(4))
def test_a_json_hole_forces_its_keys(tiny: TransformersBackend, seed: int) -> None:
    result = qrun.Query("Person: {{ gen p json=schema max_tokens=60 }}").run(
        model=tiny, temperature=1.0, seed=seed, schema=PERSON
    )
    record = result.holes["p"]
    stats = result.stats
    value = result["p"]
    assert value == json.loads(result.holes["p"].text)
    jsonschema.validate(value, PERSON)
    assert list(value) == ["name", "age", "email_verified", "role"]

    # Forced tokens are counted and flagged; they carry no sampled log-probability.
    assert stats.forced_tokens > 0
    assert sum(record.forced) == stats.forced_tokens
    assert all(lp is None for lp, f in zip(record.logprobs, record.forced, strict=True) if f)
    assert not any(lp is None for lp, f in zip(record.logprobs, record.forced, strict=True)
                   if not f)
    assert stats.generated_tokens == len(record.token_ids) - stats.forced_tokens

    # One forward per sampled token (the first also carries the prompt; forced tokens ride
    # along with the next one), so fewer forwards than the hole has tokens.
    sampled = len(record.token_ids) - sum(record.forced)
    assert stats.forward_calls == sampled + (record.finish == "eos")
    assert stats.forward_calls < len(record.token_ids)
    # Every context token goes through the model once, except the last sampled token and
    # the forced ones after it: the template ends there, so they are never needed. The
    # healed " " stays in the context and goes through the first forward (logits of both
    # positions kept); when the model's first token is not " " itself, it is taken back, a
    # computed position thrown away (rollback_tokens).
    trailing_forced = len(record.forced) - len("".join("x" if f else " " for f in
                                                         record.forced).rstrip("x"))
    assert record.finish == "match"
    first = tiny.vocabulary.token_bytes[record.token_ids[0]]
    assert stats.healed_tokens == 1 and stats.rollback_tokens == int(first != b" ")
    assert stats.forward_tokens == (stats.context_tokens - 1 - trailing_forced
                                    + stats.rollback_tokens)

    # Forced text is fed as its canonical tokens (the real SmolLM2 tokenizer).
    vocab = tiny.vocabulary
    for run in forced_runs(record):
        text = b"".join(vocab.token_bytes[t] or b"" for t in run).decode()
        assert tiny.encode(text) == run, text
    # The keys themselves are among the forced text.
    forced_text = b"".join(vocab.token_bytes[t] or b"" for t, f in
                           zip(record.token_ids, record.forced, strict=True) if f).decode()
    for key in ("age", "email_verified", "role"):
        assert key in forced_text


@pytest.mark.parametrize("seed", range(4))
def test_a_forced_run_is_canonical_together_with_what_the_model_writes_next(
    tiny: TransformersBackend, seed: int
) -> None:
    # The run's last token is left to the model when a longer token could start with it
    # (`"` could become `",`): so the forced tokens stay the canonical tokenization even
    # with the next token's bytes appended.
    result = qrun.Query("Person: {{ gen p json=schema max_tokens=60 }}").run(
        model=tiny, temperature=1.0, seed=seed, schema=PERSON
    )
    record = result.holes["p"]
    vocab = tiny.vocabulary
    spelled = [vocab.token_bytes[t] or b"" for t in record.token_ids]
    at = 0
    while at < len(record.token_ids):
        if not record.forced[at]:
            at += 1
            continue
        end = at
        while end < len(record.token_ids) and record.forced[end]:
            end += 1
        run = record.token_ids[at:end]
        following = b"".join(spelled[at:end + 1]).decode("utf-8", errors="strict")
        assert tiny.encode(following)[: len(run)] == run, (following, run)
        at = end
    jsonschema.validate(result["p"], PERSON)


def _min_tokens(tiny: TransformersBackend, pattern: str) -> int:
    index = TokenIndex.build(pattern, tiny.vocabulary)
    return int(index.token_dist[index.start_state])


@pytest.mark.parametrize(
    "pattern",
    [
        r"(?:é){2}",
        # a JSON object in a fixed layout: forced runs ({"a": , "b": ) between free values
        r'\{"a": -?(0|[1-9][0-9]*), "b": (true|false)\}',
    ],
)
def test_forced_tokens_count_against_the_budget_of_the_next_step(
    tiny: TransformersBackend, pattern: str
) -> None:
    # max_tokens = the fewest tokens any match needs: feasible, so the hole must never fail.
    # Regression: generate() computed tokens_left, fast-forwarded k forced tokens, then asked
    # the mask for the stale tokens_left, so the next sampled token could leave more to write
    # than the budget had (`é` forced, then the half character b"\xc3" sampled with 1 token
    # left). Now tokens_left is recomputed after _fast_forward.
    budget = _min_tokens(tiny, pattern)
    query = qrun.Query("Value:\n{{ gen v regex=p max_tokens=m heal=false }}")
    failures = []
    for seed in range(10):
        try:
            result = query.run(model=tiny, temperature=1.0, seed=seed, p=pattern, m=budget)
        except qrun.GenerationError as exc:
            failures.append((seed, str(exc).splitlines()[0]))
            continue
        assert regex.fullmatch(pattern, result["v"], flags=regex.ASCII)
    assert failures == []


def test_fast_forward_is_deterministic_and_matches_its_record(tiny: TransformersBackend) -> None:
    query = qrun.Query("Person: {{ gen p json=schema max_tokens=60 }}")
    first = query.run(model=tiny, temperature=1.0, seed=7, schema=PERSON)
    second = query.run(model=tiny, temperature=1.0, seed=7, schema=PERSON)
    assert first["p"] == second["p"]
    assert first.holes["p"].forced == second.holes["p"].forced
    # The record's tokens spell the healed " " and then the value.
    data = b"".join(tiny.vocabulary.token_bytes[t] or b""
                    for t in first.holes["p"].token_ids)
    assert data == b" " + first.holes["p"].text.encode()
