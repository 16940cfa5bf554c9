"""The one place a run's strategies are chosen from what its backend declares (backends/base.py):
which hole filler fills `gen` holes (the local sampling loop or a server replay), how `select`
scores its options, and which step model the session feeds. Chosen once when the run starts;
the executor only ever talks to these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from qrun.backends.base import Backend, HoleSampler, StepModel, TreeScorer
from qrun.runtime.exact import LanguageTooLarge, fill_exact
from qrun.runtime.generate import LocalFiller
from qrun.runtime.hole import GenRequest, HoleFailure, HoleFiller
from qrun.runtime.particles import fill_particles
from qrun.runtime.remote import ServerFiller
from qrun.runtime.result import GenRecord
from qrun.runtime.select import PromptScoring, Proposal, Scoring, TreeScoring
from qrun.runtime.session import Session


@dataclass(frozen=True, slots=True)
class Engines:
    """What one run uses of its backend. `model` is None where the backend samples whole
    holes (nothing is fed token by token); `filler` is None where it can do neither (a
    tokenizer without weights: a `gen` hole then fails at its span); `scoring` is None where
    it cannot score select options (a select then fails at its span)."""

    model: StepModel | None
    filler: HoleFiller | None
    scoring: Scoring | None
    heals_in_context: bool
    # A `{% particles %}` block's particle draws the values it scores whole from its block's
    # proposal (runtime/particle_block.py Strata); None: from their probabilities.
    proposal: Proposal | None = None
    # The run's tree scorer (through its scheduler in a batch), where the backend has one:
    # sampler="smc" finishes a particle with it once the language left is small.
    tree: TreeScorer | None = None

    def fill(self, session: Session, request: GenRequest,
             on_text: Callable[[str], None] | None) -> GenRecord:
        """Fill a `gen` hole: under the mask by the filler; with sampler="exact", scored whole
        as select scores its options (runtime/exact.py); with sampler="smc", by particles
        (runtime/particles.py).

        Raises:
            HoleFailure: the hole cannot be filled legally, or not on this backend.
        """
        record = None
        sampler = request.sampler
        if sampler == "auto":
            # A `{% particles %}` block's constrained hole that names no sampler
            # (runtime/particle_block.py): scored whole where its language is small enough,
            # which weighs the block's particle exactly, else drawn by the particle itself.
            record, sampler = self._exact_if_small(session, request), "smc"
        if record is None and sampler == "exact":
            if self.scoring is None:
                raise HoleFailure('sampler="exact" needs a backend that scores token '
                                  "sequences, and this one cannot")
            record = fill_exact(session, request, self.scoring, proposal=self.proposal)
        elif record is None and sampler == "smc":
            if self.model is None:
                raise HoleFailure('sampler="smc" needs token-level forwards, and this backend '
                                  "samples whole holes (a vLLM server): use a local model")
            record = fill_particles(session, request, self.model, self.tree)
        if record is not None:
            if on_text is not None:
                on_text(record.text)
            return record
        assert self.filler is not None, "the executor checks for a filler first"
        return self.filler.fill(session, request, on_text)

    def _exact_if_small(self, session: Session, request: GenRequest) -> GenRecord | None:
        """The hole scored whole (sampler="exact"), every tokenization where they are at most
        BLOCK_TREE_LIMIT token-tree nodes, else each value's canonical one; None where its
        language is too large for that (found before any model work) or the backend cannot
        score."""
        if self.scoring is None:
            return None
        try:
            return fill_exact(session, request, self.scoring, BLOCK_TREE_LIMIT, self.proposal)
        except LanguageTooLarge:
            return None


BLOCK_TREE_LIMIT = 64
"""A particles block's small holes score every tokenization only where they are this few
token-tree nodes (exact.TREE_LIMIT is 1,024): the block's particles each score their holes,
and on llama.cpp "(The cat|The dog|A bird)" in all its spellings made 12 runs of 8 particles
take 68 s where its 3 canonical spellings take 6 (measured, 2 cores)."""


def choose_engines(
    backend: Backend, model: StepModel | None = None, tree_scorer: TreeScorer | None = None,
    sampler: HoleSampler | None = None,
) -> Engines:
    """The engines of a run on `backend`; `model`, `tree_scorer` and `sampler` replace the
    backend's own (batched runs route them through their scheduler; a server's runs check
    their cancellation in them, runtime/runner.py). A backend with neither token-level
    forwards nor hole sampling (a tokenizer only) gets no filler: templates without holes
    still run on it."""
    model = model or backend.step_model()
    filler: HoleFiller | None = None
    if model is not None:
        filler = LocalFiller()
    else:
        sampler = sampler or backend.hole_sampler()
        if sampler is not None:
            filler = ServerFiller(sampler)
    scoring: Scoring | None = None
    tree = tree_scorer or backend.tree_scorer()
    prompts = backend.prompt_scorer()
    if tree is not None:
        scoring = TreeScoring(tree)
    elif prompts is not None:
        scoring = PromptScoring(prompts)
    heals = backend.capabilities.heals_in_context and model is not None
    return Engines(model, filler, scoring, heals, tree=tree)
