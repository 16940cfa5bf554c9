"""TokenIndex / MaskCursor on the real SmolLM2 vocabulary: masks equal a brute-force walk of
every token, random walks over allowed tokens always end in full matches, partial UTF-8
tokens, EOS handling, token budgets, the cache."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qrun.constraint.patterns import PATTERNS
from qrun.constraint.regex_index import DEAD, IllegalTokenError, IndexCache, TokenIndex
from qrun.constraint.vocab import Vocabulary
from qrun.regex.dfa import compile_dfa

Walk = Callable[[TokenIndex, list[int], int], bytes]

_WALK = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _reachable_states(index: TokenIndex, limit: int) -> list[int]:
    dfa = index.dfa
    seen = [dfa.start]
    queue = deque([dfa.start])
    while queue and len(seen) < limit:
        for target in sorted(set(dfa.transitions[queue.popleft()].tolist())):
            if target != dfa.dead and target not in seen:
                seen.append(target)
                queue.append(target)
    return seen[:limit]


def _brute_force(index: TokenIndex, state: int) -> npt.NDArray[np.bool_]:
    table = index.dfa.transitions.tolist()
    dead = index.dfa.dead
    out = np.zeros(index.vocab.size, dtype=np.bool_)
    for token_id, data in enumerate(index.vocab.token_bytes):
        if data is None:
            continue
        cur = state
        for byte in data:
            cur = table[cur][byte]
            if cur == dead:
                break
        out[token_id] = cur != dead
    if index.dfa.accepting[state]:
        out[list(index.vocab.eos_token_ids)] = True
    return out


DIFF_PATTERNS = [
    PATTERNS["DATE"],
    PATTERNS["EMAIL"],
    PATTERNS["LINE"],
    r"[^a-z]*é",
    r" ?(yes|no)\.",
    r'\{"name": "([^"\\\x00-\x1f]|\\["\\/bfnrt])*", "n": -?[0-9]+\}',
]


@pytest.mark.parametrize("pattern", DIFF_PATTERNS)
def test_masks_equal_brute_force(pattern: str, smol_vocab: Vocabulary) -> None:
    index = TokenIndex.build(pattern, smol_vocab)
    for state in _reachable_states(index, 4):
        assert np.array_equal(index.allowed(state), _brute_force(index, state)), state


def test_lazy_masks_equal_eager(smol_vocab: Vocabulary) -> None:
    pattern = PATTERNS["EMAIL"]
    eager = TokenIndex.build(pattern, smol_vocab)
    lazy = TokenIndex.build(pattern, smol_vocab, eager_max_states=0)
    for state in range(eager.dfa.num_states):
        assert np.array_equal(eager.allowed(state), lazy.allowed(state))
        assert eager.can_continue(state) == lazy.can_continue(state)


def test_masks_agree_with_regex_partial_match(smol_vocab: Vocabulary) -> None:
    """An oracle independent of the DFA: for valid-UTF-8 tokens, `regex` partial matching."""
    pattern = r"[a-z]+(\.[a-z]+)*@[a-z]+\.(com|org)"
    index = TokenIndex.build(pattern, smol_vocab)
    compiled = regex.compile(pattern, flags=regex.ASCII)
    for prefix in ["", "john.d"]:
        state = index.advance_bytes(index.start_state, prefix.encode())
        mask = index.allowed(state, eos=False)
        for token_id, data in enumerate(smol_vocab.token_bytes):
            if data is None:
                continue
            try:
                text = prefix + data.decode("utf-8")
            except UnicodeDecodeError:
                assert not mask[token_id]  # this pattern is ASCII-only
                continue
            expected = compiled.fullmatch(text, partial=True) is not None
            assert bool(mask[token_id]) == expected, (prefix, data)


def test_partial_utf8_tokens_are_allowed(smol_vocab: Vocabulary) -> None:
    split_tokens = [
        i for i, b in enumerate(smol_vocab.token_bytes) if b in (b"\xf0\x9f", b"\xc3", b"\xe2\x80")
    ]
    assert len(split_tokens) == 3
    index = TokenIndex.build(r"(é|😀|—)+", smol_vocab)
    start = index.allowed(index.start_state)
    assert all(start[i] for i in split_tokens)
    cursor = index.start()
    cursor.advance(next(i for i in split_tokens if smol_vocab.token_bytes[i] == b"\xc3"))
    assert not cursor.can_end()
    cursor.advance_bytes(b"\xa9")  # completes é
    assert cursor.can_end()
    # An ASCII-only pattern allows none of the 313 non-UTF-8 tokens.
    ascii_index = TokenIndex.build(r"[ -~]+", smol_vocab)
    assert not any(ascii_index.allowed(ascii_index.start_state)[i] for i in split_tokens)


def test_eos_and_special_tokens(smol_vocab: Vocabulary) -> None:
    index = TokenIndex.build(r"[0-9]+", smol_vocab)
    cursor = index.start()
    assert not cursor.allowed()[2] and not cursor.can_end()
    assert int(cursor.allowed().sum()) == 10  # digits are single tokens only
    cursor.advance(smol_vocab.token_bytes.index(b"7"))
    assert cursor.allowed()[2] and cursor.can_end()
    assert not cursor.allowed(eos=False)[2]
    assert not any(cursor.allowed()[i] for i in range(17) if i != 2)
    with pytest.raises(IllegalTokenError):
        cursor.advance(2)
    with pytest.raises(IllegalTokenError):
        cursor.advance(smol_vocab.token_bytes.index(b"a"))
    assert index.advance(index.start_state, 1) == DEAD


def test_nonempty_masks_in_every_live_state(smol_vocab: Vocabulary) -> None:
    for name, pattern in PATTERNS.items():
        index = TokenIndex.build(pattern, smol_vocab)
        for state in range(index.dfa.num_states):
            if not index.is_accepting(state):
                assert index.allowed(state).any(), (name, state)
                assert index.can_continue(state)


def test_forced_bytes_and_distance_on_cursor(smol_vocab: Vocabulary) -> None:
    index = TokenIndex.build(r"ID-[0-9]{3}", smol_vocab)
    cursor = index.start()
    assert cursor.forced_bytes() == b"ID-"
    assert cursor.min_bytes_to_accept() == 6
    cursor.advance_bytes(b"ID-4")
    assert cursor.forced_bytes() == b""
    assert cursor.min_bytes_to_accept() == 2
    fork = cursor.copy()
    fork.advance_bytes(b"22")
    assert fork.can_end() and not fork.can_continue() and not cursor.can_end()


def test_rollback_takes_back_tokens_and_byte_feeds(smol_vocab: Vocabulary) -> None:
    # The Cursor protocol's rollback (qrun/constraint/spec.py), which qrun.Matcher uses.
    index = TokenIndex.build(r"ID-[0-9]{3}", smol_vocab)
    cursor = index.start()
    cursor.advance_bytes(b"ID-")
    digit = smol_vocab.token_bytes.index(b"4")
    assert cursor.consume(digit) and cursor.consume(digit)
    assert not cursor.consume(smol_vocab.token_bytes.index(b"a"))  # no change
    fork = cursor.copy()
    assert fork.consume(digit) and fork.can_end()
    fork.rollback(1)
    assert not fork.can_end() and fork.state == cursor.state
    cursor.rollback(2)
    assert cursor.min_bytes_to_accept() == 3 and fork.min_bytes_to_accept() == 1
    with pytest.raises(ValueError, match="cannot roll back 2 tokens"):
        cursor.rollback(2)  # one byte feed is left
    assert cursor.min_bytes_to_accept() == 3  # unchanged by the refusal
    cursor.rollback(1)
    assert cursor.state == index.start_state and cursor.forced_bytes() == b"ID-"
    with pytest.raises(ValueError):
        cursor.rollback(-1)


def test_allowed_within_budget(smol_vocab: Vocabulary) -> None:
    index = TokenIndex.build(r"[a-z]+ (yes|no)", smol_vocab)
    start = index.start_state
    assert np.array_equal(index.allowed_within(start, 100), index.allowed(start))
    # Fewest tokens: a word token, then " no" (one token in SmolLM2).
    assert index.token_dist[start] == 2
    assert np.array_equal(index.allowed_within(start, 2), index.allowed(start))
    assert not index.allowed_within(start, 1).any()
    word = index.advance_bytes(start, b"ok")
    last = index.allowed_within(word, 1)
    assert (last <= index.allowed(word)).all()
    for token_id in index.allowed(word).nonzero()[0].tolist():
        after = index.advance(word, token_id)
        assert bool(last[token_id]) == index.is_accepting(after)
    space, no = smol_vocab.token_bytes.index(b" "), smol_vocab.token_bytes.index(b" no")
    assert last[no] and not last[space] and index.allowed_within(word, 2)[space]
    done = index.advance_bytes(start, b"ok no")
    assert index.allowed_within(done, 0)[2]  # EOS needs no budget
    assert not index.allowed_within(done, 0, eos=False).any()


@pytest.mark.parametrize(
    "pattern",
    [
        r"[a-z]+ (yes|no)",
        PATTERNS["EMAIL"],
        PATTERNS["DATETIME"],
        PATTERNS["URL"],
        r'\{"name": "[a-z]*", "age": [0-9]+, "city": "[A-Za-z ]*"\}',
    ],
)
def test_lazy_budget_is_an_upper_bound(
    pattern: str, smol_vocab: Vocabulary
) -> None:
    exact = TokenIndex.build(pattern, smol_vocab)
    lazy = TokenIndex.build(pattern, smol_vocab, eager_max_states=0)
    assert (lazy.token_dist >= exact.token_dist).all()
    assert (lazy.token_dist[:-1] <= exact.dfa.dist[:-1]).all()  # never worse than bytes
    # A walk that always takes the first token allowed under the lazy bound still finishes.
    cursor = lazy.start()
    budget = int(lazy.token_dist[lazy.start_state])
    for tokens_left in range(budget, 0, -1):
        if cursor.can_end():
            break
        cursor.advance(int(np.flatnonzero(cursor.allowed(tokens_left, eos=False))[0]))
    assert cursor.can_end()


def test_greedy_bound_counts_tokens_not_bytes(
    smol_vocab: Vocabulary
) -> None:
    pattern = r'x", "age": [0-9]'
    exact = TokenIndex.build(pattern, smol_vocab)
    index = TokenIndex.build(pattern, smol_vocab, eager_max_states=0)
    start = index.start_state
    assert index.dfa.dist[start] == 12
    assert exact.token_dist[start] <= index.token_dist[start] <= 8


@st.composite
def _walk_choices(draw: st.DrawFn) -> list[int]:
    return draw(st.lists(st.integers(0, 2**31), min_size=40, max_size=40))


WALK_PATTERNS = [
    *PATTERNS.values(),
    r"[a-c]{2,5}(x|yz)*",
    r"(é|中|😀| )+",
    r"-?[0-9]{1,3}(,[0-9]{3})*",
    r"(?i)(hello|goodbye),? world!?",
]


@pytest.mark.parametrize("pattern", WALK_PATTERNS)
@_WALK
@given(choices=_walk_choices())
def test_random_walks_fullmatch(
    pattern: str,
    choices: list[int],
    smol_indexes: IndexCache,
    smol_vocab: Vocabulary,
    random_walk: Walk,
) -> None:
    index = smol_indexes.get(pattern, smol_vocab)
    text = random_walk(index, choices, 40).decode("utf-8")
    assert regex.fullmatch(pattern, text, flags=regex.ASCII), text


@_WALK
@given(
    pattern=st.sampled_from(["a", "ab", "[ab]", "(ab|c)", "[0-9]", " ?x"]).flatmap(
        lambda atom: st.sampled_from(["*", "+", "{2,3}", "?"]).map(lambda q: f"({atom}){q}z")
    ),
    choices=_walk_choices(),
)
def test_random_walks_on_generated_regexes(
    pattern: str,
    choices: list[int],
    smol_indexes: IndexCache,
    smol_vocab: Vocabulary,
    random_walk: Walk,
) -> None:
    index = smol_indexes.get(pattern, smol_vocab)
    text = random_walk(index, choices, 30).decode("utf-8")
    assert regex.fullmatch(pattern, text, flags=regex.ASCII), text


def test_byte_vocab_transition_map(byte_vocab: Vocabulary) -> None:
    """Exact token-level transitions on a tiny vocabulary (outlines-core test_index style)."""
    index = TokenIndex.build(r"abc|12-0", byte_vocab)
    start = index.start_state
    allowed = set(index.allowed(start).nonzero()[0].tolist())
    ab, abc, twelve, dash0 = 256, 257, 259, 260
    assert allowed == {ord("a"), ord("1"), ab, abc, twelve}
    assert index.is_accepting(index.advance(start, abc))
    assert index.advance(index.advance(start, twelve), dash0) != DEAD
    assert index.is_accepting(index.advance(index.advance(start, twelve), dash0))
    assert index.advance(start, 258) == DEAD  # "bc" cannot start
    assert index.allowed(index.advance(start, abc))[264]  # EOS


def test_index_cache(smol_vocab: Vocabulary) -> None:
    cache = IndexCache(max_entries=2)
    first = cache.get("a+", smol_vocab)
    assert cache.get("a+", smol_vocab) is first
    cache.get("b+", smol_vocab)
    cache.get("a+", smol_vocab)  # touch: "b+" is now the oldest
    cache.get("c+", smol_vocab)
    assert len(cache) == 2 and cache.get("a+", smol_vocab) is first
    results: list[TokenIndex] = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get("[0-9]{3}", smol_vocab)))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(r) for r in results}) == 1
    with pytest.raises(ValueError):
        IndexCache(max_entries=0)


def test_dfa_reuse_and_pattern_error(smol_vocab: Vocabulary) -> None:
    dfa = compile_dfa(r"[0-9]{2}")
    index = TokenIndex.build(dfa, smol_vocab)
    assert index.dfa is dfa
    from qrun.regex.dfa import PatternError

    with pytest.raises(PatternError, match="backreferences"):
        IndexCache().get(r"(a)\1", smol_vocab)
