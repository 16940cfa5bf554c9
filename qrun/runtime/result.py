"""The result of a run (docs/language.md §16.1): rendered text, captured values, per-hole
records, stats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qrun.runtime.generate import HoleRecord
from qrun.runtime.stats import Stats


@dataclass(slots=True)
class Result:
    """`text` is the full rendered context (fixed text, chat markers and values); `vars` maps
    every capture to its value (a list for holes inside loops) plus `NAME__logprobs` for each
    select; `holes` maps capture names to their HoleRecord (a list inside loops);
    `token_ids` is the final context as token ids (what the model saw, markers included)."""

    text: str
    vars: dict[str, Any]
    stats: Stats
    holes: dict[str, HoleRecord | list[HoleRecord]] = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)

    def __getitem__(self, name: str) -> Any:
        return self.vars[name]

    def __contains__(self, name: str) -> bool:
        return name in self.vars

    def to_dict(self) -> dict[str, Any]:
        """The JSON form printed by `qrun --json`: {"text", "vars", "stats"}."""
        return {"text": self.text, "vars": self.vars, "stats": self.stats.to_dict()}
