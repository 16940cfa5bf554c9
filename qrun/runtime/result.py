"""The result of a run (docs/language.md §16.1): rendered text, captured values, one
record per hole, stats."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qrun.runtime.stats import Stats

if TYPE_CHECKING:
    from qrun.runtime.recorder import ParticleBlock, Recorder


@dataclass(slots=True)
class HoleRecord:
    """What one hole produced: its value and text, and per token its id, log-probability (None
    where the token was forced: no choice was made) and whether it was forced. `start` is the
    context position where the hole's tokens begin (its first model decision). `finish` is
    "stop", "eos", "max_tokens", "match" (constraint complete), "boundary" (the model began the
    text after the hole), "select", or "filled" (a known value given to the run:
    runtime/fills.py)."""

    name: str
    value: Any
    text: str = ""
    start: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    forced: list[bool] = field(default_factory=list)
    finish: str = ""
    seconds: float = 0.0
    # In a `{% particles %}` block, a value drawn from the block's proposal rather than its
    # probability (runtime/particle_block.py Strata): the log of p(value) / proposal(value),
    # a term of the particle's weight; 0 elsewhere.
    log_importance: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "text": self.text,
            "start": self.start,
            "token_ids": self.token_ids,
            "logprobs": [None if lp is None else round(lp, 6) for lp in self.logprobs],
            "forced": self.forced,
            "finish": self.finish,
            "seconds": round(self.seconds, 6),
            **({"log_importance": round(self.log_importance, 6)} if self.log_importance else {}),
        }


@dataclass(slots=True)
class GenRecord(HoleRecord):
    """A `gen` hole. `constraint` describes its constraint (None: unconstrained); `healed` is
    the text token healing took back before it (the hole produced it first, outside the
    value), and its first `prefix_tokens` tokens lie wholly inside that text. `stop` is the
    stop string that ended it (finish "stop"), else None."""

    constraint: str | None = None
    healed: str = ""
    prefix_tokens: int = 0
    stop: str | None = None
    # sampler="exact" (runtime/exact.py): every value of the constraint's language with its
    # probability under the model's conditional, likeliest first; sampler="smc": the
    # particles' estimate of it (runtime/particles.py); None under the mask.
    value_probs: dict[str, float] | None = None
    # sampler="smc" (runtime/particles.py): each particle's value and normalised weight at the
    # end; with "exact" or "smc", the log of the (estimated) probability of the constraint's
    # whole language under the model: how much the constraint cost the model.
    particles: list[tuple[str, float]] | None = None
    log_evidence: float | None = None

    def drawn_from(self) -> dict[str, Any]:
        """What the trace shows of the samplers that aim at the model's conditional (none of
        it for a hole sampled under the mask): Recorder.end_hole's fields."""
        return {"values": self.value_probs, "particles": self.particles,
                "log_evidence": self.log_evidence, "log_importance": self.log_importance}

    def to_dict(self) -> dict[str, Any]:
        record = {**HoleRecord.to_dict(self), "kind": "gen", "constraint": self.constraint,
                  "healed": self.healed, "prefix_tokens": self.prefix_tokens, "stop": self.stop}
        if self.value_probs is not None:
            record["value_probs"] = {k: round(v, 6) for k, v in self.value_probs.items()}
        if self.particles is not None:
            record["particles"] = [[value, round(w, 6)] for value, w in self.particles]
        if self.log_evidence is not None:
            record["log_evidence"] = round(self.log_evidence, 6)
        return record


@dataclass(slots=True)
class SelectRecord(HoleRecord):
    """A `select` hole: every option's log-probability in context (the sum over its tokens),
    and the probabilities they give when normalised over the options. With token healing its
    tokens are those of the healed text and the option together, of which the first
    `prefix_tokens` lie wholly inside the healed text (as GenRecord's)."""

    option_logprobs: dict[str, float] = field(default_factory=dict)
    prefix_tokens: int = 0

    @property
    def option_probs(self) -> dict[str, float]:
        """Each option's probability relative to the others (summing to 1)."""
        if not self.option_logprobs:
            return {}
        top = max(self.option_logprobs.values())
        weights = {k: math.exp(v - top) for k, v in self.option_logprobs.items()}
        total = sum(weights.values())
        return {k: w / total for k, w in weights.items()}

    def to_dict(self) -> dict[str, Any]:
        return {**HoleRecord.to_dict(self), "kind": "select",
                "option_logprobs": {k: round(v, 6) for k, v in self.option_logprobs.items()},
                "option_probs": {k: round(v, 6) for k, v in self.option_probs.items()}}


