"""Filling a constrained `gen` hole by particles: sampler="smc" (docs/language.md §14.8, issue
#40), sequential Monte Carlo towards the model's conditional over the constraint's language,
p(x) ∝ P_model(x | context) over L, as LLaMPPL and genlm-control do.

N particles each write the value token by token, each token from the model's distribution
restricted to the tokens it may propose (those the mask allows, in canonical pairs:
runtime/spelling.py; the particles on one path draw theirs together: spread, after a look one
token ahead: _look_rows); each carries a weight multiplied at every step by the mass of those
tokens (the normalizer of that restricted distribution: the ratio of target to proposal), so a
particle that took a likely-looking token leading into unlikely text loses weight as the mask
cuts its next choices. Ending is one of the choices (EOS, or a token that begins the template's
next text: docs/language.md §14.5), where the constraint lets the value end and go on. When the
unfinished particles' effective sample size falls below the hole's ess_threshold (half, by
default) of their number they are resampled (systematic resampling): heavy ones copied, light
ones dropped, each weighing their mean (finished ones stay: resampled says why). A copy shares
its KV cache and logits until it feeds a token, and particles on the same path are fed as one
row (_feed_rows: no position is fed twice, no question asked twice); each step's rows, the
look's and the feed's, and the trees of the paths it finishes are one batch of the run's
scheduler (runtime/scheduler.py forward_step). Once what is left of a particle's language is
small (for the particles on its path together: _small_tail), they are finished exactly instead
(_finish_exactly: the rest scored whole, as sampler="exact" scores a hole). The value is one
particle drawn by weight (at temperature 0, of the value they weigh most); every particle and
the log of the estimate of the language's mass under the model go into the record."""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from qrun.backends.base import Backend, KVCache, StepModel, TreeScorer
from qrun.constraint import Cursor
from qrun.runtime.exact import Ending, ending_rows, ending_weights, row_of, tail_endings
from qrun.runtime.hole import GenRequest, Hole, HoleFailure, follow_of
from qrun.runtime.result import GenRecord
from qrun.runtime.sampler import draw, log_softmax, new_generator
from qrun.runtime.scheduler import forward_step, forward_trees
from qrun.runtime.select import OptionTree, TreeJobs
from qrun.runtime.session import Session
from qrun.runtime.spelling import Spellings


@dataclass(eq=False)
class Particle:
    """One particle: its tokens, the masked log-probability of each, its cursor, its KV
    cache (the context and the tokens fed so far; None until it first feeds one: it is the
    context's, shared), the logits for its next step, its log-weight and, once it has ended,
    why ("eos", "match", "max_tokens")."""

    cursor: Cursor
    logits: npt.NDArray[np.float32]
    cache: KVCache | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # byte offset where each token ends
    log_weight: float = 0.0
    finish: str | None = None
    # Finished exactly (_finish_exactly): every value it could have ended with (its bytes,
    # the healed prefix included) and its probability, which the estimate counts in place
    # of the one it drew.
    rests: list[tuple[bytes, float]] | None = None

    def take(self, token: int, logprob: float, size: int) -> None:
        """Write `token` (of `size` bytes, drawn with `logprob`) after the particle's tokens;
        its cursor is moved by the caller (or not at all, once the value is decided)."""
        self.tokens.append(token)
        self.logprobs.append(logprob)
        self.ends.append((self.ends[-1] if self.ends else 0) + size)

    def copy(self) -> Particle:
        """A copy sharing this particle's KV cache until one of them feeds (_feed_rows)."""
        return Particle(self.cursor.copy(), self.logits, self.cache, list(self.tokens),
                        list(self.logprobs), list(self.ends), self.log_weight, self.finish)


