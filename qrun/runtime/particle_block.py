"""`{% particles N %}...{% endparticles %}` (docs/language.md §23.5, issue #40): the block's
body runs as N particles and one of them goes on, so that the holes inside it are drawn
together from the model's conditional: a later hole's constraint corrects an earlier hole's
choice, which holes sampled one at a time cannot do.

Each particle is a branch of the run, as a fork's are (runtime/branches.py: the context fed
once, each particle's KV cache a fork of it, their forwards rows of one batch through the
run's scheduler), with its own random generator from the run's. Its holes are drawn from the
model's own distribution at temperature 1: a constrained gen that names no sampler scored
whole where its language is small (runtime/engines.py, "auto": its weight is then exact),
else by sampler="smc" with one particle (the block's particle: runtime/particles.py), or by
the sampler it names ("exact", or "smc" with particles of its own); a select from its
options' probabilities, a free gen as the model writes it; lang/args.py weighing_conflict
refuses what would change that. The values of a hole scored whole (a small language, a
select) are drawn by the block's particles together (Strata: systematically, every value
given a particle where there are enough), each draw weighed by its importance p/q. A
particle's log-weight is the sum over its holes of what each hole's constraint kept of the
model's probability given what came before: a gen record's `log_evidence` (exact's
log P(language), or one particle's own weight), a select's log of its options' total
probability, 0 for a free gen or a known value; plus each draw's `log_importance`. So the
particles are weighted towards

    p(x_1 .. x_k) ∝ Π_i P_model(x_i | context, fixed text, x_<i) · 1[x_i ∈ L_i]

(the fixed text between the holes is given, not observed: its own probability is not
weighed). They are weighed, not resampled between holes: a particle is a template being run
(a thread's stack, its scope, its captures), which cannot be copied half way; each smc hole
resamples its own particles. A particle whose hole fails (no value within max_tokens, the
context full: DEAD_ENDS) weighs 0, and the block fails only when every particle has; any other
failure fails the run.

The particle that goes on is drawn by weight from the run's generator (at the run's
temperature 0, one with the captures the particles weigh most: choose_particle): its
captures, `set`s, text and context (its tokens and KV cache) are the run's after the block.
Every particle's values and weight and the log of the estimate of the block's evidence (the
mean weight) go into the trace (Recorder.blocks), which Result.particle_blocks reads."""

from __future__ import annotations

import json
import math
import threading
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import numpy as np

from qrun.errors import ContextTooLong, EvaluationError, GenerationError, ValueCutOff
from qrun.lang import ir
from qrun.lang.args import count_problem
from qrun.limits import SharedBudget
from qrun.options import reshaping
from qrun.runtime.branches import SEED_RANGE, Branch, add_stats, drive, pay, share
from qrun.runtime.contexts import BlockRun, join_calls, mark_holes, reported_at
from qrun.runtime.engines import Engines
from qrun.runtime.particles import (
    choose_particle,
    normalised,
    stratified_proposal,
    systematic,
)
from qrun.runtime.recorder import HoleEntry, ParticleBlock, Recorder
from qrun.runtime.sampler import log_normalizer
from qrun.runtime.scheduler import ScheduledModel
from qrun.runtime.select import Commit, Scoring
from qrun.runtime.session import Session
from qrun.runtime.stats import Stats


