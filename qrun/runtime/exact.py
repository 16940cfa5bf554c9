"""Filling a constrained `gen` hole from the model's own conditional distribution:
`sampler="exact"` (docs/language.md §14.8, issue #40).

Token masking draws each token from the model's distribution over the tokens the constraint
still allows, which is not p(x) ∝ P_model(x | context) over the constraint's language: a
likely first token that leads only to unlikely endings is taken too often. Where the language
is small, the conditional itself is cheap: every token sequence the mask allows is walked
(each tokenization of each string, as the masked loop could write it), the sequences are
scored in one tree forward as `select` scores its options (runtime/select.py), and one is
drawn by its probability. A sequence the constraint could continue past also pays the model's
mass of ending there (EOS, or a token that begins the template's next text:
docs/language.md §14.5), which is how the masked loop ends such a value."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qrun.constraint import Cursor
from qrun.constraint.vocab import byte_token_ids
from qrun.runtime.hole import GenRequest, Hole, HoleFailure, follow_of
from qrun.runtime.result import GenRecord
from qrun.runtime.sampler import log_softmax
from qrun.runtime.select import Proposal, Scoring, choose
from qrun.runtime.session import Session
from qrun.runtime.spelling import tokenizations_of

TREE_LIMIT = 1024
"""The most token-tree nodes (distinct prefixes of the token sequences the mask allows) an
exact hole scores: every tokenization of every value, fed once each, in forwards of at most
runtime/select.py TREE_NODES. Past it, each value is scored in its canonical tokenization
only. Measured on SmolLM2 (bench/faithfulness.py): `(Blue|Grey|Green|Red)` is 29 token
sequences in 50 nodes; the six sentences of `(The cat|The dog|A bird) (sleeps|runs)\\.` are
4,898 sequences in 15,242 nodes (scoring them all took 40 s on transformers), of which the
canonical six hold 99.7 % of the mass."""

VALUES_LIMIT = 256
"""The most values an exact hole scores in their canonical tokenizations."""

BYTES_LIMIT = 8192
"""The most byte-trie nodes walked to list the values (each a mask computation)."""


@dataclass(frozen=True, slots=True)
class Ending:
    """One token sequence the masked loop could write as the whole value. `end_tokens`: where
    the constraint could go on, the tokens whose probability is the model's mass of ending
    here (EOS and the next text's first tokens); empty where the value must end."""

    tokens: tuple[int, ...]
    text: bytes  # the healed prefix included
    finish: str  # what the masked loop reports: "match", "max_tokens" or "eos"
    end_tokens: tuple[int, ...] = ()


def fill_exact(session: Session, request: GenRequest, scoring: Scoring,
               tree_limit: int | None = None, proposal: Proposal | None = None) -> GenRecord:
    """Fill `request`'s hole with a value drawn from the model's conditional over its
    constraint's language (at temperature T: string probabilities to the power 1/T; at 0 the
    likeliest string), and return its record, whose `value_probs` is that conditional.

    `tree_limit`: the most token-tree nodes walked before every value is scored in its
    canonical tokenization alone (TREE_LIMIT when None). `proposal`: a particles block's
    (runtime/select.py), which draws the string at temperature 1; the record's
    `log_importance` is then the draw's.

    Raises:
        LanguageTooLarge: the language has more than VALUES_LIMIT values (or BYTES_LIMIT
            prefixes of them).
        HoleFailure: no value fits max_tokens.
    """
    cursor = request.cursor
    assert cursor is not None, "sampler='exact' needs a constraint (lang/args.py checks)"
    assert not request.healed_in_context, "an exact hole heals by taking the token back"
    session.settle()
    session.ensure_start()
    hole = Hole(session, request)
    started = time.perf_counter()
    endings = _endings(session, request, cursor, TREE_LIMIT if tree_limit is None else tree_limit,
                       proposal is not None)
    session.stats.mask_s += time.perf_counter() - started
    if not endings:
        raise HoleFailure(f"no value of hole '{request.name}' fits within {request.max_tokens} "
                          "token(s)", cut_off=True)
    first = log_softmax(session.next_logits()) if not endings[0].tokens else None
    rows = ending_rows(endings)
    token_logprobs, commit = scoring.score(session, rows) if rows else ([], _nothing)
    weights = ending_weights(endings, token_logprobs, first)
    chosen, log_importance = _choose(endings, weights, request, proposal)
    logprobs: list[float] = []
    if endings[chosen].tokens:
        commit(row_of(endings, chosen))
        logprobs = token_logprobs[row_of(endings, chosen)]
    start = len(session.token_ids) - len(endings[chosen].tokens)
    for k, (token, logprob) in enumerate(zip(endings[chosen].tokens, logprobs, strict=True)):
        if session.recorder is not None:
            session.recorder.chosen(start + k, token, "sampled", logprob)
        hole.adopt(token, logprob)
    session.stats.generated_tokens += len(endings[chosen].tokens)
    record = hole.finish(endings[chosen].finish, "ended before its value matched")
    record.value_probs = _value_probs(endings, weights, len(request.prefix))
    record.log_evidence = _logsumexp(weights)
    record.log_importance = log_importance
    return record


def ending_rows(endings: list[Ending], start: int = 0) -> list[list[int]]:
    """The token rows that score `endings` (from their token `start` on): each ending's
    tokens, then its tokens followed by each of its end tokens (none for an empty one, whose
    end tokens are scored from the logits before it)."""
    rows: list[list[int]] = []
    for ending in endings:
        tokens = list(ending.tokens[start:])
        if tokens:
            rows.append(tokens)
            rows.extend([*tokens, token] for token in ending.end_tokens)
    return rows


def ending_weights(endings: list[Ending], token_logprobs: list[list[float]],
                   first: npt.NDArray[np.float32] | None, start: int = 0) -> list[float]:
    """Each ending's log-probability from its rows' token log-probabilities (ending_rows):
    its tokens', plus the log of its end tokens' total where it could go on; `first`: the
    log-probabilities before the ending's token `start`, for an ending with none after it."""
    weights: list[float] = []
    row = 0
    for ending in endings:
        if len(ending.tokens) <= start:  # nothing more: only the mass of ending at once, if any
            assert first is not None, "the logits before an empty ending are given"
            weights.append(_logsumexp([float(first[t]) for t in ending.end_tokens])
                           if ending.end_tokens else 0.0)
            continue
        weight = sum(token_logprobs[row])
        ends = token_logprobs[row + 1 : row + 1 + len(ending.end_tokens)]
        row += 1 + len(ending.end_tokens)
        if ending.end_tokens:
            weight += _logsumexp([lps[-1] for lps in ends])
        weights.append(weight)
    return weights


def tail_endings(session: Session, request: GenRequest, cursor: Cursor, start: list[int],
                 byte_limit: int, boundary: tuple[int, ...]) -> list[Ending] | None:
    """The ways to end the value from where `cursor` stands after `start` (the value's tokens
    so far; each Ending's tokens begin with them), `boundary` the tokens that begin the
    template's next text (runtime/hole.py follow_of): each rest of a value in its canonical
    tokenization, where a walk of at most `byte_limit` bytes finds them all; None where what
    is left is larger (or does not begin on a character). sampler="smc" finishes a particle
    so once what is left of its language is small (runtime/particles.py). Canonical spellings
    only, as its particles propose them: every tokenization of "Yes|No" is a tree to feed
    where the canonical two are one token each, none to feed (0.028 s a sample against 0.014
    on llama.cpp), for 0.3 % of the mass where it was measured (docs/language.md §14.8)."""
    try:
        # as many values as nodes: each ends at a node walked (or at the start), so the byte
        # bound bounds them too, however many particles' bounds it pools
        rests = _walk_bytes(session, cursor, byte_limit, byte_limit)
        for rest in rests:
            rest.decode("utf-8")
    except _TooLarge:
        return None
    except UnicodeDecodeError:
        return None  # the particle stands inside a character: its rest is no text alone
    return _canonical(session, request, cursor, rests, boundary, start)


def _nothing(chosen: int) -> None:
    raise AssertionError("no row to commit")


def row_of(endings: list[Ending], chosen: int, start: int = 0) -> int:
    """The index among the scored rows (ending_rows) of ending `chosen`'s own row (each
    ending with tokens past `start` has its row, then one row per end token)."""
    return sum(1 + len(e.end_tokens) for e in endings[:chosen] if len(e.tokens) > start)


class _TooLarge(Exception):
    """A walk passed its bound."""


class LanguageTooLarge(HoleFailure):
    """The hole's language has more values than an exact hole scores; raised before any
    model work (a `{% particles %}` block's hole then takes one particle: runtime/engines.py)."""


def _endings(session: Session, request: GenRequest, cursor: Cursor, tree_limit: int,
             in_block: bool = False) -> list[Ending]:
    """Every token sequence the masked loop could write where they are few (`tree_limit`
    nodes), else every value in its canonical tokenization (VALUES_LIMIT values). `in_block`:
    the hole is in a `{% particles %}` block, where the error's advice differs (a hole there
    may not name sampler="mask"; naming none, the block's particle draws it).

    Raises:
        LanguageTooLarge: more values than that.
    """
    boundary = follow_of(session, request.follow).tokens
    try:
        return _walk_tokens(session, request, cursor, boundary, tree_limit)
    except _TooLarge:
        pass
    try:
        return _canonical(session, request, cursor, _walk_bytes(session, cursor), boundary)
    except _TooLarge:
        advice = ('name no sampler on the hole and give the run none (the block\'s particle '
                  'then draws it) or sampler="smc"' if in_block else
                  'sample it under the mask (sampler="mask" on the hole) or by particles '
                  '(sampler="smc")')
        raise LanguageTooLarge(
            f"sampler=\"exact\": hole '{request.name}' has too many tokenizations to score "
            f"every one and more than {VALUES_LIMIT} values (or more than {BYTES_LIMIT} "
            f"distinct prefixes of them) to score each in its canonical one; its language "
            f"is too large to score whole: {advice}, or narrow the constraint") from None


def _ending_here(session: Session, request: GenRequest, cursor: Cursor, path: list[int],
                 text: bytes, left: int, boundary: tuple[int, ...]
                 ) -> tuple[Ending | None, list[int]]:
    """What the masked loop can do where `cursor` stands after `path` (`text`), with `left`
    tokens of budget: end there (the Ending, or None) and which tokens go on. `boundary`: the
    tokens that begin the template's next text (runtime/hole.py follow_of)."""
    eos = session.backend.eos_token_ids
    children: list[int] = []
    mask = None
    if cursor.can_continue() and left > 0:
        mask = cursor.allowed(left)
        if not path and request.first_tokens is not None:
            mask = mask & request.first_tokens
        children = [int(t) for t in np.flatnonzero(mask) if int(t) not in eos]
    if not cursor.can_end():
        return None, children
    if mask is not None and children:  # it could go on: ending costs the model's end mass
        stops = (*sorted(eos), *(t for t in boundary if not mask[t]))
        return Ending(tuple(path), text, "eos", stops), children
    finish = "match" if not cursor.can_continue() else "max_tokens" if left <= 0 else "eos"
    return Ending(tuple(path), text, finish), children


def _walk_tokens(session: Session, request: GenRequest, cursor: Cursor,
                 boundary: tuple[int, ...], limit: int) -> list[Ending]:
    """Every token sequence the masked loop could write as the value.

    Raises:
        _TooLarge: more than `limit` nodes.
    """
    token_bytes = session.backend.vocabulary.token_bytes
    plen = len(request.prefix)
    endings: list[Ending] = []

    def expand(path: list[int]) -> list[int]:
        text, spent = b"", 0
        for token in path:
            text += token_bytes[token] or b""
            spent += len(text) > plen  # tokens inside the healed text are free
        ending, children = _ending_here(session, request, cursor, path, text,
                                        request.max_tokens - spent, boundary)
        if ending is not None:
            endings.append(ending)
        return children

    _depth_first(cursor, expand, limit)
    return endings


def _walk_bytes(session: Session, cursor: Cursor, values: int = VALUES_LIMIT,
                nodes: int = BYTES_LIMIT) -> list[bytes]:
    """Every value of the constraint's language (the healed prefix first), walked a byte at a
    time through the tokens of one byte.

    Raises:
        _TooLarge: more than `values` values or `nodes` nodes.
    """
    tokens = byte_token_ids(session.backend.vocabulary)
    byte_tokens = tokens[tokens >= 0]
    token_bytes = session.backend.vocabulary.token_bytes
    found: list[bytes] = []

    def expand(path: list[int]) -> list[int]:
        if cursor.can_end():
            found.append(b"".join(token_bytes[t] or b"" for t in path))
            if len(found) > values:
                raise _TooLarge
        if not cursor.can_continue():
            return []
        mask = cursor.allowed()
        return [int(t) for t in byte_tokens[mask[byte_tokens]]]

    _depth_first(cursor, expand, nodes)
    return found


def _depth_first(cursor: Cursor, expand: Callable[[list[int]], list[int]], limit: int) -> None:
    """Walk the tree of token paths from where `cursor` stands, depth first, with the cursor
    moved along (and given back where it began, also on an error): at each node `expand(path)`
    runs with the cursor there and gives the tokens to go on with.

    Raises:
        _TooLarge: more than `limit` nodes below the root.
    """
    path: list[int] = []
    stack = [iter(expand(path))]
    nodes = 0
    try:
        while stack:
            token = next(stack[-1], None)
            if token is None:
                stack.pop()
                if path:
                    path.pop()
                    cursor.rollback(1)
                continue
            nodes += 1
            if nodes > limit:
                raise _TooLarge
            cursor.advance(token)
            path.append(token)
            stack.append(iter(expand(path)))
    finally:
        if path:
            cursor.rollback(len(path))


def _canonical(session: Session, request: GenRequest, cursor: Cursor,
               values: list[bytes], boundary: tuple[int, ...], start: list[int] | None = None
               ) -> list[Ending]:
    """Each value (healed prefix first) in its canonical tokenization, where the mask allows
    it within the hole's max_tokens; or, after `start` (the tokens the cursor stands after),
    each rest of one (`values`) in its own canonical tokenization."""
    plen = len(request.prefix)
    vocab = session.backend.vocabulary
    tokenizations = tokenizations_of(session.backend)  # the rests recur across paths and runs
    written = list(start or ())
    before = b"".join(vocab.token_bytes[t] or b"" for t in written)
    endings = []
    for data in values:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # a value is text: bytes that are not UTF-8 are no value
        tokens = written + (list(tokenizations.encode(text)) if text else [])
        spent, offset, consumed = 0, 0, 0
        for k, token in enumerate(tokens):
            offset += len(vocab.token_bytes[token] or b"")
            spent += offset > plen
            if k < len(written):
                continue  # where the cursor stands already
            if not cursor.consume(token):
                break
            consumed += 1
        if consumed == len(tokens) - len(written) and spent <= request.max_tokens:
            ending, _ = _ending_here(session, request, cursor, tokens, before + data,
                                     request.max_tokens - spent, boundary)
            if ending is not None:
                endings.append(ending)
        cursor.rollback(consumed)
    return endings


def _choose(endings: list[Ending], weights: list[float], request: GenRequest,
            proposal: Proposal | None) -> tuple[int, float]:
    """The chosen ending: a string by its summed probability over its tokenizations (its
    power 1/T; the likeliest at T = 0) or by `proposal`, then one of its tokenizations by
    probability (the likeliest at T = 0); and the string's log importance weight (0 but for
    a proposal's)."""
    by_text: dict[bytes, list[int]] = {}
    for index, ending in enumerate(endings):
        by_text.setdefault(ending.text, []).append(index)
    texts = list(by_text)
    masses = [_logsumexp([weights[i] for i in by_text[t]]) for t in texts]
    temperature = request.sampling.temperature
    log_importance = 0.0
    if proposal is None:
        text = texts[choose(masses, temperature, request.generator)]
    else:  # a particles block's holes run at temperature 1 (runtime/particle_block.py)
        assert temperature == 1.0, "a proposal draws from the conditional's own terms"
        index, log_importance = proposal.draw(masses)
        text = texts[index]
    spellings = by_text[text]
    pick = choose([weights[i] for i in spellings], 1.0 if temperature else 0.0,
                  request.generator)
    return spellings[pick], log_importance


def _value_probs(endings: list[Ending], weights: list[float], prefix: int) -> dict[str, float]:
    """Each value's probability under the model's conditional (temperature 1), summed over
    its tokenizations, likeliest first."""
    top = max(weights)
    mass: dict[str, float] = {}
    for ending, weight in zip(endings, weights, strict=True):
        text = ending.text[prefix:].decode("utf-8", errors="replace")
        mass[text] = mass.get(text, 0.0) + math.exp(weight - top)
    total = sum(mass.values())
    return {text: m / total for text, m in sorted(mass.items(), key=lambda kv: -kv[1])}


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))