def fill_particles(session: Session, request: GenRequest, model: StepModel,
                   tree: TreeScorer | None = None) -> GenRecord:
    """Fill `request`'s hole with `request.particles` particles (see the module) and return
    its record: `value_probs` is the particles' weighted estimate of the conditional,
    `particles` each particle's value and weight, `log_evidence` the log of the estimate of
    the language's probability. With `tree` (the run's tree scorer) and at temperature 1 (or
    0), a particle whose language left is small is finished exactly (_finish_exactly).

    Raises:
        HoleFailure: no particle found a value within the hole's max_tokens.
    """
    cursor = request.cursor
    assert cursor is not None, "sampler='smc' needs a constraint (lang/args.py checks)"
    assert not request.healed_in_context, "particles heal by taking the token back"
    session.settle()
    session.ensure_start()
    hole = Hole(session, request)
    first = session.next_logits()
    session.sync()  # the context's cache covers it all: particles fork it
    base = session.cache
    generator = request.generator or new_generator()
    particles = [Particle(cursor.copy(), first) for _ in range(request.particles)]
    eos = frozenset(session.backend.eos_token_ids)
    boundary = follow_of(session, request.follow).tokens
    token_bytes = session.backend.vocabulary.token_bytes
    known = Known(session.backend)
    if request.sampling.temperature not in (0.0, 1.0):
        tree = None  # a tail scored whole is drawn at temperature 1
    while any(p.finish is None for p in particles):
        started = time.perf_counter()
        at: dict[tuple[int, ...], Choices] = {}  # this step's choices, per path
        to_feed: list[Particle] = []
        ahead: dict[tuple[int, ...], Ahead] = {}
        finishing: dict[tuple[int, ...], list[Particle]] = {}
        stepping: dict[tuple[int, ...], list[Particle]] = {}
        probe: bool | None = None  # whether the step's first look found a small rest
        paths: dict[tuple[int, ...], list[Particle]] = {}
        for p in particles:
            if p.finish is None:
                paths.setdefault(tuple(p.tokens), []).append(p)
        # The most populous path first: its probe for a small tail, of the largest bound,
        # stands for the others where its tail is large (theirs are about as far from their
        # ends, their bounds no larger). A probe walks up to TAIL_BYTES bytes of the
        # constraint per particle on the path: cheap for a regex, whose states are cached, not
        # for a JSON schema (8 particles, a 40-token JSON value: 3.3 s with every path
        # probing, so 1.19 s, 1.16 not probing; docs/language.md §14.8 has the rest).
        for path, members in sorted(paths.items(), key=lambda item: -len(item[1])):
            if tree is not None and probe is not False and path not in known.tails:
                known.tails[path] = _small_tail(session, request, members[0], len(members),
                                                boundary)
                if probe is None:
                    probe = known.tails[path] is not None
            if known.tails.get(path) is not None:
                finishing[path] = members
            else:  # a path a look ahead reached last step has its choices already
                at[path] = known.ahead.pop(path) if path in known.ahead else _choices(
                    members[0], request, session.backend, eos, boundary, known)
                stepping[path] = members
        looks = _look_rows(session, base, stepping, at, request)
        # The paths that do not look draw now, so that their tokens are fed in the look's
        # forward (one batch of rows a step, not two: a forward reads every weight once).
        for path, members in stepping.items():
            if path not in looks.plans:
                to_feed.extend(p for p, _ in _drawn(members, at[path], None, generator, request,
                                                    session.backend))
        feeding = _feed_rows(base, to_feed, particles)
        ends = [(members, known.tails[path] or []) for path, members in finishing.items()]
        finish = _finish_jobs(ends, base)
        session.stats.mask_s += time.perf_counter() - started
        rows = looks.rows + feeding.rows
        scored = None
        if rows or finish.parts:
            # The rows and the finishing paths' trees (their first TREE_NODES nodes: most
            # steps' all) in one batch of the run's scheduler: a step waits for one batch
            started = time.perf_counter()
            batches = finish.batches
            logits, trees = forward_step(model, session.backend.batch_forward(), tree, rows,
                                         batches[0] if batches else [])
            if batches:
                assert tree is not None
                scored = finish.scored([trees, *(forward_trees(tree, items)
                                                 for items in batches[1:])])
            session.count_model_call(time.perf_counter() - started, len(rows) + sum(
                len(ids) for batch in batches for ids, _, _ in batch),
                calls=bool(rows) + sum(1 for batch in batches if batch))
            feeding.take(logits[len(looks.rows):])
            started = time.perf_counter()
            ahead = _looked(looks, logits[:len(looks.rows)], request, session.backend, eos,
                            boundary, known)
            session.stats.mask_s += time.perf_counter() - started
        started = time.perf_counter()
        for path, looked in ahead.items():
            for p, pick in _drawn(stepping[path], at[path], looked.twist, generator, request,
                                  session.backend):
                # the look fed every token that goes on: the particles that took it share
                # its row
                p.cache, p.logits = looked.fed[pick]
        session.stats.mask_s += time.perf_counter() - started
        if ends:
            assert scored is not None
            _finish_exactly(session, ends, finish, scored, generator,
                            likeliest=request.sampling.temperature == 0.0)
        particles = resampled(particles, generator, request.ess_threshold)
    weights = np.array([p.log_weight for p in particles])
    if not np.isfinite(weights).any():
        raise HoleFailure(f"no particle of hole '{request.name}' found a value within "
                          f"{request.max_tokens} token(s)", cut_off=True)
    share, log_evidence = normalised(weights)
    plen = len(request.prefix)
    values = [b"".join(token_bytes[t] or b"" for t in p.tokens)[plen:].decode(
        "utf-8", errors="replace") for p in particles]
    probs: dict[str, float] = {}
    for particle, value, w in zip(particles, values, share, strict=True):
        # A particle finished exactly stands for its every rest by its probability: the same
        # expectation as its draw, without the draw's noise (Rao-Blackwellisation; a
        # language small from the start then gets exact's distribution whatever the draws).
        outcomes = [(value, 1.0)] if particle.rests is None else [
            (text[plen:].decode("utf-8", errors="replace"), q) for text, q in particle.rests]
        for key, q in outcomes:
            probs[key] = probs.get(key, 0.0) + float(w) * q
    chosen = particles[choose_particle(weights, request.sampling.temperature, generator,
                                       [probs.get(value, 0.0) for value in values])]
    _commit(session, base, chosen)
    start = len(session.token_ids) - len(chosen.tokens)
    for k, (token, logprob) in enumerate(zip(chosen.tokens, chosen.logprobs, strict=True)):
        if session.recorder is not None:
            session.recorder.chosen(start + k, token, "sampled", logprob)
        hole.adopt(token, logprob)
    session.stats.generated_tokens += len(chosen.tokens)
    record = hole.finish(chosen.finish or "eos", "ended before its value matched")
    record.particles = [(value, float(w)) for value, w in zip(values, share, strict=True)]
    record.value_probs = dict(sorted(probs.items(), key=lambda kv: -kv[1]))
    record.log_evidence = log_evidence
    return record