@dataclass(slots=True)
class Result:
    """`text` is the full rendered context (fixed text, chat markers and values); `vars` maps
    every capture to its value (a list for holes inside loops); `holes` maps each capture
    outside a loop to its record, `hole_lists` each capture inside a loop to the list of its
    records (one per iteration); `token_ids` is the final context as token ids (what the model
    saw, markers included)."""

    text: str
    vars: dict[str, Any]
    stats: Stats
    holes: dict[str, HoleRecord] = field(default_factory=dict)
    hole_lists: dict[str, list[HoleRecord]] = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)
    recorder: Recorder | None = field(default=None, repr=False, compare=False)
    trace_header: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # The typed result record of a template with `output:` (docs/language.md §4.2), checked
    # against its schema; None without one.
    output: dict[str, Any] | None = None

    def __getitem__(self, name: str) -> Any:
        return self.vars[name]

    def __contains__(self, name: str) -> bool:
        return name in self.vars

    @property
    def particle_blocks(self) -> list[ParticleBlock]:
        """Each `{% particles %}` block the run went through, in order (docs/language.md
        §23.5): every particle's captures, weight and error, the one that went on, and the
        log of the estimate of the block's evidence."""
        return [] if self.recorder is None else list(self.recorder.blocks)

    def records(self) -> list[HoleRecord]:
        """Every hole record, in the order the holes ran."""
        everything = [*self.holes.values(), *(r for rs in self.hole_lists.values() for r in rs)]
        return sorted(everything, key=lambda record: record.start)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form printed by `qrun --json`: {"text", "vars", "stats"}."""
        return {"text": self.text, "vars": self.vars, "stats": self.stats.to_dict()}

    def row(self, fields: tuple[str, ...]) -> dict[str, Any]:
        """The chosen `fields` of this result (qrun/jsonio.py FIELDS), as `qrun --json` prints
        it and `qrun serve` answers (docs/serve.md §2.2)."""
        # Here, not at the top: recorder.py needs numpy, which this module's other users
        # (the record types) do not load; the recorder is a type here otherwise.
        from qrun.runtime.recorder import block_json

        whole = {**self.to_dict(), "output": self.output}  # docs/language.md §4.2
        row: dict[str, Any] = {}
        for name in fields:
            if name == "holes":
                row[name] = self.hole_records()
            elif name == "particle_blocks":  # docs/language.md §23.5, as the trace has them
                row[name] = [block_json(block) for block in self.particle_blocks]
            else:
                row[name] = whole[name]
        return row

    def hole_records(self) -> dict[str, Any]:
        """Every hole's record (docs/language.md §15.2) by name: a list for a hole in a
        loop."""
        holes: dict[str, Any] = {name: r.to_dict() for name, r in self.holes.items()}
        holes.update({name: [r.to_dict() for r in records]
                      for name, records in self.hole_lists.items()})
        return holes

    def trace(self) -> dict[str, Any]:
        """What the run did, token by token, in the trace format (docs/trace.md): JSON-ready
        data, checked by qrun.trace.validate. Runs with the option `trace=True` also keep, for
        each sampled token, the mask size and the likeliest alternatives."""
        from qrun.trace import FORMAT, VERSION, validate

        if self.recorder is None:
            raise ValueError("this result was not made by a run, so it has no trace")
        trace = {"format": FORMAT, "version": VERSION, **self.trace_header, "text": self.text,
                 "stats": self.stats.to_dict(), **self.recorder.to_dict()}
        validate(trace)
        return trace

    def to_html(self) -> str:
        """The trace as one self-contained HTML page (docs/trace.md)."""
        from qrun.trace import render_html

        return render_html(self.trace())

    def write_trace(self, path: str | os.PathLike[str]) -> None:
        """Write the trace to `path`: an HTML page for .html/.htm, JSON otherwise."""
        from qrun.trace import write_trace

        write_trace(self.trace(), path)
