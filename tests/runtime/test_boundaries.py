"""Token boundaries after a hole (docs/language.md §14.4) on the real SmolLM2 tokenizer: when the
model's last token runs past a stop string into what follows (`",` after a `stop='"'` hole),
the token is kept if the following fixed text begins with exactly those bytes, else rolled
back; either way the context holds the text the user reads, and the next logits are those of
a fresh forward over the same ids.

The tiny model is steered (tests/doubles.py) to write a chosen token script. Speculation is off:
these tests read the last forward's exact ids (tests/runtime/test_speculation.py covers it)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from doubles import SteeredModel, script

import qrun
from qrun.backends.prefix_cache import PrefixCache
from qrun.backends.transformers import TransformersBackend


def scripted(tiny: TransformersBackend, before_hole: str, tokens: Sequence[int],
             start: int | None = None) -> SteeredModel:
    """The tiny model, made to write `tokens` right after the text `before_hole`."""
    begin = len(tiny.encode(before_hole)) if start is None else start
    return SteeredModel(tiny, script(begin, tokens), "scripted")


def token(tiny: TransformersBackend, text: str) -> int:
    (token_id,) = tiny.encode(text)
    return token_id


def check_last_forward(tiny: TransformersBackend, backend: SteeredModel, ids: list[int]
                       ) -> None:
    """The last forward's cache holds exactly `ids`, and its logits equal one fresh forward
    of them."""
    held, logits = backend.forwards[-1]
    assert held == ids
    fresh = tiny.forward(ids, tiny.new_cache())[-1]
    np.testing.assert_allclose(logits, fresh, atol=1e-4, rtol=1e-4)


PREFIX = '{"name": "'
NAME_HOLE = "{{ gen n stop='\"' max_tokens=6 heal=false }}"
NEXT_HOLE = "{{ gen a max_tokens=1 heal=false }}"


def test_a_token_spanning_the_stop_and_the_next_text_is_kept(tiny: TransformersBackend) -> None:
    # The model writes "Alice" then `",` (one token); the template goes on with `", "age": `.
    quote_comma = token(tiny, '",')
    backend = scripted(tiny, PREFIX, [*tiny.encode("Alice"), quote_comma])
    result = qrun.Query(PREFIX + NAME_HOLE + '", "age": ' + NEXT_HOLE).run(
        model=backend, speculate=False)
    stats = result.stats
    assert result["n"] == "Alice"
    assert result.holes["n"].finish == "stop"
    assert stats.boundary_kept == 1 and stats.boundary_dropped == 0
    assert stats.rollback_tokens == 0
    assert result.text == '{"name": "Alice", "age": ' + result["a"]
    # The kept `",` is exactly where the canonical tokenization of the text puts it, so the
    # context is the canonical tokenization of the whole text, each token fed once.
    expected = tiny.encode('{"name": "Alice", "age": ')
    assert quote_comma in expected
    check_last_forward(tiny, backend, expected)
    assert stats.forward_tokens == len(expected)


def test_a_token_spanning_the_stop_is_rolled_back_when_the_text_differs(
    tiny: TransformersBackend,
) -> None:
    # Same hole, but the template closes the object instead: `",` cannot stay.
    backend = scripted(tiny, PREFIX, [*tiny.encode("Alice"), token(tiny, '",')])
    result = qrun.Query(PREFIX + NAME_HOLE + '"}\n' + NEXT_HOLE).run(model=backend, speculate=False)
    stats = result.stats
    assert result["n"] == "Alice"
    # `",` was sampled but never fed (the hole ended on it), so no computed position is
    # dropped: rollback_tokens counts KV positions thrown away, and there are none. Only
    # boundary_dropped tells this roll-back from a hole with nothing to roll back.
    assert stats.boundary_kept == 0 and stats.boundary_dropped == 1
    assert stats.rollback_tokens == 0
    assert result.text == '{"name": "Alice"}\n' + result["a"]
    expected = tiny.encode(PREFIX) + tiny.encode("Alice") + tiny.encode('"}\n')
    assert expected == tiny.encode('{"name": "Alice"}\n')
    check_last_forward(tiny, backend, expected)
    assert stats.forward_tokens == len(expected)


def test_a_fed_token_before_a_two_token_stop_is_rolled_back_and_counted(
    tiny: TransformersBackend,
) -> None:
    # stop='"}' found across `"` and `}`: `"` was fed to sample `}`, so rolling back to
    # before it drops one computed KV position.
    hole = "{{ gen n stop='\"}' max_tokens=6 heal=false }}"
    script = [*tiny.encode("Alice"), token(tiny, '"'), token(tiny, "}")]
    backend = scripted(tiny, PREFIX, script)
    result = qrun.Query(PREFIX + hole + '", "age": ' + NEXT_HOLE).run(
        model=backend, speculate=False)
    stats = result.stats
    assert result["n"] == "Alice"
    assert stats.boundary_kept == 0 and stats.boundary_dropped == 1
    assert stats.rollback_tokens == 1
    assert result.text == '{"name": "Alice", "age": ' + result["a"]
    expected = tiny.encode(PREFIX) + tiny.encode("Alice") + tiny.encode('", "age": ')
    assert expected == tiny.encode('{"name": "Alice", "age": ')
    check_last_forward(tiny, backend, expected)
    assert stats.forward_tokens == len(expected) + 1  # the one rolled-back position


def test_a_two_token_stop_is_kept_when_the_text_continues_with_it(
    tiny: TransformersBackend,
) -> None:
    hole = "{{ gen n stop='\"}' max_tokens=6 heal=false }}"
    quote, brace = token(tiny, '"'), token(tiny, "}")
    backend = scripted(tiny, PREFIX, [*tiny.encode("Alice"), quote, brace])
    result = qrun.Query(PREFIX + hole + '"}\n' + NEXT_HOLE).run(model=backend, speculate=False)
    stats = result.stats
    assert result["n"] == "Alice"
    assert stats.boundary_kept == 1 and stats.boundary_dropped == 0
    assert stats.rollback_tokens == 0
    assert result.text == '{"name": "Alice"}\n' + result["a"]
    # Kept as the model wrote it (`"` `}`), although `"}` is one token canonically: keeping
    # costs nothing and the text is the same.
    expected = tiny.encode(PREFIX) + tiny.encode("Alice") + [quote, brace] + tiny.encode("\n")
    check_last_forward(tiny, backend, expected)
    assert stats.forward_tokens == len(expected)


# --- a stop inside a longer token -------------------------------------------------------
# SmolLM2 has no `.\n` token (no token mixes a newline with other characters), so the stop
# "\n" is taken inside ` \n` (its space belongs to the value) and `\n\n` (nothing does).

LINE_HOLE = '{{ gen n stop="\\n" max_tokens=6 heal=false }}'


@pytest.mark.parametrize(
    "last,value,after,kept",
    [
        (" \n", "Alice ", "\nAge: ", True),
        (" \n", "Alice ", "|Age: ", False),
        ("\n\n", "Alice", "\n\nAge: ", True),
        ("\n\n", "Alice", "\nAge: ", False),
    ],
)
def test_a_stop_inside_a_longer_token(
    tiny: TransformersBackend, last: str, value: str, after: str, kept: bool
) -> None:
    backend = scripted(tiny, "Name: ", [*tiny.encode("Alice"), token(tiny, last)])
    result = qrun.Query("Name: " + LINE_HOLE + after + NEXT_HOLE).run(
        model=backend, speculate=False)
    stats = result.stats
    assert result["n"] == value
    assert result.holes["n"].finish == "stop"
    assert stats.boundary_kept == int(kept)
    assert stats.boundary_dropped == int(not kept)
    assert stats.rollback_tokens == 0  # the token holding the stop was never fed
    assert result.text == "Name: " + value + after + result["a"]
    if kept:
        expected = (tiny.encode("Name: ") + tiny.encode("Alice") + [token(tiny, last)]
                    + tiny.encode((value[len("Alice"):] + after)[len(last):]))
    else:
        # Rolled back: the value's bytes inside the dropped token (the space of ` \n`) go
        # back in with the fixed text, tokenized together.
        expected = (tiny.encode("Name: ") + tiny.encode("Alice")
                    + tiny.encode(value[len("Alice"):] + after))
    check_last_forward(tiny, backend, expected)
    assert tiny.decode(expected) == "Name: " + value + after


# --- nothing to roll back, and nothing to keep it for -------------------------------------


def test_a_hole_that_ends_without_a_stop_has_no_boundary(tiny: TransformersBackend) -> None:
    # max_tokens runs out on "Alice" before any `"`: no overshoot, so neither counter moves.
    alice = tiny.encode("Alice")
    hole = "{{ gen n stop='\"' max_tokens=" + str(len(alice)) + " heal=false }}"
    backend = scripted(tiny, PREFIX, [*alice, token(tiny, '",')])
    result = qrun.Query(PREFIX + hole + '"}\n' + NEXT_HOLE).run(model=backend, speculate=False)
    stats = result.stats
    assert result["n"] == "Alice"
    assert result.holes["n"].finish == "max_tokens"
    assert stats.boundary_kept == 0 and stats.boundary_dropped == 0
    assert stats.rollback_tokens == 0
    assert result.text == '{"name": "Alice"}\n' + result["a"]
    expected = tiny.encode(PREFIX) + alice + tiny.encode('"}\n')
    check_last_forward(tiny, backend, expected)
    assert stats.forward_tokens == len(expected)


def test_an_overshoot_before_another_hole_is_rolled_back(tiny: TransformersBackend) -> None:
    # No fixed text follows the stop: `",` cannot be kept (it is not part of any text).
    quote_comma = token(tiny, '",')
    backend = scripted(tiny, PREFIX, [*tiny.encode("Alice"), quote_comma])
    result = qrun.Query(PREFIX + NAME_HOLE + NEXT_HOLE).run(model=backend, speculate=False)
    stats = result.stats
    assert result["n"] == "Alice"
    assert stats.boundary_kept == 0 and stats.boundary_dropped == 1
    assert stats.rollback_tokens == 0
    assert result.text == '{"name": "Alice' + result["a"]
    expected = tiny.encode(PREFIX) + tiny.encode("Alice")
    check_last_forward(tiny, backend, expected)
    assert stats.forward_tokens == len(expected)


def test_an_overshoot_at_the_end_of_the_template_is_rolled_back(
    tiny: TransformersBackend,
) -> None:
    backend = scripted(tiny, PREFIX, [*tiny.encode("Alice"), token(tiny, '",')])
    result = qrun.Query(PREFIX + NAME_HOLE).run(model=backend, speculate=False)
    stats = result.stats
    assert result["n"] == "Alice"
    assert result.text == '{"name": "Alice'
    assert stats.boundary_kept == 0 and stats.boundary_dropped == 1
    assert stats.context_tokens == len(tiny.encode(PREFIX) + tiny.encode("Alice"))


def spelled(tiny: TransformersBackend, result: qrun.Result) -> str:
    """The text the model's context spells (special tokens spell nothing)."""
    return b"".join(tiny.vocabulary.token_bytes[t] or b"" for t in result.token_ids).decode()