@dataclass(frozen=True, slots=True)
class Choices:
    """What a particle may propose next from where it is (a function of its tokens: every
    particle on the same path has the same cursor state and logits, so a step computes it once
    per path): the tokens (`tokens`) with the proposal's weights (`weights`, at the hole's
    temperature), the log of their share of the model's whole mass there (`log_share`: the
    weight's factor; -inf at a dead end), the tokens that end the value (`stops`), and each
    token's log-probability for the record (under the proposal at temperature 1)."""

    tokens: npt.NDArray[np.intp]
    weights: npt.NDArray[np.float64]
    log_share: float
    stops: frozenset[int]
    logprobs: npt.NDArray[np.float64]


def _choices(particle: Particle, request: GenRequest, backend: Backend, eos: frozenset[int],
             boundary: tuple[int, ...], known: Known) -> Choices:
    """The particle's next choices: the tokens the mask allows, in canonical pairs
    (runtime/spelling.py), ending where the constraint may end (EOS, or the next text's first
    tokens: docs/language.md §14.5), from the model's distribution at the hole's temperature
    (1 at 0, where the heaviest particle is taken at the end)."""
    cursor = particle.cursor
    left = request.max_tokens - _spent(particle, request)
    allowed = cursor.allowed(left).copy()
    if not particle.tokens and request.first_tokens is not None:
        allowed &= request.first_tokens
    allowed[list(eos)] = False
    stops: list[int] = []
    if cursor.can_end():  # ending is a choice too: EOS, or the next text's first tokens
        stops = [*eos, *(t for t in boundary if not allowed[t])]
        allowed[stops] = True
    temperature = request.sampling.temperature or 1.0
    scaled = particle.logits.astype(np.float64) / temperature
    shifted = np.exp(scaled - scaled.max())
    masked = np.where(allowed, shifted, 0.0)
    proposable = known.spellings.proposable(particle.tokens, cursor, left, masked, stops)
    if proposable.any():  # else no canonical spelling is left: the mask's tokens, all of them
        masked = np.where(proposable, masked, 0.0)
    tokens = np.flatnonzero(masked)
    weights = masked[tokens]
    mass = float(masked.sum())
    if mass <= 0.0:
        return Choices(tokens, weights, -math.inf, frozenset(stops), weights)
    record = weights
    if temperature != 1.0:  # records give them at temperature 1 (docs/language.md §15.2)
        record = np.exp(particle.logits[tokens].astype(np.float64)
                        - float(particle.logits.max()))
    return Choices(tokens, weights, math.log(mass / float(shifted.sum())), frozenset(stops),
                   np.log(record / float(record.sum())))