def exec_particles(run: BlockRun, op: ir.Particles) -> None:
    """Run `op.body` as particles and go on with one of them (see the module)."""
    count = _count(run, op)
    if run.options.in_particles:  # a macro's block, called in a block: the compiler saw neither
        raise EvaluationError("a '{% particles %}' block cannot run inside another: its "
                              "particles already weigh every hole inside it", op.span,
                              run.source)
    option = reshaping(run.options)
    if option is not None:
        raise EvaluationError(f"a '{{% particles %}}' block cannot be used with the run's "
                              f"{option}: its particles draw from the model's own "
                              "distribution", op.span, run.source)
    tail = share(run, op.span)
    start = len(run.session.token_ids)
    base = int(run.generator.integers(SEED_RANGE))
    particles = [Branch(index, None) for index in range(count)]
    steps, output = run.budget.steps_left, run.budget.output_left
    shared = None if run.in_branch else SharedBudget(steps, output)

    memo = ScoreMemo()

    def one(particle: Branch, engines: Engines) -> None:
        if engines.scoring is not None:  # the particles ask the same questions: once each
            engines = replace(engines, scoring=memo.scoring(engines.scoring))
        engines = replace(engines, proposal=Strata(base, particle.index, count))
        _run_particle(run, op, particle, engines, base, tail, shared)

    try:
        if run.in_branch:  # one after the other in this branch's thread (as exec_fork does)
            for particle in particles:
                one(particle, run.engines)
        else:
            drive(run, particles, one)
        _choose_and_go_on(run, op, particles, start)
    finally:  # their KV caches go now, the chosen one's context having been taken over
        for particle in particles:
            if particle.child is not None:
                particle.child.session.close()
    for particle in particles:  # every particle's work is the run's (closed: counted whole)
        if particle.child is not None:
            add_stats(run.stats, particle.child.stats)
            if not run.in_branch:
                pay(run, op.span, particle.child, steps, output)


def _choose_and_go_on(run: BlockRun, op: ir.Particles, particles: list[Branch], start: int
                      ) -> None:
    """Weigh the particles, draw the one that goes on and go on with it (_go_on); the first
    error that is not a failed hole fails the run, and so does every particle failing."""
    weights = np.array([_log_weight(p) for p in particles])
    for particle in particles:  # an error other than a dead end fails the run
        if particle.error is not None and not isinstance(particle.error, DEAD_ENDS):
            with reported_at(run, op.span):  # a backend's own error, at the block
                raise particle.error
    if not np.isfinite(weights).any():
        failed = next((p.error for p in particles if p.error is not None), None)
        if failed is not None:
            raise failed
        raise GenerationError("every particle of the block weighs 0: no particle's values "
                              "fit its holes' constraints", op.span, run.source)
    # In source order: a capture the block binds first comes first in the run's vars.
    names = list(dict.fromkeys(o.name for o in ir.walk(op.body)
                               if isinstance(o, ir.Gen | ir.Select)))
    captures = [{name: p.child.vars[name] for name in names if name in p.child.vars}
                if p.child is not None else {} for p in particles]
    temperature = run.options.temperature
    chosen = choose_particle(weights, temperature, run.generator,
                             _value_weights(captures, weights) if temperature == 0.0 else None)
    _go_on(run, op, particles, chosen, start, weights, captures)


def _value_weights(captures: list[dict[str, Any]], weights: np.ndarray) -> list[float]:
    """For each particle, the summed weight of the particles whose captures are its own
    (choose_particle at temperature 0: particles that drew alike are one value)."""
    shares, _ = normalised(weights)
    keys = [json.dumps(values, sort_keys=True, default=repr) for values in captures]
    totals: dict[str, float] = {}
    for key, weight in zip(keys, shares, strict=True):
        totals[key] = totals.get(key, 0.0) + float(weight)
    return [totals[key] for key in keys]


DEAD_ENDS = (ValueCutOff, ContextTooLong)
"""A particle's failures that weigh it 0: its values led where no value of a hole fits within
max_tokens, or past the context's end. Anything else (a backend failing, llama.cpp out of
sequences) fails the run: weighing such a particle 0 would bias the block silently."""


def _count(run: BlockRun, op: ir.Particles) -> int:
    """The block's number of particles, held to what a hole's particles= is held to."""
    value = run.evaluate(op.count)
    problem = count_problem(value)
    if problem is not None:
        raise EvaluationError(problem, op.count.span, run.source)
    return int(value)


def _run_particle(parent: BlockRun, op: ir.Particles, particle: Branch, engines: Engines,
                  base: int, tail: str, shared: SharedBudget | None) -> None:
    """Run the block's body as one particle to its end in the calling thread; its error
    (its context's fork's too: llama.cpp out of sequences) is kept, not raised. `tail` is
    the shared context's last text (Session.share)."""
    try:
        child = particle.child = _particle_run(parent, op, particle.index, engines, base, tail)
        if shared is not None:
            child.budget.shared = shared
        child.exec_block(op.body)
    except BaseException as exc:  # exec_particles decides what it means
        particle.error = exc


