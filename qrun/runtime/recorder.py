"""What a run did, token by token, for its trace (docs/trace.md): every token appended to the
context or dropped from it, with its kind, the hole it belongs to and, for the model's choices,
its log-probability. Always on (a tuple per token); with `detailed`, each sampled token also
keeps the mask size and the top alternatives, which cost a partial sort of the logits."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from qrun.constraint import Vocabulary
from qrun.runtime.sampler import log_normalizer

TOP_ALTERNATIVES = 5


@dataclass(slots=True)
class Event:
    """One token appended to the context (kept until a `drop`); fields as in the trace."""

    pos: int
    id: int
    kind: str
    hole: int | None = None
    logprob: float | None = None
    mask_size: int | None = None
    top: list[tuple[int, float]] = field(default_factory=list)
    option: int | None = None
    kept: bool = True
    dropped_by: str | None = None
    cached: bool = False


@dataclass(slots=True)
class HoleEntry:
    """One hole as the trace shows it (filled in when the hole ends)."""

    name: str
    kind: str
    line: int
    column: int
    constraint: str | None = None
    value: Any = None
    text: str = ""
    finish: str = ""
    seconds: float = 0.0
    options: list[tuple[str, float, float]] | None = None
    # sampler="exact"/"smc" (docs/language.md §14.8): the distribution the value was drawn
    # from, each particle's value and weight, the log of P(language)
    values: dict[str, float] | None = None
    particles: list[tuple[str, float]] | None = None
    log_evidence: float | None = None
    log_importance: float = 0.0  # in a particles block (runtime/result.py HoleRecord's)
    # where it ran when not in the run's context: "hidden", "fresh", "branch 2 of fork 3:1"
    # (runtime/contexts.py, runtime/branches.py); its events are then not in the trace
    context: str | None = None


@dataclass(slots=True)
class CallEntry:
    """One host function call (runtime/calls.py): its arguments, then its result or error."""

    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    result: Any
    error: str | None
    seconds: float
    line: int
    column: int
    pos: int  # the context's length when it was made
    context: str | None = None  # where it ran when not in the run's context (as a hole's)


@dataclass(slots=True)
class ParticleBlock:
    """One run of a `{% particles %}` block (runtime/particle_block.py): where it is, each
    particle's captures (the holes written inside the block, by name), normalised weight and
    error (a particle whose hole failed weighs 0), which particle went on, and the log of the
    estimate of the block's evidence (the mean weight)."""

    line: int
    column: int
    values: list[dict[str, Any]]
    weights: list[float]
    errors: list[str | None]
    chosen: int
    log_evidence: float


