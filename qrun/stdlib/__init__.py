"""The constraint standard library: named regex patterns and JSON Schema -> regex, both
lowered by the compiler into byte DFAs (regex/dfa.py)."""

from __future__ import annotations

from qrun.stdlib.json_schema import SchemaError, schema_to_regex
from qrun.stdlib.patterns import PATTERNS

__all__ = ["PATTERNS", "SchemaError", "schema_to_regex"]