def spread(weights: npt.NDArray[np.float64], count: int, generator: np.random.Generator,
           twist: npt.NDArray[np.float64] | None = None) -> list[tuple[int, float]]:
    """`count` draws among choices of these weights (the proposable tokens: indices into
    them), for the `count` particles that stand on one path, each with the log of its
    importance weight p/q: systematic, from one uniform, so they spread over the tokens as
    evenly as the proposal q allows (a token gets ⌊count·q⌋ or ⌈count·q⌉ of them, where
    independent draws give anywhere from none to all). Where they are at least twice the
    tokens, from the proposal a block's particles draw a hole's values by
    (stratified_proposal; runtime/particle_block.py Strata); where they are fewer, not every
    token can have one, and they draw from p tempered (TEMPER). Sixteen particles drawn
    independently at the start of "(The|A|One|My) (big|small|...) ..." put most of themselves
    on "The" (the model's first word, whatever follows), and a word no particle tries is one
    no weight brings back. One particle draws as the masked loop does (sampler.draw).

    With `twist` (per choice, what a look ahead found the weight would gain at the next step:
    _look_rows), they draw as above from p × twist, normalised, in place of p: the token
    the next step favours too. Each weight is still × p/q, so the estimate's expectation is
    the same whatever the twist; its variance is less where the twist is the next step's
    share (that share then divides out of the weight the step after)."""
    p = weights / float(weights.sum()) if len(weights) else weights
    base = p
    if twist is not None and float((p * twist).sum()) > 0.0:
        base = p * twist / float((p * twist).sum())
    elif count == 1 or len(weights) == 0:
        return [(draw(weights, generator) if len(weights) else 0, 0.0)] * count
    if 2 * int((base > 0).sum()) <= count:
        q = stratified_proposal(base, count)
    else:
        tempered = base ** TEMPER
        q = tempered / float(tempered.sum())
    picks = systematic(q, (float(generator.random()) + np.arange(count)) / count)
    with np.errstate(divide="ignore"):
        log_importance = np.log(p[picks]) - np.log(q[picks])
    return [(int(k), float(w)) for k, w in zip(picks, log_importance, strict=True)]


TEMPER = 0.5
"""The power of p that particles on one path draw their next tokens from (normalised), where
they are fewer than twice the tokens (spread), each weight × p/q: after "A" below, seven
particles give " big" (p = 0.084, q = 0.127) a particle 0.89 of the time where p gives it
one 0.59 of the time. What p does not see is the rest: after "A" in "(The|A|One|My)
(big|...) (cat|...) (sleeps|...) (here|...)." the model's " big" is 0.084, but "A big" is
0.68 of the conditional over the sentences that begin with "A", and runs without an "A big"
particle cannot count it. Measured (bench/faithfulness.py, 100 runs, llama.cpp; docs/language.md
§14.8): those 2,400 sentences at 16 particles 0.168 from the conditional at p, 0.116 at
p^0.5, 0.104 evenly over the likeliest tokens; but evenly, at 4 particles, the 600 sentences
0.353 against 0.203 and the times of day 0.22 against 0.068 (the likely hours lose the
particles whose pooled bound finishes them exactly: _small_tail)."""


def stratified_proposal(p: npt.NDArray[np.float64], count: int) -> npt.NDArray[np.float64]:
    """What `count` particles that draw together (systematically) among values of
    probabilities `p` draw from: where they are at least twice as many as the values that
    have any probability (K), (1 - K/count)·p + 1/count for each, so that every value has a
    particle and the others go by p; else p. Not past count/2 values: the importance weights
    p/q, up to count/(count - K), are noise the particles' normalised weights turn into bias
    (tests/runtime/test_particle_block.py: with K ≤ count, 16 particles put 0.32 on a value
    whose conditional is 0.19; 0.21 with 2K ≤ count). Particles on one path that are fewer
    draw their tokens from √p instead (spread, TEMPER)."""
    support = p > 0
    values = int(support.sum())
    if 2 * values > count:
        return p
    floor = np.where(support, 1.0 / count, 0.0)
    mixed: npt.NDArray[np.float64] = (1.0 - values / count) * p + floor
    return mixed


def systematic(weights: npt.NDArray[np.float64], points: npt.NDArray[np.float64]
               ) -> npt.NDArray[np.intp]:
    """The index each of `points` (fractions of the total, in [0, 1)) falls on in the
    cumulative `weights` (≥ 0, some > 0): the inverse distribution function sampler.draw
    reads at one uniform point, read at evenly spaced ones (resampled, spread,
    runtime/particle_block.py Strata). A point the product rounds up to the total takes the
    last index of positive weight, as draw's does, never one of weight 0."""
    cumulative = np.cumsum(weights)
    picks = np.searchsorted(cumulative, points * cumulative[-1], side="right")
    clamped: npt.NDArray[np.intp] = np.minimum(picks, int(np.flatnonzero(weights)[-1]))
    return clamped