class Recorder:
    """The events and holes of one run. `hole` is the hole being filled (its model tokens get
    its index); `live[p]` is the index of the kept event at context position p."""

    def __init__(self, vocab: Vocabulary, detailed: bool = False) -> None:
        self.vocab = vocab
        self.detailed = detailed
        self.events: list[Event] = []
        self.holes: list[HoleEntry] = []
        self.hole: int | None = None
        self.live: list[int] = []
        self.calls: list[CallEntry] = []
        self.blocks: list[ParticleBlock] = []

    # ---- the context ---------------------------------------------------------------------------

    def fixed(self, pos: int, token_ids: Sequence[int]) -> None:
        """Tokens of text that is not the model's choice, appended at `pos`."""
        for k, token in enumerate(token_ids):
            self._add(Event(pos + k, token, "fixed"))

    def chosen(self, pos: int, token: int, kind: str, logprob: float | None,
               mask_size: int | None = None, top: list[tuple[int, float]] | None = None,
               option: int | None = None) -> None:
        """A token of the current hole appended at `pos` ("sampled", "forced", "healed" or
        "select")."""
        self._add(Event(pos, token, kind, self.hole, logprob, mask_size, top or [], option))

    def unchosen(self, pos: int, token: int, logprob: float | None, option: int,
                 reason: str = "select") -> None:
        """A token the model scored but the context never kept (a losing select option)."""
        self.events.append(Event(pos, token, "select", self.hole, logprob, option=option,
                                 kept=False, dropped_by=reason))

    def ended(self, pos: int, token: int, logprob: float | None) -> None:
        """The end-of-sequence token that ended the current hole (never in the context)."""
        self.events.append(Event(pos, token, "sampled", self.hole, logprob, kept=False,
                                 dropped_by="rollback"))

    def drop(self, length: int, reason: str) -> None:
        """Every kept token from position `length` on left the context."""
        while len(self.live) > length:
            event = self.events[self.live.pop()]
            event.kept, event.dropped_by = False, reason

    def cached(self, start: int, end: int) -> None:
        """The KV of positions [start, end) came from the prefix cache."""
        for pos in range(start, min(end, len(self.live))):
            self.events[self.live[pos]].cached = True

    def adopt(self, other: Recorder, start: int) -> None:
        """The context `other` recorded (a fork's recorder, Session.fork: its first `start`
        events are the shared context's) goes on as this recorder's: its later events and
        its holes join these, as if they had run here (where it took back shared tokens, a
        hole healing the last one, they are dropped here too)."""
        assert len(self.live) == start, "the shared context ends where the fork began"
        shared = 0
        while shared < min(start, len(other.live)) and other.live[shared] == shared:
            shared += 1
        if shared < start:
            self.drop(shared, other.events[shared].dropped_by or "heal")
        offset = len(self.holes)
        self.holes.extend(other.holes)
        self.blocks.extend(other.blocks)
        moved = {}
        for index, event in enumerate(other.events[start:], start):
            if event.hole is not None:
                event.hole += offset
            moved[index] = len(self.events)
            self.events.append(event)
        self.live.extend(moved[index] for index in other.live[shared:])

    def _add(self, event: Event) -> None:
        if event.pos != len(self.live):  # a bug in a caller: positions must stay in step
            raise AssertionError(f"trace: a token at {event.pos}, context {len(self.live)}")
        self.live.append(len(self.events))
        self.events.append(event)

    # ---- holes ---------------------------------------------------------------------------------

    def begin_hole(self, name: str, kind: str, line: int, column: int) -> None:
        self.holes.append(HoleEntry(name, kind, line, column))
        self.hole = len(self.holes) - 1

    def end_hole(self, **fields: Any) -> None:
        if self.hole is not None:
            entry = self.holes[self.hole]
            for key, value in fields.items():
                setattr(entry, key, value)
        self.hole = None

    def host_call(self, name: str, args: list[Any], kwargs: dict[str, Any], result: Any,
                  error: str | None, seconds: float, line: int, column: int) -> None:
        self.calls.append(CallEntry(name, args, kwargs, result, error, seconds, line, column,
                                    len(self.live)))

    def alternatives(self, logits: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_] | None
                     ) -> tuple[int | None, list[tuple[int, float]]]:
        """The mask's size and the most likely allowed tokens with their log-probabilities
        (under the masked distribution at temperature 1), when detailed; else (None, [])."""
        if not self.detailed:
            return None, []
        values = logits
        if mask is not None:
            values = np.where(mask, values, -np.inf)
            size: int | None = int(mask.sum())
        else:
            size = None
        top = np.argpartition(-values, TOP_ALTERNATIVES)[:TOP_ALTERNATIVES + 1]
        top = top[np.argsort(-values[top])]
        norm = log_normalizer(values)
        return size, [(int(t), float(values[t]) - norm) for t in top
                      if math.isfinite(values[t])][:TOP_ALTERNATIVES]

    # ---- out -----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """"events" and "holes" in the trace format (docs/trace.md)."""
        spans: dict[int, list[int]] = {}
        for i, event in enumerate(self.events):
            if event.hole is not None:
                spans.setdefault(event.hole, [i, i])[1] = i
        return {"events": [self._event(e) for e in self.events],
                "holes": [self._hole(i, h, spans.get(i)) for i, h in enumerate(self.holes)],
                "calls": [self._call(c) for c in self.calls],
                **({} if not self.blocks else {
                    "particle_blocks": [block_json(b) for b in self.blocks]})}

    def _call(self, call: CallEntry) -> dict[str, Any]:
        return {"name": call.name, "args": _json_safe(call.args),
                "kwargs": _json_safe(call.kwargs), "result": _json_safe(call.result),
                "error": call.error, "seconds": call.seconds,
                "span": {"line": call.line, "column": call.column}, "pos": call.pos,
                "context": call.context}

    def _event(self, event: Event) -> dict[str, Any]:
        return {
            "pos": event.pos, "id": event.id, "text": self._text(event.id), "kind": event.kind,
            "kept": event.kept, "dropped_by": event.dropped_by, "cached": event.cached,
            "hole": event.hole, "logprob": _finite(event.logprob),
            "prob": None if _finite(event.logprob) is None else math.exp(event.logprob or 0.0),
            "mask_size": event.mask_size,
            "top": [{"id": t, "text": self._text(t), "logprob": lp} for t, lp in event.top],
            "option": event.option,
        }

    def _hole(self, index: int, hole: HoleEntry, span: list[int] | None) -> dict[str, Any]:
        options = None
        if hole.options is not None:
            options = [{"text": text, "logprob": logprob, "prob": prob}
                       for text, logprob, prob in hole.options]
        return {
            "index": index, "name": hole.name, "kind": hole.kind,
            "constraint": hole.constraint, "value": _json_safe(hole.value), "text": hole.text,
            "finish": hole.finish or ("select" if hole.kind == "select" else "stop"),
            "seconds": hole.seconds, "span": {"line": hole.line, "column": hole.column},
            "first_event": span[0] if span else None, "last_event": span[1] if span else None,
            "options": options, "context": hole.context,
            **({} if hole.values is None else {
                "values": [{"text": text, "prob": prob} for text, prob in hole.values.items()],
                "log_evidence": _finite(hole.log_evidence)}),
            **({} if hole.particles is None else {
                "particles": [{"text": text, "weight": w} for text, w in hole.particles]}),
        }

    def _text(self, token: int) -> str:
        data = self.vocab.token_bytes[token] if 0 <= token < self.vocab.size else None
        return (data or b"").decode("utf-8", errors="replace")


def block_json(block: ParticleBlock) -> dict[str, Any]:
    """A particles block's run as JSON: the trace's `particle_blocks` item (docs/trace.md), and
    a result row's (qrun/jsonio.py FIELDS)."""
    return {"span": {"line": block.line, "column": block.column}, "chosen": block.chosen,
            "log_evidence": _finite(block.log_evidence),
            "particles": [{"values": _json_safe(values), "weight": weight, "error": error}
                          for values, weight, error in zip(block.values, block.weights,
                                                           block.errors, strict=True)]}


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _json_safe(value: Any) -> Any:
    """A captured value with NaN/Infinity (a FLOAT value of 1e999) as null: traces are JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value
