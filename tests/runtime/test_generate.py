"""Filling a hole: max_tokens, EOS, stop strings split across tokens, streaming."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from doubles import SteeredModel, eos_from

from qrun.backends.transformers import TransformersBackend
from qrun.runtime.generate import generate
from qrun.runtime.hole import GenRequest
from qrun.runtime.sampler import SamplingParams, new_generator
from qrun.runtime.session import Session

PROMPT = "Once upon a time, in a faraway land,"


def run(backend: TransformersBackend, max_tokens: int = 24, stop: tuple[str, ...] = (),
        seed: int = 3, stream: list[str] | None = None) -> tuple[Session, Any]:
    session = Session(backend, backend)
    session.append_text(PROMPT)
    request = GenRequest("x", max_tokens, stop, SamplingParams(temperature=1.0),
                         new_generator(seed))
    record = generate(session, request, stream.append if stream is not None else None)
    return session, record


def test_max_tokens_bounds_the_hole(tiny: TransformersBackend) -> None:
    session, record = run(tiny, max_tokens=7)
    assert len(record.token_ids) == 7
    assert record.finish == "max_tokens"
    assert session.token_ids[len(tiny.encode(PROMPT)):] == record.token_ids


def test_seed_reproduces_and_changes_output(tiny: TransformersBackend) -> None:
    assert run(tiny, seed=1)[1].value == run(tiny, seed=1)[1].value
    assert len({run(tiny, seed=s)[1].value for s in range(4)}) > 1


def boundary_stop(backend: TransformersBackend, token_ids: Sequence[int]) -> tuple[str, int]:
    """A two-character stop string made of the last character of one token and the first of
    the next, occurring first at that boundary; returns it and the value's length."""
    vocab = backend.vocabulary
    text = b""
    for k in range(len(token_ids) - 1):
        left, right = vocab.token_bytes[token_ids[k]], vocab.token_bytes[token_ids[k + 1]]
        assert left is not None and right is not None
        text += left
        if left[-1:].isascii() and right[:1].isascii() and left[-1:].isalpha():
            stop = (left[-1:] + right[:1]).decode()
            if (text + right).decode("utf-8", "replace").find(stop) == len(text) - 1:
                return stop, len(text) - 1
    raise AssertionError("no usable token boundary in the sample")


def test_a_stop_string_across_two_tokens_is_found_and_rolled_back(
    tiny: TransformersBackend,
) -> None:
    _, free = run(tiny, max_tokens=24)
    stop, value_len = boundary_stop(tiny, free.token_ids)
    session, record = run(tiny, max_tokens=24, stop=(stop,))
    full = free.value
    assert record.finish == "stop"
    assert record.value == full[:value_len]
    assert stop not in record.value
    # Nothing follows the hole: the tokens that ran into the stop are rolled back (the first
    # was fed to sample the second) and the value's last character re-appended.
    session.finish()
    assert tiny.decode(session.token_ids) == PROMPT + record.value
    assert session.stats.rollback_tokens == 1
    assert session.stats.boundary_kept == 0
    session.next_logits()
    assert session.cache.length() == len(session.token_ids)


def test_tokens_past_a_stop_are_kept_when_the_template_continues_with_them(
    tiny: TransformersBackend,
) -> None:
    _, free = run(tiny, max_tokens=24)
    stop, value_len = boundary_stop(tiny, free.token_ids)
    session, record = run(tiny, max_tokens=24, stop=(stop,))
    overshoot = session.overshoot
    assert overshoot is not None
    # The template goes on with exactly what the model wrote past the value: kept, no rework.
    following = (overshoot.token_bytes[len(overshoot.value_bytes):]).decode() + " and then"
    session.append_text(following)
    session.flush()
    assert session.stats.boundary_kept == 1
    assert session.stats.rollback_tokens == 0
    assert tiny.decode(session.token_ids) == PROMPT + record.value + following
    # A different continuation rolls the overshoot back instead.
    session, record = run(tiny, max_tokens=24, stop=(stop,))
    session.append_text("!")
    session.flush()
    assert session.stats.boundary_kept == 0 and session.stats.rollback_tokens == 1
    assert tiny.decode(session.token_ids) == PROMPT + record.value + "!"


def test_streamed_chunks_add_up_to_the_value(tiny: TransformersBackend) -> None:
    _, free = run(tiny, max_tokens=24)
    stop, _ = boundary_stop(tiny, free.token_ids)
    chunks: list[str] = []
    _, record = run(tiny, max_tokens=24, stop=(stop,), stream=chunks)
    assert "".join(chunks) == record.value
    chunks = []
    _, record = run(tiny, max_tokens=24, stream=chunks)
    assert "".join(chunks) == record.value
    assert len(chunks) > 1  # streamed as it is produced, not all at the end


def test_eos_ends_the_hole_and_stays_out_of_the_context(tiny: TransformersBackend) -> None:
    eos = min(tiny.eos_token_ids)
    backend = SteeredModel(tiny, eos_from(len(tiny.encode(PROMPT)) + 4, eos), "eos-after")
    session, record = run(backend, max_tokens=20)
    assert record.finish == "eos"
    assert len(record.token_ids) == 4
    assert not set(session.token_ids) & backend.eos_token_ids


@pytest.mark.parametrize("stop", [("\u00e9t\u00e9",), ("zz", "qq")])
def test_stop_strings_that_never_occur_change_nothing(
    tiny: TransformersBackend, stop: tuple[str, ...]
) -> None:
    _, free = run(tiny, max_tokens=12)
    if any(s in free.value for s in stop):
        pytest.skip("stop string occurs in this sample")
    assert run(tiny, max_tokens=12, stop=stop)[1].value == free.value