def _particle_run(parent: BlockRun, op: ir.Particles, index: int, engines: Engines, base: int,
                  tail: str) -> BlockRun:
    """A particle's run: a branch of `parent` (its context forked), its holes weighed."""
    stats = Stats()
    recorder = Recorder(parent.recorder.vocab, parent.recorder.detailed)
    session = parent.session.fork(engines.model, stats, recorder)
    session.append_text(tail)
    child = parent.branch(session, engines, stats, recorder,
                          np.random.default_rng([base, index]), frozenset())
    options = parent.options
    # A constrained hole that names no sampler: "exact" where the run says so, else "auto"
    # (runtime/engines.py: exact where its language is small, else this particle's own draw).
    child.options = replace(options, temperature=1.0, in_particles=True,
                            sampler="exact" if options.sampler == "exact" else "auto",
                            particles=1)
    for op_, _ in ir.holes(op.body, parent.source):
        if op_.in_loop:  # a loop's captures: this particle's own lists from here on
            name = op_.name
            child.vars[name] = child.scope[name] = list(parent.vars[name])
            child.hole_lists[name] = list(parent.hole_lists[name])
            child.endings[name] = list(parent.endings[name])
    return child


def _log_weight(particle: Branch) -> float:
    """The particle's log-weight: what its holes' constraints kept of the model's
    probability (see the module); -inf for one that failed."""
    if particle.error is not None or particle.child is None:
        return -math.inf
    return sum(_hole_weight(hole) for hole in particle.child.recorder.holes)


def _hole_weight(hole: HoleEntry) -> float:
    """The hole's term of its particle's log-weight: what its constraint kept of the model's
    probability, and the importance of a value the block's proposal drew (Strata)."""
    if hole.finish == "filled":
        return 0.0  # a known value is given text, as the fixed text is
    if hole.kind == "select":
        assert hole.options is not None, "a select the model filled records its options"
        kept = log_normalizer(np.array([logprob for _, logprob, _ in hole.options]))
    else:
        # The samplers that weigh give log_evidence; lang/args.py weighing_conflict leaves
        # only free holes without one, whose values the model wrote as it would (weight 1).
        kept = hole.log_evidence if hole.log_evidence is not None else 0.0
    return kept + hole.log_importance


def _go_on(run: BlockRun, op: ir.Particles, particles: list[Branch], chosen: int, start: int,
           weights: np.ndarray, captures: list[dict[str, Any]]) -> None:
    """The chosen particle's context, captures (`captures[chosen]`: each particle's are in
    `captures`), `set`s and text become the run's; every particle's holes and host calls join
    the run's, and the block's record its trace."""
    winner = particles[chosen].child
    assert winner is not None, "a particle with a weight ran"
    run.session.adopt(winner.session)
    for name in captures[chosen]:
        run.vars[name] = run.scope[name] = winner.vars[name]
        run.endings[name] = winner.endings[name]
        if name in winner.hole_lists:
            run.hole_lists[name] = winner.hole_lists[name]
        if name in winner.holes:
            run.holes[name] = winner.holes[name]
    for name in {o.name for o in ir.walk(op.body) if isinstance(o, ir.Set)}:
        if name in winner.scope:
            run.scope[name] = winner.scope[name]
    for piece in winner.pieces:
        run.show(piece)
    shares, log_evidence = normalised(weights)
    for particle in particles:
        if particle.child is None:
            continue
        where = f"particle {particle.index + 1} of {len(particles)}"
        if particle.index == chosen:
            run.recorder.adopt(particle.child.recorder, start)
        else:
            first = len(run.recorder.holes)
            run.recorder.holes.extend(particle.child.recorder.holes)
            mark_holes(run.recorder, first, f"{where} (not chosen, weight "
                                            f"{shares[particle.index]:.3g})")
        join_calls(run.recorder, particle.child.recorder, where)
    run.recorder.blocks.append(ParticleBlock(
        op.span.line, op.span.column,
        captures,
        [float(w) for w in shares],
        [None if p.error is None else str(p.error) for p in particles],
        chosen, log_evidence))


