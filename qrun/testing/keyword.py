"""`qrun test -k EXPR`: which cases run, by their id `TEMPLATE::CASE`, as pytest's -k reads
it: words matched as substrings (case-insensitive), joined by `and`, `or`, `not` and
parentheses. Parsed here, never by Python eval."""

from __future__ import annotations

import re
from collections.abc import Callable

from qrun.errors import UsageError

__all__ = ["keyword_filter"]

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")
MAX_DEPTH = 32
"""How deep parentheses and `not`s may nest in -k."""
Match = Callable[[str], bool]


def keyword_filter(expression: str) -> Match:
    """A predicate over case ids for `expression`.

    Raises:
        UsageError: the expression does not parse (names the word at fault).
    """
    tokens = _TOKEN.findall(expression)
    if not tokens or "".join(tokens) != re.sub(r"\s+", "", expression):
        raise UsageError(f"-k {expression!r}: give words joined by and, or, not")
    parser = _Parser(tokens, expression)
    match = parser.either()
    if parser.at < len(tokens):
        raise UsageError(f"-k {expression!r}: unexpected {tokens[parser.at]!r}")
    return match


class _Parser:
    def __init__(self, tokens: list[str], expression: str) -> None:
        self.tokens = tokens
        self.expression = expression
        self.at = 0
        self.depth = 0

    def _peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise UsageError(f"-k {self.expression!r}: ends too soon")
        self.at += 1
        return token

    def either(self) -> Match:
        left = self.both()
        while self._peek() == "or":
            self._take()
            right = self.both()
            left = (lambda a, b: lambda name: a(name) or b(name))(left, right)
        return left

    def both(self) -> Match:
        left = self.negated()
        while self._peek() == "and":
            self._take()
            right = self.negated()
            left = (lambda a, b: lambda name: a(name) and b(name))(left, right)
        return left

    def negated(self) -> Match:
        self.depth += 1
        try:
            return self._negated()
        finally:
            self.depth -= 1

    def _negated(self) -> Match:
        if self.depth > MAX_DEPTH:
            raise UsageError(f"-k: parentheses and `not` nest at most {MAX_DEPTH} deep")
        if self._peek() == "not":
            self._take()
            inner = self.negated()
            return lambda name: not inner(name)
        token = self._take()
        if token == "(":
            inner = self.either()
            if self._take() != ")":
                raise UsageError(f"-k {self.expression!r}: a '(' is not closed")
            return inner
        if token in (")", "and", "or"):
            raise UsageError(f"-k {self.expression!r}: unexpected {token!r}")
        word = token.lower()
        return lambda name: word in name.lower()
