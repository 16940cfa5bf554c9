"""qrun's own regex engine, below everything else and free of torch and models: the front end
(syntax.py: pattern text -> AST with qrun's semantics), the byte DFA every token mask is built
from (dfa.py), and the rewrite of a pattern for another engine's dialect (portable.py)."""

from qrun.regex.dfa import ByteDFA, compile_dfa
from qrun.regex.portable import PortableError, escape, portable_regex
from qrun.regex.syntax import MAX_SIZE, PatternError, parse

__all__ = [
    "MAX_SIZE",
    "ByteDFA",
    "PatternError",
    "PortableError",
    "compile_dfa",
    "escape",
    "parse",
    "portable_regex",
]