def _step(particle: Particle, choices: Choices, pick: int, log_importance: float,
          request: GenRequest, backend: Backend) -> bool:
    """One token of `particle`: choice `pick` of its `choices` (drawn by spread, with that
    importance weight); its weight gains their share of the model's mass. Returns whether it
    goes on (its token needs feeding)."""
    if choices.log_share == -math.inf:
        particle.log_weight = -math.inf  # a dead end: no weight can revive it
        particle.finish = "eos"
        return False
    token = int(choices.tokens[pick])
    particle.log_weight += choices.log_share + log_importance
    if token in choices.stops:
        particle.finish = "eos"
        return False
    cursor = particle.cursor
    cursor.advance(token)
    particle.take(token, float(choices.logprobs[pick]),
                  len(backend.vocabulary.token_bytes[token] or b""))
    if _goes_on(particle, request):
        return True
    # The value must end after this token: no forward is needed for it.
    if cursor.can_end():
        particle.finish = "match" if not cursor.can_continue() else "max_tokens"
    else:
        particle.log_weight, particle.finish = -math.inf, "max_tokens"
    return False


def _drawn(members: list[Particle], choices: Choices, twist: npt.NDArray[np.float64] | None,
           generator: np.random.Generator, request: GenRequest, backend: Backend
           ) -> list[tuple[Particle, int]]:
    """A path's particles each take a token (spread's draws, with the look's `twist` where it
    looked; _step): those whose value goes on, with the choice each took."""
    going = []
    for p, (pick, log_importance) in zip(members, spread(
            choices.weights, len(members), generator, twist), strict=True):
        if _step(p, choices, pick, log_importance, request, backend):
            going.append((p, pick))
    return going


@dataclass(frozen=True, slots=True)
class Ahead:
    """What a look ahead found at a path (_looked): per choice, the share of the model's
    mass the particle would be allowed at the next step (`twist`: 1 where the value ends
    with it, 0 at a dead end), and, for each choice it fed, its KV cache and logits."""

    twist: npt.NDArray[np.float64]
    fed: dict[int, tuple[KVCache, npt.NDArray[np.float32]]]


@dataclass(slots=True)
class Looks:
    """A step's look ahead before its forward (_look_rows): for each path that looks, the
    twist so far (0 where a token ends the value where it cannot) and its going tokens (each
    choice's index and the particle after it), and the rows that feed those tokens."""

    plans: dict[tuple[int, ...], tuple[npt.NDArray[np.float64], list[tuple[int, Particle]]]]
    rows: list[tuple[list[int], KVCache]]


def _look_rows(session: Session, base: KVCache, stepping: dict[tuple[int, ...], list[Particle]],
               at: dict[tuple[int, ...], Choices], request: GenRequest) -> Looks:
    """Where several particles stand on a path, each token they may propose is fed (rows of
    the step's forward, with the tokens of the paths that do not look) and the next step's
    choices computed after it (_looked, kept in `known.ahead` for that step), so that they
    draw by what the token leads to as well (spread's twist). After "A" in the 2,400
    sentences of bench/faithfulness.py the model's " big" is 0.07 of the adjectives' mass,
    but "A big" is 0.68 of the conditional: after " big" a noun's first token is 0.32 of the
    model's mass, after " small" 0.017, and p × that share gives " big" 0.43 (SmolLM2 on
    llama.cpp). The look feeds the tokens no particle takes too: at most LOOK_ROWS rows for
    each particle on the path, which the particles that take a token then go on from (their
    row is not fed again). Measured: docs/language.md §14.8."""
    looks = Looks({}, [])
    if not LOOKAHEAD:
        return looks
    backend = session.backend
    for path, members in stepping.items():
        choices = at[path]
        if len(members) < 2 or len(choices.tokens) < 2 or choices.log_share == -math.inf:
            continue
        twist = np.ones(len(choices.tokens))
        going: list[tuple[int, Particle]] = []
        first = members[0]
        for k, token in enumerate(choices.tokens.tolist()):
            if token in choices.stops:
                continue
            after = Particle(first.cursor.copy(), first.logits, None, list(first.tokens),
                             ends=list(first.ends))  # its cache and logits: the look's row
            after.cursor.advance(token)
            after.take(token, 0.0, len(backend.vocabulary.token_bytes[token] or b""))
            if _goes_on(after, request):
                going.append((k, after))
            elif not after.cursor.can_end():
                twist[k] = 0.0  # as _step: a value that must end here and cannot is dead
        if not going or len(going) > LOOK_ROWS * len(members):
            continue
        looks.plans[path] = (twist, going)
        looks.rows.extend(([after.tokens[-1]], (first.cache or base).fork())
                          for _, after in going)
    return looks


