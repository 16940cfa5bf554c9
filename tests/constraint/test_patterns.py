"""The stdlib pattern table: every named pattern compiles to a small DFA and accepts/rejects
exactly what its comment in qrun/constraint/patterns.py promises (checked against the DFA and
against `regex.fullmatch`)."""

from __future__ import annotations

import pytest
import regex

from qrun.constraint.patterns import PATTERNS
from qrun.regex.dfa import compile_dfa

TABLE: list[tuple[str, str, bool]] = [
    ("INT", "0", True),
    ("INT", "-42", True),
    ("INT", "1234567890", True),
    ("INT", "007", False),
    ("INT", "+1", False),
    ("INT", "-0", True),
    ("INT", "1_000", False),
    ("INT", "", False),
    ("INT", "1e3", False),
    ("FLOAT", "0", True),
    ("FLOAT", "-3.25", True),
    ("FLOAT", "6.02e23", True),
    ("FLOAT", "1E-7", True),
    ("FLOAT", ".5", False),
    ("FLOAT", "5.", False),
    ("FLOAT", "NaN", False),
    ("FLOAT", "01.5", False),
    ("FLOAT", "+1.0", False),
    ("BOOL", "true", True),
    ("BOOL", "false", True),
    ("BOOL", "True", False),
    ("BOOL", "yes", False),
    ("BOOL", "1", False),
    ("DATE", "2024-01-31", True),
    ("DATE", "1999-12-01", True),
    ("DATE", "2023-02-30", False),
    ("DATE", "2024-02-29", True),
    ("DATE", "2000-02-29", True),
    ("DATE", "1900-02-29", False),
    ("DATE", "2023-02-29", False),
    ("DATE", "2023-04-31", False),
    ("DATE", "2023-12-31", True),
    ("DATE", "0000-01-01", False),
    ("DATE", "0001-01-01", True),
    ("DATE", "2024-13-01", False),
    ("DATE", "2024-00-10", False),
    ("DATE", "2024-01-32", False),
    ("DATE", "20240131", False),
    ("DATE", "24-01-31", False),
    ("DATE", "2024-1-31", False),
    ("TIME", "00:00", True),
    ("TIME", "23:59:59", True),
    ("TIME", "12:30:15.123", True),
    ("TIME", "24:00", False),
    ("TIME", "12:60", False),
    ("TIME", "12:30:60", False),
    ("TIME", "7:30", False),
    ("TIME", "12:30Z", False),
    ("DATETIME", "2024-01-31T12:30:00Z", True),
    ("DATETIME", "2024-01-31T12:30:00.5+05:30", True),
    ("DATETIME", "2024-01-31T23:59:59-08:00", True),
    ("DATETIME", "2024-01-31 12:30:00Z", False),
    ("DATETIME", "2024-01-31T12:30:00", False),
    ("DATETIME", "2024-01-31t12:30:00z", False),
    ("DATETIME", "2024-01-31T12:30Z", False),
    ("EMAIL", "john.doe@example.com", True),
    ("EMAIL", "a+tag@mail.co.uk", True),
    ("EMAIL", "x_y-z@sub-domain.example.org", True),
    ("EMAIL", "john@localhost", False),
    ("EMAIL", "john..doe@example.com", False),
    ("EMAIL", ".john@example.com", False),
    ("EMAIL", '"john"@example.com', False),
    ("EMAIL", "john@-example.com", False),
    ("EMAIL", "jöhn@example.com", False),
    ("EMAIL", "john@example.c", False),
    ("URL", "https://example.com", True),
    ("URL", "http://localhost:8080/a/b?q=1&r=2#top", True),
    ("URL", "https://192.168.0.1/x%20y", True),
    ("URL", "https://example.com/", True),
    ("URL", "ftp://example.com", False),
    ("URL", "https://exa mple.com", False),
    ("URL", "https://example.com/a b", False),
    ("URL", "https://user@example.com", False),
    ("URL", "example.com", False),
    ("URL", "https://example.com/%zz", False),
    ("UUID", "123e4567-e89b-12d3-a456-426614174000", True),
    ("UUID", "123E4567-E89B-12D3-A456-426614174000", True),
    ("UUID", "123e4567e89b12d3a456426614174000", False),
    ("UUID", "{123e4567-e89b-12d3-a456-426614174000}", False),
    ("UUID", "123e4567-e89b-12d3-a456-42661417400g", False),
    ("PHONE_US", "(415) 555-2671", True),
    ("PHONE_US", "415-555-2671", True),
    ("PHONE_US", "+1 415.555.2671", True),
    ("PHONE_US", "4155552671", True),
    ("PHONE_US", "415 555 2671", True),
    ("PHONE_US", "415-555.2671", False),
    ("PHONE_US", "115-555-2671", False),
    ("PHONE_US", "555-2671", False),
    ("PHONE_US", "415-555-2671 x12", False),
    ("WORD", "hello", True),
    ("WORD", "well-known", True),
    ("WORD", "don't", True),
    ("WORD", "two words", False),
    ("WORD", "abc1", False),
    ("WORD", "-dash", False),
    ("WORD", "café", False),
    ("WORD", "", False),
    ("LINE", "Anything at all, even émoji 😀", True),
    ("LINE", "x", True),
    ("LINE", "", False),
    ("LINE", "two\nlines", False),
    ("LINE", "cr\r", False),
]


def test_table_covers_every_pattern() -> None:
    assert {name for name, _, _ in TABLE} == set(PATTERNS)
    for name in PATTERNS:
        rows = [ok for n, _, ok in TABLE if n == name]
        assert True in rows and False in rows, f"{name} needs accept and reject rows"


@pytest.mark.parametrize(("name", "text", "expected"), TABLE)
def test_pattern_table(name: str, text: str, expected: bool) -> None:
    pattern = PATTERNS[name]
    assert (regex.fullmatch(pattern, text, flags=regex.ASCII) is not None) == expected
    assert compile_dfa(pattern).matches(text.encode()) == expected


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_every_pattern_compiles_small(name: str) -> None:
    dfa = compile_dfa(PATTERNS[name])
    assert 1 <= dfa.num_states <= 64
