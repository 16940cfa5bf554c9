"""The ideal: qrun's final token ids pushed through the bare model with plain transformers, one
forward per stretch of context between two model decisions, greedy argmax at each decision; no
masks, no template machinery. It is the physical limit for producing that same sequence.

Where the decisions are: a run is traced (`trace_decisions`) by wrapping the runtime's token
intake (`generate._Hole.take`), `generate` and `select`, which record the context position of
every token the model chose and of every hole end by EOS. Decisions:
- a sampled, kept token that carries value bytes;
- the end of a hole by EOS (the model had to be asked after the hole's last token);
- a `select`: one decision at its first token, its winner fed with the text after it.
Tokens forced by a constraint (fast-forward) are fixed text, and so is a token re-sampled
inside a token-healing prefix (its bytes lie inside the text healing took back): it gives back
the template's own text (`healed=True` counts it as a decision instead).

If the hooks are missing (the runtime was refactored), `align_decisions` finds the holes'
tokens in the final context instead, an approximation the report flags."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from qrun.runtime.generate import HoleRecord

# --- tracing decisions ----------------------------------------------------------------------

# Event kinds: a token carrying value bytes, a token inside a healed prefix, a forced token, a
# select's first token, a hole ended by EOS (its token is EOS_TOKEN: not in the context).
VALUE, HEALED, FORCED, SELECT, EOS = "value", "healed", "forced", "select", "eos"
EOS_TOKEN = -1
Event = tuple[int, int, str]  # (context position, token id, kind)


@dataclass
class DecisionLog:
    """Decision events per session, in the order sessions first appeared."""

    sessions: list[Any] = field(default_factory=list)
    events: dict[int, list[Event]] = field(default_factory=dict)
    hooked: bool = False
    healed_resampled: int = 0  # tokens sampled inside a healed prefix
    healed_one_choice: int = 0  # ... of which the mask allowed that token only

    def add(self, session: Any, position: int, token: int, kind: str) -> None:
        key = id(session)
        if key not in self.events:
            self.sessions.append(session)  # kept alive, so ids are not reused
            self.events[key] = []
        self.events[key].append((position, token, kind))

    def runs(self) -> list[list[Event]]:
        return [self.events[id(s)] for s in self.sessions]


def decisions_from_events(
    token_ids: Sequence[int], events: Sequence[Event], healed: bool = False
) -> list[int]:
    """Sorted context positions before which the model decided something: a kept token (the
    last event at a position wins: a rolled-back position may be decided again) or the end of a
    hole by EOS (a position may equal len(token_ids)). With `healed`, tokens re-sampled inside
    a healed prefix count too."""
    deciding = {VALUE, SELECT} | ({HEALED} if healed else set())
    last: dict[int, tuple[int, str]] = {}
    ends: set[int] = set()
    for position, token, kind in events:
        if kind == EOS:
            ends.add(position)
        else:
            last[position] = (token, kind)
    kept = {
        p for p, (token, kind) in last.items()
        if kind in deciding and p < len(token_ids) and token_ids[p] == token
    }
    return sorted(kept | {p for p in ends if p <= len(token_ids)})


@contextmanager
def trace_decisions() -> Iterator[DecisionLog]:
    """Record where the model decides tokens in the qrun runs made inside the block. The
    wrappers add one Python call per token (~1 µs against ~60 ms per decode forward)."""
    from qrun.runtime import executor, generate

    log = DecisionLog()
    hole_cls = getattr(generate, "_Hole", None)
    take = getattr(hole_cls, "take", None)
    select = getattr(executor, "select", None)
    gen = getattr(executor, "generate", None)
    if hole_cls is None or take is None or select is None or gen is None:
        yield log
        return

    def traced_take(self: Any, token: int, logprob: float, forced: bool) -> Any:
        data = self.vocab.token_bytes[token] or b""
        kind = FORCED if forced else VALUE
        if not forced and len(self.text) + len(data) <= len(self.request.prefix):
            kind = HEALED
            log.healed_resampled += 1
            log.healed_one_choice += _choices(self.request.cursor) == 1
        log.add(self.session, len(self.session.token_ids), token, kind)
        return take(self, token, logprob, forced)

    def traced_select(session: Any, request: Any) -> HoleRecord:
        record: HoleRecord = select(session, request)
        position = len(session.token_ids) - len(record.token_ids)
        log.add(session, position, record.token_ids[0], SELECT)
        return record

    def traced_generate(session: Any, request: Any, on_text: Any = None) -> HoleRecord:
        record: HoleRecord = gen(session, request, on_text)
        if record.finish == "eos":
            log.add(session, len(session.token_ids), EOS_TOKEN, EOS)
        return record

    hooks = ((hole_cls, "take", traced_take, take), (executor, "select", traced_select, select),
             (executor, "generate", traced_generate, gen))
    for owner, name, wrapper, _ in hooks:
        setattr(owner, name, wrapper)
    log.hooked = True
    try:
        yield log
    finally:
        for owner, name, _, original in hooks:
            setattr(owner, name, original)


def _choices(cursor: Any) -> int:
    """How many tokens the cursor allows now (budget ignored), EOS included."""
    if cursor is None:
        return 2
    mask = cursor.allowed(1 << 30)  # [V] bool
    return int(np.count_nonzero(mask.numpy()))


def align_decisions(
    token_ids: Sequence[int], holes_in_order: Sequence[HoleRecord]
) -> list[int]:
    """Fallback without tracing: find each hole's tokens in the final context, in template
    order, and take its non-forced tokens as decisions. Approximate: a hole's rolled-back
    overshoot is matched by its longest prefix present in the context."""
    decisions: list[int] = []
    pointer = 0
    for record in holes_in_order:
        tokens = record.token_ids
        for k in range(len(tokens), 0, -1):
            at = _find(token_ids, tokens[:k], pointer)
            if at >= 0:
                if record.finish == "select":
                    decisions.append(at)
                else:
                    decisions += [at + i for i in range(k) if not record.forced[i]]
                    if record.finish == "eos":
                        decisions.append(at + k)
                pointer = at + k
                break
    return sorted(set(decisions))


def _find(haystack: Sequence[int], needle: Sequence[int], start: int) -> int:
    n = len(needle)
    for i in range(start, len(haystack) - n + 1):
        if list(haystack[i : i + n]) == list(needle):
            return i
    return -1


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
    started = time.perf_counter()
    with torch.inference_mode():
        for a, b in zip(bounds, bounds[1:], strict=False):
            input_ids = torch.tensor([list(token_ids[a:b])], device=device)
            out = model(input_ids=input_ids, past_key_values=cache, use_cache=True,
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
                  past_key_values=cache, use_cache=True, logits_to_keep=1)
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


def holes_in_order(
    holes: Mapping[str, HoleRecord | list[HoleRecord]], names: Sequence[str]
) -> list[HoleRecord]:
    """Hole records in template order, `names` as the naive step list spells them (x[k])."""
    out = []
    for name in names:
        if name.endswith("]"):
            base, _, index = name[:-1].partition("[")
            value = holes[base]
            assert isinstance(value, list)
            out.append(value[int(index)])
        else:
            value = holes[name]
            assert isinstance(value, HoleRecord)
            out.append(value)
    return out