def _looked(looks: Looks, logits: list[npt.NDArray[np.float32]], request: GenRequest,
            backend: Backend, eos: frozenset[int], boundary: tuple[int, ...], known: Known
            ) -> dict[tuple[int, ...], Ahead]:
    """Each looking path's Ahead from its rows' logits (`logits`, in `looks.rows`' order):
    the choices after each token it may propose, their share of the model's mass as the
    token's twist, and the row each token's particles go on from."""
    found: dict[tuple[int, ...], Ahead] = {}
    fed = iter(zip(looks.rows, logits, strict=True))
    for path, (twist, going) in looks.plans.items():
        caches: dict[int, tuple[KVCache, npt.NDArray[np.float32]]] = {}
        for k, after in going:
            (_, cache), row = next(fed)
            after.cache, after.logits = cache, row[-1]
            choices = _choices(after, request, backend, eos, boundary, known)
            known.ahead[tuple(after.tokens)] = choices
            twist[k] = math.exp(choices.log_share)
            caches[k] = (cache, row[-1])
        found[path] = Ahead(twist, caches)
    return found


LOOKAHEAD = True
"""Whether particles on a shared path look one token ahead before they draw (_look_rows)."""
LOOK_ROWS = 2
"""The most rows a look ahead feeds for each particle on the path: a path of 8 particles
looks where it may propose at most 16 tokens that go on."""


def _finish_jobs(paths: list[tuple[list[Particle], list[Ending]]], base: KVCache) -> TreeJobs:
    """The trees that score each finishing path's endings on the path's cache (in batches of
    at most runtime/select.py TREE_NODES nodes: _finish_exactly)."""
    jobs = []
    for particles, endings in paths:
        first = particles[0]
        jobs.append((ending_rows(endings, len(first.tokens)), log_softmax(first.logits),
                     first.cache if first.cache is not None else base))
    return TreeJobs.of(jobs)


def _finish_exactly(session: Session, paths: list[tuple[list[Particle], list[Ending]]],
                    finish: TreeJobs, scored: tuple[list[list[list[float]]], int, int],
                    generator: np.random.Generator, likeliest: bool = False) -> None:
    """Finish each path's particles as sampler="exact" fills a hole: every way the value can
    end from there (each path's endings: each rest in its canonical tokenization, with the
    mass of ending where it could go on) scored in tree forwards on the path's cache
    (_finish_jobs' trees, `scored` their token log-probabilities, nodes fed and forwards:
    TreeJobs.scored; the first batch of them fed with the step's rows), each particle's
    weight times their total probability, each drawing one of them by its probability (or,
    `likeliest`, at the hole's temperature 0, taking the likeliest: choose_particle). A
    particle so finished draws its rest from the model's conditional itself, which adds no
    variance to the weights (Rao-Blackwellisation), where the token-by-token proposal's
    weights vary with every token (TAIL_BYTES says what it gained). Nothing of the trees
    stays: the chosen particle's rest is appended to the context and fed with what follows
    (as a select scored in parts)."""
    by_job, fed, _ = scored
    session.stats.rollback_tokens += fed
    token_bytes = session.backend.vocabulary.token_bytes
    for (particles, endings), (_, logprobs_first, _), token_logprobs in zip(
            paths, finish.jobs, by_job, strict=True):
        start = len(particles[0].tokens)
        weights = np.array(ending_weights(endings, token_logprobs, logprobs_first, start))
        total = float(np.logaddexp.reduce(weights))
        if total == -math.inf:
            for particle in particles:
                particle.log_weight, particle.finish = -math.inf, "eos"
            continue
        probs = np.exp(weights - total)
        rests = [(ending.text, float(q)) for ending, q in zip(endings, probs, strict=True)]
        for particle in particles:
            particle.rests = rests
            chosen = int(np.argmax(probs)) if likeliest else draw(probs, generator)
            ending = endings[chosen]
            particle.log_weight += total
            particle.finish = ending.finish
            if len(ending.tokens) > start:
                row = token_logprobs[row_of(endings, chosen, start)]
                for token, logprob in zip(ending.tokens[start:], row, strict=True):
                    particle.take(token, logprob, len(token_bytes[token] or b""))


