"""The ideal: qrun's final token ids pushed through the bare model with plain transformers, one
forward per stretch of context between two model decisions, greedy argmax at each decision; no
masks, no template machinery. It is the physical limit for producing that same sequence.

Where the decisions are is read from the run's own hole records (`decisions_of`): each records
where its tokens begin in the context (`start`), which were forced and which lie inside a
token-healing prefix. Decisions:
- a sampled, kept token that carries value bytes;
- the end of a hole by EOS, or by the model beginning the text after it (finish `boundary`:
  the model had to be asked after the hole's last token; that token is the text's);
- a `select`: one decision at its first token, its winner fed with the text after it.
Tokens forced by a constraint (fast-forward) are fixed text, and so is a token re-sampled
inside a token-healing prefix (its bytes lie inside the text healing took back): it gives back
the template's own text (`healed=True` counts it as a decision instead)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

import qrun
from qrun.backends.transformers import cache_argument

# --- decisions ------------------------------------------------------------------------------


def decisions_of(result: qrun.Result, healed: bool = False) -> list[int]:
    """Sorted context positions before which the model decided something in `result`: a kept
    token or the end of a hole by EOS or at the next text (a position may equal
    len(token_ids)). With `healed`, tokens re-sampled inside a healed prefix count too."""
    ids = result.token_ids
    decided: set[int] = set()
    for record in result.records():
        if isinstance(record, qrun.SelectRecord):
            decided.add(record.start)
            continue
        assert isinstance(record, qrun.GenRecord)
        kept = _kept(ids, record)
        for i in range(kept):
            inside_prefix = i < record.prefix_tokens
            if not record.forced[i] and (healed or not inside_prefix):
                decided.add(record.start + i)
        if record.finish in ("eos", "boundary") and kept == len(record.token_ids):
            decided.add(record.start + kept)
    return sorted(p for p in decided if p <= len(ids))


def healed_resampled(result: qrun.Result) -> int:
    """Tokens the model was asked for inside a healed prefix (they give back fixed text)."""
    return sum(sum(1 for i in range(min(r.prefix_tokens, _kept(result.token_ids, r)))
                   if not r.forced[i])
               for r in result.records() if isinstance(r, qrun.GenRecord))


def _kept(ids: Sequence[int], record: qrun.HoleRecord) -> int:
    """How many of the hole's tokens stand in the final context (the rest were rolled back:
    an overshoot past a stop string)."""
    kept = 0
    for i, token in enumerate(record.token_ids):
        if record.start + i >= len(ids) or ids[record.start + i] != token:
            break
        kept += 1
    return kept


# --- replay ---------------------------------------------------------------------------------


@dataclass
class Replay:
    """Counters of an ideal replay."""

    wall_s: float = 0.0
    forward_calls: int = 0
    forward_tokens: int = 0
    decisions: int = 0
    argmax_agree: int = 0  # decisions where the unmasked argmax equals qrun's token

    def add(self, other: Replay) -> None:
        self.wall_s += other.wall_s
        self.forward_calls += other.forward_calls
        self.forward_tokens += other.forward_tokens
        self.decisions += other.decisions
        self.argmax_agree += other.argmax_agree

    def to_dict(self) -> dict[str, Any]:
        return {"wall_s": round(self.wall_s, 4), "forward_calls": self.forward_calls,
                "forward_tokens": self.forward_tokens, "decisions": self.decisions,
                "argmax_agree": self.argmax_agree}


def new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def replay(
    model: Any, token_ids: Sequence[int], decisions: Sequence[int],
    cache: Any = None, start: int = 0,
) -> Replay:
    """Feed token_ids[start:] as one forward per stretch ending just before a decision, on top
    of `cache` (holding token_ids[:start]; a new cache when None), and take the argmax after
    each. Text after the last decision needs no forward (qrun does not feed it either)."""
    cache = new_cache(model) if cache is None else cache
    bounds = [start] + [d for d in decisions if d > start]
    stats = Replay()
    device = model.device
    cache_kw = cache_argument(model)
    started = time.perf_counter()
    with torch.inference_mode():
        for a, b in zip(bounds, bounds[1:], strict=False):
            input_ids = torch.tensor([list(token_ids[a:b])], device=device)
            out = model(input_ids=input_ids, **{cache_kw: cache}, use_cache=True,
                        logits_to_keep=1)
            chosen = int(out.logits[0, -1].argmax())
            stats.forward_calls += 1
            stats.forward_tokens += b - a
            stats.decisions += 1
            stats.argmax_agree += b < len(token_ids) and chosen == token_ids[b]
    stats.wall_s = time.perf_counter() - started
    return stats


def replay_runs(model: Any, runs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> Replay:
    """The ideal for several runs, each on a fresh cache (qrun's runs share nothing)."""
    total = Replay()
    for token_ids, decisions in runs:
        total.add(replay(model, token_ids, decisions))
    return total


def replay_shared_prefix(
    model: Any, runs: Sequence[tuple[Sequence[int], Sequence[int]]]
) -> tuple[Replay, int]:
    """The ideal for several runs whose common token prefix (up to the first decision of any)
    is computed once: each run extends it and is cropped back. Returns (replay, prefix len)."""
    first = min((d[0] for _, d in runs if d), default=0)
    prefix = _common_prefix([ids for ids, _ in runs])
    prefix = min(prefix, first)
    total = Replay()
    cache = new_cache(model)
    started = time.perf_counter()
    if prefix:
        with torch.inference_mode():
            model(input_ids=torch.tensor([list(runs[0][0][:prefix])], device=model.device),
                  **{cache_argument(model): cache}, use_cache=True, logits_to_keep=1)
        total.forward_calls += 1
        total.forward_tokens += prefix
    total.wall_s += time.perf_counter() - started
    for token_ids, decisions in runs:
        total.add(replay(model, token_ids, decisions, cache=cache, start=prefix))
        started = time.perf_counter()
        cache.crop(prefix - cache.get_seq_length())  # 5.x: crop(-k) drops the last k
        total.wall_s += time.perf_counter() - started
    return total, prefix


def _common_prefix(rows: Sequence[Sequence[int]]) -> int:
    if not rows:
        return 0
    n = min(len(r) for r in rows)
    for i in range(n):
        token = rows[0][i]
        if any(r[i] != token for r in rows):
            return i
    return n
