"""The one place a run's strategies are chosen from what its backend declares (backends/base.py):
which hole filler fills `gen` holes (the local sampling loop or a server replay), how `select`
scores its options, and which step model the session feeds. Chosen once when the run starts;
the executor only ever talks to these."""

from __future__ import annotations

from dataclasses import dataclass

from qrun.backends.base import Backend, HoleSampler, StepModel, TreeScorer
from qrun.runtime.generate import LocalFiller
from qrun.runtime.hole import HoleFiller
from qrun.runtime.remote import ServerFiller
from qrun.runtime.select import PromptScoring, Scoring, TreeScoring


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
    return Engines(model, filler, scoring, heals)