def _small_tail(session: Session, request: GenRequest, particle: Particle, share: int,
                boundary: tuple[int, ...]) -> list[Ending] | None:
    """The ways to end the particle's value (exact.tail_endings; `boundary` the next text's
    first tokens, follow_of's: asked once per hole) where the `share` particles
    on its path can afford them: a walk of `share` × TAIL_BYTES finds them all and scoring
    them feeds at most `share` × TAIL_NODES tree nodes; else None. The particles on a path
    pool their bounds because they are finished together, by one tree: a hole's finishes then
    feed at most its particles × TAIL_NODES nodes, as when each particle finished its own."""
    endings = tail_endings(session, request, particle.cursor, particle.tokens,
                           share * TAIL_BYTES, boundary)
    if endings is None:
        return None
    rows = ending_rows(endings, len(particle.tokens))
    return endings if len(OptionTree.build(rows).fed) <= share * TAIL_NODES else None


TAIL_NODES = 24
"""The most tree nodes (tokens fed: runtime/select.py OptionTree) that scoring a particle's
rests may take for it to be finished exactly (_finish_exactly), for each particle on its path
(_small_tail: they are finished by one tree, so 16 particles at the start of a hole may score
a tree of 384 nodes, the whole language where it is that small); a path whose tree is larger
takes its next token by the proposal and is asked again after it. The cost it bounds is the
forward's: a node costs what a prompt token does (on transformers here about 3 ms; on
llama.cpp about a row of a step's batch, 3.4-5 ms on 2 AVX2 cores: issue #37). Measured
(bench/faithfulness.py, 16 particles, transformers, 80 runs, seconds a sample on fresh
prompts where masking took 0.19-0.24 s): on "(The|A|One|My) (big|...) (cat|...)
(sleeps|...)." (600 sentences, 988 nodes), at 64 the whole language was scored at the first
step, 0.000 from the conditional at 3.85 s (19 times masking); at 32, 0.018 at 1.38 s; at 24,
0.022 at 1.47 s. With a fifth word (2,400 sentences): at 32, 0.050 at 1.96 s; at 24, 0.069 at
1.42 s (a path of one particle, whose last two words are 27 nodes, goes on by the proposal;
24 rather than 32 for that: 1.96 s is 9 times masking). Times of day "HH:MM" (1,440, about
200 nodes) are scored whole at every bound from 16 up. Why a tree and not only the last
word: a path the proposal seldom takes but the conditional favours ("A lazy" then "fish
eats.") is weighed by its whole rest once one particle reaches it (docs/language.md §14.8)."""
TAIL_BYTES = 256
"""The most nodes of the byte trie of a particle's rests (walked a byte at a time, each a
step of the constraint's cursor) for it to be finished exactly, for each particle on its
path: the minutes after an hour are 67 (a bound of 64 left them out), the nouns and verbs
after an adjective about 200."""
class Known:
    """What a hole's particles ask again and again: which tokens spell their values as the
    tokenizer would (`spellings`: runtime/spelling.py), what is left of the language after a
    path (`tails`) and the choices after a path a look ahead fed (`ahead`)."""

    def __init__(self, backend: Backend) -> None:
        self.spellings = Spellings(backend)
        # the endings left after a path where they are few (exact.tail_endings), else None
        self.tails: dict[tuple[int, ...], list[Ending] | None] = {}
        # the choices after a path that a look ahead fed (_looked), until a step takes them
        self.ahead: dict[tuple[int, ...], Choices] = {}


def _goes_on(particle: Particle, request: GenRequest) -> bool:
    """Whether the particle's value may go on past its last token, so that token needs
    feeding (_step; _look_rows feeds the same tokens); else it ends there."""
    return particle.cursor.can_continue() and request.max_tokens - _spent(particle, request) > 0


def _spent(particle: Particle, request: GenRequest) -> int:
    """The particle's tokens that count against max_tokens (the healed text's are free)."""
    return sum(1 for end in particle.ends if end > len(request.prefix))


@dataclass(slots=True)
class Feeding:
    """The rows that feed particles' last tokens (_feed_rows), and who shares each row."""

    groups: list[list[Particle]]
    rows: list[tuple[list[int], KVCache]]

    def take(self, logits: list[npt.NDArray[np.float32]]) -> None:
        """Each row's cache and logits to the particles that share it."""
        for members, (_, cache), row in zip(self.groups, self.rows, logits, strict=True):
            for particle in members:
                particle.cache, particle.logits = cache, row[-1]


