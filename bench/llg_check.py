"""The schema corpus checker (corpus/llg_check.py: `qrun.Matcher` against the
`jsonschema` validator) with the engine json= holes had before llguidance beside it
(bench/old_json_schema.py: schema -> regex -> DFA), fed the same instances: for
bench/llg_corpus.py's comparison table."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from bench.old_json_schema import schema_to_regex
from corpus.llg_check import Checker, SchemaReport, Timeout, limited
from qrun.constraint.regex_index import DEAD, TokenIndex
from qrun.constraint.vocab import Vocabulary

__all__ = ["CorpusReport", "OldEngine", "OldEngineChecker"]


@dataclass
class CorpusReport(SchemaReport):
    """A SchemaReport with the old engine's findings. `old`: "ok", "refused" (old_reason
    says why) or "timeout"."""

    old: str = ""
    old_reason: str = ""
    old_compile_s: float = 0.0
    old_first_mask_s: float = 0.0
    old_valid_rejected: int = 0
    old_invalid_accepted: int = 0
    old_mask_s: list[float] = field(default_factory=list)


class OldEngine:
    """The engine json= holes had before llguidance: the schema as a regex, its DFA indexed
    over the vocabulary (closed objects, fixed layout, properties in schema order)."""

    def __init__(self, vocab: Vocabulary, timeout_s: float = 10.0) -> None:
        self.vocab, self.timeout_s = vocab, timeout_s

    def compile(self, schema: Any, report: CorpusReport) -> TokenIndex | None:
        started = time.perf_counter()
        try:
            index: TokenIndex = limited(self.timeout_s, lambda: TokenIndex.build(
                schema_to_regex(schema), self.vocab))
        except Timeout:
            report.old = "timeout"
            return None
        except Exception as exc:  # SchemaError, PatternError (DFA size limit), RecursionError
            report.old, report.old_reason = "refused", f"{type(exc).__name__}: {exc}"[:200]
            return None
        report.old_compile_s = time.perf_counter() - started
        index.allowed(index.start_state)
        report.old_first_mask_s = time.perf_counter() - started
        report.old = "ok"
        return index

    @staticmethod
    def walk(index: TokenIndex, tokens: list[int], report: CorpusReport) -> bool:
        """Whether the DFA accepts `tokens` (masks timed up to the first refusal)."""
        state = index.start_state
        for token in tokens:
            started = time.perf_counter()
            mask = index.allowed(state)
            report.old_mask_s.append(time.perf_counter() - started)
            if not mask[token]:
                return False
            state = index.advance(state, token)
            if state == DEAD:
                return False
        return index.is_accepting(state)


class OldEngineChecker(Checker):
    """The corpus checker with the old engine compiled and walked beside the Matcher."""

    def __init__(self, *args: Any, old_engine: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.old = OldEngine(self.vocab) if old_engine else None

    def new_report(self, name: str) -> CorpusReport:
        return CorpusReport(name)

    def also_compile(self, schema: Any, report: SchemaReport) -> TokenIndex | None:
        assert isinstance(report, CorpusReport)
        return self.old.compile(schema, report) if self.old is not None else None

    def also_walk(self, other: Any, tokens: list[int], valid: bool,
                  report: SchemaReport) -> None:
        assert isinstance(report, CorpusReport)
        accepted = OldEngine.walk(other, tokens, report)
        if valid and not accepted:
            report.old_valid_rejected += 1
        elif not valid and accepted:
            report.old_invalid_accepted += 1
