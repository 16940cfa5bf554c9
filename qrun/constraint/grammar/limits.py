"""How large a constraint qrun hands to llguidance (docs/language.md §14.9): the defaults keep
every real grammar and schema in and refuse, at `--check`, the ones that crashed llguidance or
stopped its parser in the middle of a value. A run raises them with
`run(limits=Limits(grammar_chars=...))` (qrun/limits.py turns its fields into this object);
a function given none uses `DEFAULT`. Free of the rest of qrun, as the grammar package is
(tests/test_structure.py)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import llguidance

__all__ = ["DEFAULT", "ConstraintLimits"]


@dataclass(frozen=True, slots=True)
class ConstraintLimits:
    """grammar_chars: characters of a Lark grammar (real ones, SQL or JSON, are a few
        kilobytes; a megabyte of alternatives compiled for seconds, then stopped mid-value).
    grammar_depth: rules and terminals in a chain of references (`a: b`, `b: c`, ...),
        cycles not counted (llguidance's compiler overflowed its stack at about 2,700 on an
        8 MiB stack: SIGSEGV).
    optional_properties: optional properties that may come at one place of a JSON value: an
        object's properties that `required` does not list, summed over the `anyOf`/`oneOf`
        branches that may start there (llguidance's parser holds ~4 items per such property
        in one row: 4 x properties + 7 (measured), and stops at its row limit, which
        qrun sets to 5 x optional_properties (20,000 by default; llguidance's own 2,000 at
        least). 4,000 optional properties compile in ~2 s and their first mask takes ~70 ms
        on the tiny model's 49k vocabulary; 10,000 in ~14 s and ~500 ms
        (grammar/schema_size.py).
    """

    grammar_chars: int = 100_000
    grammar_depth: int = 500
    optional_properties: int = 4_000

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field.name} must be a positive integer, got {value!r}")

    def parser_limits(self) -> llguidance.LLParserLimits:
        """llguidance's parser limits for grammars checked against these limits. Its rows hold
        at most 2,000 items by default; an object with ~1,000 optional properties
        (SchemaStore's MegaLinter schema) needs ~4,000 after `{"`, and the matcher then
        stopped with an error in the middle of a value; a grammar's rows stay small where
        it has no such place, so the higher limit costs nothing there."""
        rows = max(2_000, 5 * self.optional_properties)
        return llguidance.LLParserLimits(max_items_in_row=rows)


DEFAULT = ConstraintLimits()
