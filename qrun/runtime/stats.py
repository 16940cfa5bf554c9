"""Counters a run reports (docs/language.md §15): what was fed through the model, what came from a
cache, what was rolled back, and where the time went."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class Stats:
    """Per-run counters. Token counts are exact; times are wall-clock seconds.

    context_tokens: final context length (every token the template produced, fixed or generated)
    prompt_tokens: tokens of fixed text appended (interpolations, roles and healing included)
    generated_tokens: tokens sampled by the model for holes (EOS excluded)
    forward_tokens: sum of input lengths over every model forward (a batched forward counts
        every row's tokens, padding excluded)
    forward_calls: number of model forwards
    cached_tokens: positions whose KV came from the prefix cache instead of a forward
    cached_logits: next-token distributions served by the prefix cache (no forward at all)
    rollback_tokens: positions dropped from the KV cache after being computed
    forced_tokens: tokens appended without sampling because a constraint allowed only them
    healed_tokens: fixed-text tokens taken back before a hole by token healing
    boundary_kept: holes whose last token ran into the next fixed text and was kept, because
        that text begins with exactly those bytes (a constrained hole that ended by beginning
        that text counts here too)
    boundary_dropped: holes whose tokens past the value were taken back instead (counted in
        rollback_tokens too when they had already been fed)
    drafted_tokens: tokens guessed by speculation and fed with a step's forward
    accepted_tokens: drafted tokens the model then chose (each saved a forward)
    branch_tokens: positions fed in contexts beside the run's own, which its final context
        does not hold: fork branches and fresh blocks (docs/language.md §23; a hidden block's
        are in rollback_tokens)
    filled_holes: holes given their value (`fill`, docs/language.md §16.1): fixed text, not
        generated
    seed: the run's seed (given, or drawn fresh): the same seed replays the run
    host_calls, host_s: host function calls (qrun.Functions) and the seconds they took
    wall_s, model_s, mask_s, load_s: the whole run, inside model forwards, computing masks,
        loading the model. model_s, mask_s and host_s add up each fork branch's own seconds
        (branches run at once), so with forks they may exceed wall_s, as CPU time does
    """

    context_tokens: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    forward_tokens: int = 0
    forward_calls: int = 0
    cached_tokens: int = 0
    cached_logits: int = 0
    rollback_tokens: int = 0
    forced_tokens: int = 0
    healed_tokens: int = 0
    boundary_kept: int = 0
    boundary_dropped: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    branch_tokens: int = 0
    filled_holes: int = 0
    seed: int = 0
    host_calls: int = 0
    host_s: float = 0.0
    wall_s: float = 0.0
    model_s: float = 0.0
    mask_s: float = 0.0
    load_s: float = 0.0

    @property
    def rework_tokens(self) -> int:
        """Positions computed that the final context does not hold: the template's rework
        (rollback_tokens), drafted tokens the model did not choose, and the positions of
        branches and fresh contexts (branch_tokens). A run never computes more than its
        context and these: forward_tokens <= context_tokens + rework_tokens
        (docs/language.md §14.2)."""
        return (self.rollback_tokens + self.drafted_tokens - self.accepted_tokens
                + self.branch_tokens)

    def to_dict(self) -> dict[str, int | float]:
        out: dict[str, int | float] = asdict(self)
        for key in ("wall_s", "model_s", "mask_s", "load_s", "host_s"):
            out[key] = round(float(out[key]), 6)
        return out