class ScoreMemo:
    """The block's particles start from one context, and those that drew alike stand in the
    same one: a small hole scored whole (or a select) asks the same question in each. The
    first particle to ask scores the rows; the others with the same context and rows wait for
    its answer (out of the run's batch while they wait: ScheduledModel.aside) and append the
    row they draw, fed with what follows, instead of scoring the tree again."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answers: dict[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]],
                           Future[list[list[float]]]] = {}

    def scoring(self, inner: Scoring) -> Scoring:
        return _Remembered(self, inner)


class _Remembered:
    """A particle's Scoring through the block's ScoreMemo."""

    def __init__(self, memo: ScoreMemo, inner: Scoring) -> None:
        self.memo, self.inner = memo, inner

    def score(self, session: Session, rows: list[list[int]]
              ) -> tuple[list[list[float]], Commit]:
        session.settle()  # the context's text tokenized: what the key holds
        key = (tuple(session.token_ids), tuple(tuple(row) for row in rows))
        with self.memo.lock:
            answer = self.memo.answers.get(key)
            first = answer is None
            if answer is None:
                answer = self.memo.answers[key] = Future()
        if first:
            try:
                logprobs, commit = self.inner.score(session, rows)
            except BaseException as exc:
                answer.set_exception(exc)
                raise
            answer.set_result(logprobs)
            return logprobs, commit
        model = session.model
        with model.aside() if isinstance(model, ScheduledModel) else nullcontext():
            logprobs = answer.result()
        return logprobs, lambda chosen: session.append_tokens(rows[chosen])


class Strata:
    """How a particle draws the values of a hole its block scores whole (a small language, a
    select: runtime/select.py Proposal). Drawn from the values' probabilities p alone, a value
    that p makes rare but a later hole needs (the first hole says Paris, only Marseille leads
    anywhere) is one no particle tries, and weighing cannot bring back what was never drawn.
    So the block's particles draw together, systematically: the k-th such draw of particle i
    of N is at (U_k + i) / N of the proposal's cumulative distribution, U_k uniform and the
    same in every particle (from the block's seed), which spreads the particles that stand in
    the same context over the values as evenly as the proposal allows; and where the block
    has at least twice as many particles as the hole has values, the proposal gives every
    value a particle (runtime/particles.py stratified_proposal, as particles on one path draw
    their next tokens). The importance weight p/q (at most 2) goes into the particle's
    weight: each particle's draw is still distributed as q, so the weighted particles
    estimate the same conditional.

    Measured (bench/faithfulness.py city-2, llama.cpp: "(Paris|Lyon|Marseille)", then
    " Hilton." only after Paris; Lyon or Marseille 0.036 of the first hole alone, 0.999 of
    both): drawn from p, 16 and 64 particles were 0.51 and 0.067 from the conditional over
    both holes; so, 0.014 and 0.004."""

    def __init__(self, base: int, index: int, count: int) -> None:
        self.uniforms = np.random.default_rng([base, STRATA_STREAM])
        self.index, self.count = index, count

    def draw(self, scores: list[float]) -> tuple[int, float]:
        shift = float(self.uniforms.random())  # drawn first: the k-th in every particle
        logp = np.array(scores, dtype=np.float64)
        if not np.isfinite(logp.max()):
            return int(logp.argmax()), 0.0  # no value has probability: the particle weighs 0
        logp -= logp.max()
        logp -= math.log(float(np.exp(logp).sum()))
        q = stratified_proposal(np.exp(logp), self.count)
        chosen = int(systematic(q, np.array([(shift + self.index / self.count) % 1.0]))[0])
        return chosen, float(logp[chosen] - math.log(q[chosen]))


STRATA_STREAM = 2**31 - 1
"""The second entropy word of a block's shared uniforms (a particle's own generator has its
index there, at most 63)."""