def _feed_rows(base: KVCache, particles: list[Particle], everyone: list[Particle]) -> Feeding:
    """The rows that feed each of `particles`' last token: one row per distinct path, since
    particles with the same tokens (copies that resampling made, or particles that drew
    alike) share one KV cache and one set of logits, and the model is asked each question
    once. A cache no other particle of `everyone` holds goes on in place; one that others hold
    too is forked (copy on write: the cells written so far are shared, KVCache.fork)."""
    holders = collections.Counter(id(p.cache) for p in everyone if p.cache is not None)
    feeding = collections.Counter(id(p.cache) for p in particles if p.cache is not None)
    groups: dict[tuple[int, int], list[Particle]] = {}
    for particle in particles:
        key = (id(particle.cache) if particle.cache is not None else 0, particle.tokens[-1])
        groups.setdefault(key, []).append(particle)
    rows: list[tuple[list[int], KVCache]] = []
    in_place: set[int] = set()
    for (source_id, token), members in groups.items():
        source = members[0].cache
        if source is not None and holders[source_id] == feeding[source_id] \
                and source_id not in in_place:  # no one else holds it: the first goes on in it
            in_place.add(source_id)
            rows.append(([token], source))
        else:  # forked before the batch runs: the fork holds what the source holds now
            rows.append(([token], (source or base).fork()))
    return Feeding(list(groups.values()), rows)


def resampled(particles: list[Particle], generator: np.random.Generator, threshold: float
              ) -> list[Particle]:
    """The particles, the unfinished ones resampled (systematic) when their effective sample
    size, (Σw)² / Σw², is below `threshold` of their number (the hole's ess_threshold: 0
    never, 1 whenever their weights differ): each drawn by weight, every one of them then
    weighing their mean, so their total stays; finished ones stay as they are.

    Finished particles stay out: their weights are whole while an unfinished one's still owes
    its ending's probability. On "The cat runs." against "The cat sleeps.", resampling one token
    before the second's full stop (log-probability -4.65) weighed "runs." with its full stop
    paid (-5.1) against "sleeps" without, dropped nearly every "runs." particle, and 64
    particles gave "The cat sleeps." 0.80 where its conditional is 0.70 (0.69 without)."""
    live = [i for i, p in enumerate(particles) if p.finish is None]
    weights = np.array([particles[i].log_weight for i in live])
    if len(live) < 2 or not np.isfinite(weights).any():
        return particles
    normalized, mean = normalised(weights)
    if 1.0 / float((normalized ** 2).sum()) >= threshold * len(live):
        return particles
    points = (generator.random() + np.arange(len(live))) / len(live)
    picks = systematic(normalized, points).tolist()
    for k in set(range(len(live))) - set(picks):
        particles[live[k]].cache = None  # its KV goes before the copies take theirs
    taken: set[int] = set()
    drawn = []
    for k in picks:
        particle = particles[live[k]] if k not in taken else particles[live[k]].copy()
        taken.add(k)
        particle.log_weight = mean
        drawn.append(particle)
    return [p for p in particles if p.finish is not None] + drawn


def normalised(log_weights: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], float]:
    """Particles' log-weights (some finite) as weights summing to 1, and the log of their
    mean: the particles' estimate of the evidence (unbiased for the evidence itself)."""
    top = float(log_weights.max())
    w = np.exp(log_weights - top)
    return w / w.sum(), top + math.log(float(w.mean()))


def choose_particle(weights: npt.NDArray[np.float64], temperature: float,
                    generator: np.random.Generator,
                    value_weights: Sequence[float] | None = None) -> int:
    """The particle that gives the value (a hole's, a block's): drawn by weight; at
    temperature 0 one whose value the particles weigh most (`value_weights`: each particle's
    value's summed weight, their estimate of its probability; else its own), the heaviest of
    those, the first on ties: particles that drew alike are one value, which can outweigh a
    lone heavier particle (the estimate's mode, as sampler="exact" takes the likeliest)."""
    if temperature == 0.0:
        by = weights if value_weights is None else value_weights
        live = np.flatnonzero(np.isfinite(weights)).tolist()
        return int(max(live, key=lambda i: (by[i], weights[i])))
    return draw(np.exp(weights - weights.max()), generator)


def _commit(session: Session, base: KVCache, chosen: Particle) -> None:
    """The chosen particle's tokens into the context: those it fed keep its cache (no
    position is fed twice), a last token it did not feed is appended to be fed next."""
    fed = 0 if chosen.cache is None else chosen.cache.length() - base.length()
    if fed:
        assert chosen.cache is not None
        session.extend_fed(chosen.tokens[:fed], chosen.cache, chosen.logits)
    session.append_tokens(chosen.tokens[fed:])
