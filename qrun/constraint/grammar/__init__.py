"""The grammars of json= and grammar= holes, for llguidance (a Rust Earley parser over a lazy
lexer DFA, PyPI `llguidance`): JSON Schemas rewritten into forms it takes (rewrite.py), the
Lark text of a schema or a grammar with qrun's options and healed prefix, and its refusals
located in the user's schema or grammar (grammar.py). Free of torch and models, so `qrun
--check` compiles with it; the token-level cursor is qrun/constraint/grammar_index.py."""

from qrun.constraint.grammar.limits import ConstraintLimits
from qrun.constraint.grammar.rewrite import rewrite
from qrun.constraint.grammar.text import (
    FIXED,
    FLEXIBLE,
    LIMITS,
    GrammarError,
    JsonFormat,
    JsonFormatError,
    check_lark,
    check_schema,
    clean_reason,
    json_grammar,
    lark_grammar,
    schema_grammar,
    validate,
    with_prefix,
)

__all__ = [
    "ConstraintLimits",
    "FIXED",
    "FLEXIBLE",
    "LIMITS",
    "GrammarError",
    "JsonFormat",
    "JsonFormatError",
    "check_lark",
    "check_schema",
    "clean_reason",
    "json_grammar",
    "lark_grammar",
    "rewrite",
    "schema_grammar",
    "validate",
    "with_prefix",
]
