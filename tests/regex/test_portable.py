"""Portable regexes for a server's structured outputs: the rewrite must match exactly the
strings qrun's own DFA accepts (regex.fullmatch with ASCII classes), checked here with the
`regex` package standing in for the server's engine, on the stdlib patterns and on the
constructs whose meaning differs between dialects."""

from __future__ import annotations

import re

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qrun.constraint.patterns import PATTERNS
from qrun.regex import PatternError, compile_dfa
from qrun.regex.portable import PortableError, escape, portable_regex

TRICKY = [
    r"\d+", r"\w+@\w+", r"a\sb", r"[^\d]x", r"\D\W\S", r".+", r"(?s:.+)", r"(?i)abc[d-f]",
    r"a+?b*?", r"^x{2,3}$", r"\Ay\Z", r"(ab|cd){1,2}e?", r"[\w.-]+", r"[^a-c\n]{3}",
    r"é[à-ö]+", r"\[\]\{\}\(\)\*\+\?\.\^\$\|\\/", r"[-a]", r"x{0}y", r"(?:a|)b",
]
PATTERN_LIST = sorted(PATTERNS.values()) + TRICKY


def same_language(pattern: str, text: str) -> None:
    expected = regex.fullmatch(pattern, text, flags=regex.ASCII) is not None
    assert compile_dfa(pattern).matches(text.encode()) == expected
    rewritten = portable_regex(pattern)
    got = regex.fullmatch(rewritten, text) is not None
    assert got == expected, (pattern, rewritten, text)


@pytest.mark.parametrize("pattern", PATTERN_LIST)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_rewrite_matches_what_qrun_matches(pattern: str, data: st.DataObject) -> None:
    strategy = st.one_of(
        st.from_regex(re.compile(pattern, flags=re.ASCII), fullmatch=True),
        st.text(alphabet="0123456789abcxyzé-_.@ \n\tABC", max_size=12),
        st.text(max_size=6),
    )
    same_language(pattern, data.draw(strategy))


@pytest.mark.parametrize("text", ["", "a.b", "é\n\\", "(x)*", "50% [off]", "\U0001F600"])
def test_escape_matches_exactly_its_text(text: str) -> None:
    assert regex.fullmatch(escape(text), text)
    assert not regex.fullmatch(escape(text), text + "x")


def test_unicode_digits_are_not_digits() -> None:
    # The server's engine may read \d as any Unicode digit; the rewrite says [0-9].
    assert regex.fullmatch(r"\d", "٣")  # Arabic-Indic three: a digit to `regex` by default
    assert not regex.fullmatch(portable_regex(r"\d"), "٣")


def test_an_anchor_inside_the_pattern_is_refused() -> None:
    with pytest.raises(PortableError, match="anchor"):
        portable_regex(r"a^b")


def test_unsupported_constructs_are_refused_as_for_masks() -> None:
    with pytest.raises(PatternError, match="lookahead"):
        portable_regex(r"a(?=b)")
