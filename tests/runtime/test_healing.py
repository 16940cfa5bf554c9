"""Token healing before a hole (docs/language.md §14.3, docs/internals.md §4.1): where fixed
text ends mid-token (a trailing space, a partial word, `http:`), its last token is taken back
and the hole's first token must start with those bytes. The healed bytes stay fixed text: the
rendered text is fixed text + value, and the value does not repeat them."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
import regex
from doubles import SteeredModel

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.constraint.patterns import PATTERNS
from qrun.runtime.result import HoleRecord
from qrun.runtime.sampler import log_softmax


def hole_bytes(backend: TransformersBackend, record: HoleRecord) -> bytes:
    return b"".join(backend.vocabulary.token_bytes[t] or b"" for t in record.token_ids)



# (fixed text, the bytes its last token holds, which healing takes back)
HEALED = [
    ("The capital of France is ", b" "),
    ("The capital of Fra", b" Fra"),
    ("Visit http:", b":"),
    ("Answer yes or n", b" n"),
]


@pytest.mark.parametrize("fixed,healed", HEALED)
def test_the_last_token_is_taken_back_and_produced_by_the_hole(
    tiny: TransformersBackend, fixed: str, healed: bytes
) -> None:
    assert tiny.vocabulary.token_bytes[tiny.encode(fixed)[-1]] == healed
    query = qrun.Query(fixed + "{{ gen c max_tokens=4 }}")
    for seed in range(6):
        result = query.run(model=tiny, temperature=1.0, seed=seed)
        value = result["c"]
        assert result.stats.healed_tokens == 1
        assert result.text == fixed + value
        # The hole's tokens spell the healed bytes, then the value: nothing is lost or doubled.
        # (A value cut by max_tokens inside a UTF-8 character ends in U+FFFD, as the bytes
        # after the healed prefix decode; the random tiny model does that at some seeds.)
        spelled = hole_bytes(tiny, result.holes["c"])
        assert spelled.startswith(healed)
        assert spelled[len(healed):].decode("utf-8", errors="replace") == value
        assert not value.encode().startswith(healed)
        # The tokens inside the healed bytes are free: at most 4 carry value bytes.
        ends, total = [], 0
        for token in result.holes["c"].token_ids:
            total += len(tiny.vocabulary.token_bytes[token] or b"")
            ends.append(total)
        assert sum(1 for end in ends if end > len(healed)) <= 4


@pytest.mark.parametrize("fixed,healed", HEALED)
def test_heal_false_keeps_the_fixed_text_tokens(
    tiny: TransformersBackend, fixed: str, healed: bytes
) -> None:
    result = qrun.Query(fixed + "{{ gen c max_tokens=3 heal=false }}").run(
        model=tiny, temperature=1.0, seed=1
    )
    assert result.stats.healed_tokens == 0
    assert result.text == fixed + result["c"]
    assert hole_bytes(tiny, result.holes["c"]).decode("utf-8", errors="replace") == result["c"]
    # Nothing was taken back: the context is the fixed text's own tokens, then the hole's.
    record = result.holes["c"]
    assert result.stats.context_tokens == len(tiny.encode(fixed)) + len(record.token_ids)
    assert result.stats.rollback_tokens == 0


def test_text_ending_on_a_token_that_nothing_extends_is_not_healed(
    tiny: TransformersBackend,
) -> None:
    # Digits are single tokens in SmolLM2: no token extends "2", so there is nothing to heal.
    fixed = "A list: [1, 2"
    assert not tiny.vocabulary.has_extension(tiny.vocabulary.token_bytes[tiny.encode(fixed)[-1]]
                                             or b"")
    result = qrun.Query(fixed + "{{ gen c max_tokens=3 }}").run(model=tiny, temperature=1.0)
    assert result.stats.healed_tokens == 0
    assert result.text == fixed + result["c"]


def test_a_hole_right_after_another_hole_is_not_healed(tiny: TransformersBackend) -> None:
    query = qrun.Query("Name: {{ gen a max_tokens=3 }}{{ gen b max_tokens=3 }}")
    for seed in range(4):
        result = query.run(model=tiny, temperature=1.0, seed=seed)
        # Only the first hole heals (the " " of "Name: "); the second starts after model
        # tokens, which are never taken back.
        assert result.stats.healed_tokens == 1
        assert result.text == "Name: " + result["a"] + result["b"]
        assert hole_bytes(tiny, result.holes["b"]) == result["b"].encode()
        assert len(result.holes["b"].token_ids) == 3


def test_a_hole_right_after_a_select_is_not_healed(tiny: TransformersBackend) -> None:
    # A select's tokens are the model's choice like a gen hole's: the next hole must not take
    # the chosen option's last token back (" way" and " please" both have extensions, so it
    # would if the select left the context's fixed-text tail as it found it).
    query = qrun.Query('Pick: {{ select c options=["yes please", "no way"] }}'
                       "{{ gen g max_tokens=2 }}")
    for seed in range(3):
        result = query.run(model=tiny, temperature=1.0, seed=seed)
        assert result.stats.healed_tokens == 1  # the " " of "Pick: ", before the select
        assert result.text == "Pick: " + result["c"] + result["g"]
        assert hole_bytes(tiny, result.holes["g"]) == result["g"].encode()
        assert len(result.holes["g"].token_ids) == 2


def test_healing_with_a_regex_hole_still_full_matches(tiny: TransformersBackend) -> None:
    query = qrun.Query("Date: {{ gen d regex=DATE }}\nTime: {{ gen t regex=TIME }}\n"
                       "Word: {{ gen w regex=WORD max_tokens=5 }}")
    for seed in range(5):
        result = query.run(model=tiny, temperature=1.0, seed=seed)
        assert result.stats.healed_tokens == 3
        for name, pattern in (("d", "DATE"), ("t", "TIME"), ("w", "WORD")):
            value = result[name]
            assert regex.fullmatch(PATTERNS[pattern], value, flags=regex.ASCII)
            assert hole_bytes(tiny, result.holes[name]) == b" " + value.encode()
        assert result.text == (f"Date: {result['d']}\nTime: {result['t']}\n"
                               f"Word: {result['w']}")


def test_healing_http_colon_with_a_regex(tiny: TransformersBackend) -> None:
    # The ":" of "http:" is taken back; the hole may produce it as part of "://".
    query = qrun.Query("Visit http:{{ gen u regex=p max_tokens=12 }} now")
    pattern = r"//[a-z]{1,8}\.(?:com|org)"
    joined_colon = 0
    for seed in range(6):
        result = query.run(model=tiny, temperature=1.0, seed=seed, p=pattern)
        value = result["u"]
        assert result.stats.healed_tokens == 1
        assert regex.fullmatch(pattern, value, flags=regex.ASCII)
        assert result.text == f"Visit http:{value} now"
        data = hole_bytes(tiny, result.holes["u"])
        assert data == b":" + value.encode()
        first = tiny.vocabulary.token_bytes[result.holes["u"].token_ids[0]] or b""
        joined_colon += len(first) > 1
    # The point of healing: the first token may join the healed ":" with what follows.
    assert joined_colon > 0


@pytest.mark.parametrize("hole", ["gen e max_tokens=4", 'gen e regex="[ a-z]+" max_tokens=4'])
def test_the_first_token_holds_all_of_the_healed_text(tiny: TransformersBackend,
                                                      hole: str) -> None:
    # The model wants a lone " " where " is" was taken back: spelling " is" as " ", "i",
    # "s..." is a tokenization the model never reads, after which SmolLM2 wrote "istdout"
    # and "isetup" (issue #38). The first token holds all of " is" (" is", " isn", ...).
    fixed = "The math expression is"
    steer = {len(tiny.encode(fixed)) - 1: tiny.encode(" ")[0]}

    def wants_a_space(position: int, logits: npt.NDArray[np.float32]) -> None:
        if position in steer:
            logits[steer[position]] = 1e4

    backend = SteeredModel(tiny, wants_a_space)
    result = qrun.Query(fixed + "{{ " + hole + " }}").run(model=backend, seed=0)
    assert result.stats.healed_tokens == 1
    first = tiny.vocabulary.token_bytes[result.holes["e"].token_ids[0]] or b""
    assert first.startswith(b" is")
    assert result.text == fixed + result["e"]


# --- the real model: the measured effect (docs/internals.md §4.1) ------------------------


def _logprobs(backend: TransformersBackend, token_ids: list[int]) -> npt.NDArray[np.float32]:
    logits = backend.forward(token_ids, backend.new_cache())[-1]
    return log_softmax(logits)


@pytest.mark.real
def test_healing_recovers_the_probability_of_paris(smollm2: TransformersBackend) -> None:
    vocab = smollm2.vocabulary
    prompt = "The capital of France is "
    ids = smollm2.encode(prompt)
    assert vocab.token_bytes[ids[-1]] == b" "
    (paris,) = smollm2.encode(" Paris")
    (bare_paris,) = smollm2.encode("Paris")

    # Unhealed: the prompt's own tokens, ending in the lone " " token, then "Paris".
    unhealed = float(_logprobs(smollm2, ids)[bare_paris])
    # Healed: take the " " back; the first token must start with " ", so normalise over
    # the tokens that do.
    logprobs = _logprobs(smollm2, ids[:-1])
    starts_with_space = np.array([(b or b"").startswith(b" ") for b in vocab.token_bytes]
                                 + [False] * (logprobs.shape[0] - vocab.size))
    spaced = logprobs[starts_with_space].astype(np.float64)
    healed = float(logprobs[paris] - (spaced.max() + np.log(np.exp(spaced - spaced.max()).sum())))

    assert unhealed == pytest.approx(-7.23, abs=0.5)
    assert healed == pytest.approx(-0.26, abs=0.5)

    result = qrun.Query("The capital of France is {{ gen c max_tokens=2 }}").run(model=smollm2)
    assert result.stats.healed_tokens == 1
    assert result["c"].startswith("Paris")
    assert result.text == prompt + result["c"]
    record = result.holes["c"]
    assert record.token_ids[0] == paris
    # The hole's first log-probability is the healed one (the mask renormalises over the
    # tokens that start with " ").
    assert record.logprobs[0] == pytest.approx(healed, abs=1e-3)
