"""The constraint core (docs/language.md §7-§8), torch-free and below the language, the
runtime and the backends: what a constraint is (spec.py: `lower`, the one door of every kind,
tools= included; the spec; the `Cursor` every engine's state offers), the model's token bytes
(vocab.py), the token masks of regexes (regex_index.py, qrun's own DFA) and of JSON Schemas
and Lark grammars (grammar_index.py, llguidance), the named patterns, and grammar/, the
schemas and grammars written for llguidance (JsonFormat: a schema's layout and options, and
their one check).

Its face is the names below, imported when first asked for (`from qrun.constraint import
lower`), so that reaching one module of the core does not load the others: the compiler
needs `lower` and its checks, not the token indexes."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qrun.constraint.grammar import ConstraintLimits, JsonFormat, JsonFormatError
    from qrun.constraint.grammar_index import LlgCache
    from qrun.constraint.patterns import PATTERNS
    from qrun.constraint.regex_index import IndexCache
    from qrun.constraint.spec import KINDS, ConstraintSpec, Cursor, LoweringError, lower
    from qrun.constraint.vocab import Vocabulary

_FACE = {
    "lower": "spec", "KINDS": "spec", "ConstraintSpec": "spec", "Cursor": "spec",
    "LoweringError": "spec", "Vocabulary": "vocab", "JsonFormat": "grammar",
    "JsonFormatError": "grammar", "ConstraintLimits": "grammar", "PATTERNS": "patterns",
    "IndexCache": "regex_index", "LlgCache": "grammar_index",
}
__all__ = ["KINDS", "PATTERNS", "ConstraintLimits", "ConstraintSpec", "Cursor", "IndexCache",
           "JsonFormat", "JsonFormatError", "LlgCache", "LoweringError", "Vocabulary", "lower"]


def __getattr__(name: str) -> Any:
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module 'qrun.constraint' has no attribute {name!r}")
    return getattr(importlib.import_module(f"qrun.constraint.{module}"), name)
