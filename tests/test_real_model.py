"""The real default model (SmolLM2-135M-Instruct): KV reuse across segments, equivalence with
re-encoding the whole prefix before every hole, and stop strings spanning tokens."""

from __future__ import annotations

import numpy as np
import pytest
from test_examples import ENDINGS, check_endings, check_reproductions

import qrun
from qrun.backends.transformers import TransformersBackend

pytestmark = pytest.mark.real

SEGMENTS = [
    "Questions and short answers.\nQ: What is the capital of France?\nA: Paris\n"
    "Q: What colour is the sky on a clear day?\nA:",
    "\nQ: How many legs does a spider have?\nA:",
    "\nQ: What is 2+2?\nA:",
    "\nThat is all.",
]
HOLES = ["a1", "a2", "a3"]
FOUR_SEGMENTS_THREE_HOLES = "".join(
    text + (f'{{{{ gen {hole} stop="\\n" max_tokens=12 }}}}' if hole else "")
    for text, hole in zip(SEGMENTS, [*HOLES, None], strict=True)
)


def test_no_text_is_encoded_twice(smollm2: TransformersBackend) -> None:
    result = qrun.Query(FOUR_SEGMENTS_THREE_HOLES).run(model=smollm2)
    stats = result.stats
    assert all(result[name].strip() for name in ("a1", "a2", "a3"))
    assert stats.forward_tokens <= stats.context_tokens + stats.rework_tokens
    assert stats.forward_calls <= 1 + stats.generated_tokens
    # Each answer ended at "\n", and the template goes on with "\n": the model's own "\n"
    # token was kept as that fixed text, so nothing was rolled back or encoded again.
    assert all(result.holes[name].finish == "stop" for name in HOLES)
    assert stats.boundary_kept == 3
    assert stats.rollback_tokens == 0


def greedy_by_reencoding(
    backend: TransformersBackend, pieces: list[tuple[str, str]]
) -> dict[str, str]:
    """The pre-KV-reuse way: before every hole, tokenize the whole text so far and encode it
    from scratch, then decode the hole greedily until the stop string or max_tokens."""
    text, values = "", {}
    for kind, content in pieces:
        if kind == "text":
            text += content
            continue
        cache = backend.new_cache()
        logits = backend.forward(backend.encode(text), cache)[-1]
        out = b""
        for _ in range(12):
            token = int(np.argmax(logits))
            if token in backend.eos_token_ids:
                break
            out += backend.vocabulary.token_bytes[token] or b""
            if b"\n" in out:
                break
            logits = backend.forward([token], cache)[-1]
        value = out.split(b"\n")[0].decode("utf-8", "replace")
        values[content] = value
        text += value
    return values


def test_cached_path_equals_reencoding_every_prefix(smollm2: TransformersBackend) -> None:
    result = qrun.Query(FOUR_SEGMENTS_THREE_HOLES).run(model=smollm2)
    pieces = [piece for text, hole in zip(SEGMENTS, HOLES, strict=False) for piece in
              (("text", text), ("hole", hole))]
    expected = greedy_by_reencoding(smollm2, pieces)
    assert {name: result[name] for name in expected} == expected


def test_a_stop_string_spanning_two_tokens_is_honoured(smollm2: TransformersBackend) -> None:
    prompt = "Counting in words: one, two, three,"
    free = qrun.Query(prompt + "{{ gen rest max_tokens=12 }}").run(model=smollm2)
    tokens = free.holes["rest"].token_ids
    vocab = smollm2.vocabulary
    # Pick a stop made of the last two bytes of one token and the first byte of the next.
    # Offsets count from the value's start: the first token also carries the healed ",".
    healed = len(b"".join(vocab.token_bytes[t] or b"" for t in tokens)) - len(free["rest"])
    offset, stop = -healed, None
    for left, right in zip(tokens, tokens[1:], strict=False):
        lb, rb = vocab.token_bytes[left] or b"", vocab.token_bytes[right] or b""
        offset += len(lb)
        if len(lb) >= 2 and rb and (lb[-2:] + rb[:1]).isascii():
            candidate = (lb[-2:] + rb[:1]).decode()
            if free["rest"].find(candidate) == offset - 2:
                stop = candidate
                break
    assert stop is not None, f"no two-token boundary in {free['rest']!r}"
    template = prompt + "{{ gen rest max_tokens=12 stop=" + repr(stop) + " }} and so on."
    result = qrun.Query(template).run(model=smollm2)
    assert result["rest"] == free["rest"][: offset - 2]
    assert result.text == prompt + result["rest"] + " and so on."
    assert result.holes["rest"].finish == "stop"
    # The tokens past the value ran into the stop, and the template continues differently:
    # they were taken back (whether they had been fed depends on the prefix cache, which
    # holds the unconstrained run above).
    assert result.stats.boundary_dropped == 1


def test_a_joined_input_and_a_loop_answer_as_their_literal_versions(
        smollm2: TransformersBackend) -> None:
    check_reproductions(smollm2)


def test_holes_end_at_the_next_text_and_keep_their_stop(smollm2: TransformersBackend) -> None:
    check_endings(qrun.Query(ENDINGS).run(model=smollm2))