def test_a_stop_hole_that_opens_the_template_rolls_back_only_the_overshoot(
    tiny: TransformersBackend,
) -> None:
    # The model's start token comes first.
    backend = scripted(tiny, "", [*tiny.encode("Alice"), token(tiny, '",')], start=1)
    result = qrun.Query(NAME_HOLE + '"}\n' + NEXT_HOLE).run(model=backend, speculate=False)
    stats = result.stats
    assert result["n"] == "Alice"
    assert stats.boundary_kept == 0 and stats.boundary_dropped == 1
    assert result.text == 'Alice"}\n' + result["a"]
    assert spelled(tiny, result) == result.text  # the bug: the context reads '"}\n' + ...
    expected = [tiny.start_token_id, *tiny.encode("Alice"), *tiny.encode('"}\n')]
    check_last_forward(tiny, backend, expected)


# --- a cached KV of the whole context, without the logits after it ------------------------


def test_a_kv_snapshot_of_the_whole_context_without_logits_is_fed_again(
    tiny: TransformersBackend,
) -> None:
    # Also on the default SmolLM2 backend (load_model's 1 GB prefix cache): same two runs.
    cached = TransformersBackend(tiny.model, tiny.tokenizer, "tiny-cached",
                                 prefix_cache=PrefixCache())
    # One forward over "Name:" + "x" + " B": a KV snapshot at the end of the "Name:" segment.
    qrun.Query("Name:{{ v }} B{{ gen b max_tokens=1 }}").run(model=cached, v="x")
    query = qrun.Query("Name:{{ gen a max_tokens=2 heal=false }}")
    result = query.run(model=cached, temperature=0.0)
    assert result.stats.cached_tokens == len(tiny.encode("Name:"))
    assert result.text == "Name:" + result["a"] == spelled(tiny, result)
    assert result["a"] == query.run(model=tiny, temperature=0.0)["a"]
