"""regex -> byte DFA: agreement with `regex.fullmatch(p, s, flags=regex.ASCII)`, UTF-8 lifting,
anchors, refused constructs, forced bytes and distances."""

from __future__ import annotations

import pytest
import regex
from hang import alarm
from hypothesis import given, settings
from hypothesis import strategies as st

from qrun.regex import PatternError, compile_dfa

CASES: list[tuple[str, str, bool]] = [
    (r"abc", "abc", True),
    (r"abc", "abcd", False),
    (r"abc", "ab", False),
    (r"a|", "", True),
    (r"(x|xy)z?", "xy", True),
    (r"(x|xy)z?", "xyz", True),
    (r"([a-z]\.)*[a-z]", "b.c", True),
    (r"a*?b", "aaab", True),
    (r"a{2,3}", "a", False),
    (r"a{2,3}", "aaa", True),
    (r"a{2,3}", "aaaa", False),
    (r"a{,2}", "", True),
    (r"a{2,}", "aaaaa", True),
    (r"\d+", "0123", True),
    (r"\d", "\u0663", False),  # ARABIC-INDIC DIGIT THREE: \d is ASCII
    (r"\w+", "a_Z9", True),
    (r"\w", "é", False),
    (r"\s", "\x0b", True),
    (r"\s", "\xa0", False),
    (r"\S", "é", True),
    (r"\D\W", "éé", True),
    (r".", "\n", False),
    (r"(?s).", "\n", True),
    (r"(?s:.)a", "\na", True),
    (r".", "é", True),
    (r".", "😀", True),
    (r".", "ab", False),
    (r"[^a]", "😀", True),
    (r"[^a]", "a", False),
    (r"(?i)abc", "AbC", True),
    (r"(?i)[a-c]+", "ABCabc", True),
    (r"(?i)é", "É", False),  # case folding is ASCII-only
    (r"(?i:a)b", "AB", False),
    (r"[é-ë]+", "éêë", True),
    (r"[é-ë]", "ì", False),
    (r"中文", "中文", True),
    (r"[\u4e00-\u9fff]+", "中文字", True),
    (r"[\x00-\U0010FFFF]*", "any 😀 text\n", True),
    (r"^ab$", "ab", True),
    (r"a$", "a\n", False),
    (r"a$\n", "a\n", True),
    (r"a\Z", "a", True),
    (r"\Aab", "ab", True),
    (r"(^a|b)+", "ab", True),
    (r"(^a|b)+", "ba", False),
    (r"x*$", "", True),
    (r"\x41\101\u0042\N{LATIN SMALL LETTER A}", "AAB" + "a", True),
    (r"[\]\-^]+", "]-^", True),
    (r"(?x) a b  # comment", "ab", True),
    (r"(?P<year>\d{4})-(?:\d\d)", "2024-01", True),
    (r"[^\n\r]+", "line", True),
    (r"[^\n\r]+", "a\rb", False),
]


@pytest.mark.parametrize(("pattern", "text", "expected"), CASES)
def test_dfa_agrees_with_regex(pattern: str, text: str, expected: bool) -> None:
    reference = regex.fullmatch(pattern, text, flags=regex.ASCII) is not None
    assert reference == expected, "the table itself is wrong"
    assert compile_dfa(pattern).matches(text.encode()) == expected


REFUSED = [
    (r"(a)\1", "backreferences"),
    (r"(?P<x>a)(?P=x)", "backreferences"),
    (r"a(?=b)", "lookahead"),
    (r"(?=ab)a.", "lookahead"),
    (r"a(?!b)", "negative lookahead"),
    (r"(?<=a)b", "lookbehind"),
    (r"(?<!a)b", "negative lookbehind"),
    (r"\bword\b", "word boundaries"),
    (r"a\B", "non-word boundaries"),
    (r"(?>ab)", "atomic groups"),
    (r"a*+", "possessive"),
    (r"a++b", "possessive"),
    (r"(a)?(?(1)b|c)", "conditional"),
    (r"\p{L}+", "Unicode properties"),
    (r"\X", "grapheme"),
    (r"(?:abc){e<=1}", "fuzzy"),
    (r"(?m)^a$", "multiline anchors"),
    (r"(", "invalid regex"),
    (r"[z-a]", "invalid regex"),
    (r"a{3,2}", "invalid regex"),
    (r"[^\x00-\U0010FFFF]", "matches nothing"),
    (r"a\Zb", "matches nothing"),
]


@pytest.mark.parametrize(("pattern", "fragment"), REFUSED)
def test_refused_constructs_name_themselves(pattern: str, fragment: str) -> None:
    with pytest.raises(PatternError, match=fragment):
        compile_dfa(pattern)


def test_state_cap() -> None:
    with pytest.raises(PatternError, match="more than 100 DFA states"):
        compile_dfa(r"(a|b)*a(a|b){8}", max_states=100)  # needs 2**9 states


def test_nfa_cap() -> None:
    with pytest.raises(PatternError, match="too large"):
        compile_dfa(r"\d{1,5000}", max_nfa_states=1000)


def test_utf8_lift_is_exact() -> None:
    dot = compile_dfa(r".*")
    for text in ["é", "中", "😀", "\U0010ffff", "\ud7ff", "\ue000"]:
        assert dot.matches(text.encode())
    # Invalid UTF-8: stray continuation, overlong, surrogate, beyond U+10FFFF, bad lead bytes.
    for data in [b"\x80", b"\xc0\x80", b"\xc1\xbf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xff"]:
        assert not dot.matches(data)
        assert dot.step(dot.start, data) == dot.dead
    # A token that splits a character leads to a live state.
    assert dot.step(dot.start, b"\xf0\x9f") != dot.dead
    assert not dot.accepting[dot.step(dot.start, b"\xf0\x9f")]


def test_dfa_is_minimal_and_coreachable() -> None:
    date = compile_dfa(r"\d{4}-\d{2}-\d{2}")
    assert date.num_states == 11
    assert compile_dfa(r"[0-9]+").num_states == 2
    assert compile_dfa(r"(a|b)*abb").num_states == 4
    for pattern in [r"\d{4}-\d{2}-\d{2}", r"a+b|a+c", r"[^a]*z", r"(x|xy)z?"]:
        d = compile_dfa(pattern)
        live = d.transitions[: d.dead] != d.dead
        # Every live state reaches acceptance (finite distance), dead maps to itself.
        assert (d.dist[: d.dead] < 10**6).all()
        assert (d.transitions[d.dead] == d.dead).all()
        assert (live.any(axis=1) | d.accepting[: d.dead]).all()


def test_arrays_are_read_only() -> None:
    d = compile_dfa("ab")
    with pytest.raises(ValueError):
        d.transitions[0, 0] = 1


def test_forced_bytes_and_distance() -> None:
    d = compile_dfa(r'\{"name": "[a-z]+"\}')
    assert d.forced_bytes(d.start) == b'{"name": "'
    assert d.dist_to_accept(d.start) == len('{"name": "a"}')
    inside = d.step(d.start, b'{"name": "jo')
    assert d.forced_bytes(inside) == b""
    assert d.dist_to_accept(inside) == 2
    assert d.forced_bytes(d.step(d.start, b'{"name": "jo"')) == b"}"
    # Forcing stops at an accepting state and at a choice.
    assert compile_dfa(r"ab(c)?").forced_bytes(0) == b"ab"
    assert compile_dfa(r"a(b|c)").forced_bytes(0) == b"a"


_ATOMS = st.sampled_from(
    ["a", "b", "c", ".", "[ab]", "[^a]", r"\d", "é", "😀", "(a|bc)", "(b|)", "[a-cé]"]
)


@st.composite
def _regexes(draw: st.DrawFn) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        atom = draw(_ATOMS)
        parts.append(atom + draw(st.sampled_from(["", "*", "+", "?", "{1,2}", "*?"])))
    body = "".join(parts)
    if draw(st.booleans()):
        body = body + "|" + draw(_ATOMS)
    return body


@settings(max_examples=150, deadline=None)
@given(
    _regexes(), st.lists(st.sampled_from(["a", "b", "c", "1", "é", "😀", "\n", "x"]), max_size=6)
)
def test_random_regexes_agree_with_regex(pattern: str, chars: list[str]) -> None:
    text = "".join(chars)
    expected = regex.fullmatch(pattern, text, flags=regex.ASCII) is not None
    assert compile_dfa(pattern).matches(text.encode()) == expected


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [(r"a^b", "matches nothing"), (r"[[:alpha:]]+", "POSIX"), (r"(?:ab){i<=1,d<=1}", "fuzzy")],
)
def test_more_refusals(pattern: str, fragment: str) -> None:
    with pytest.raises(PatternError, match=fragment):
        compile_dfa(pattern)


@pytest.mark.parametrize(
    ("pattern", "text"),
    [(r"a{2}[{e}]", "aa{"), (r"[[a]+", "[a"), (r"x{,}", "xxx"), (r"a{}", "a{}")],
)
def test_braces_and_brackets_that_are_not_regex_extensions(pattern: str, text: str) -> None:
    assert regex.fullmatch(pattern, text, flags=regex.ASCII)
    assert compile_dfa(pattern).matches(text.encode())


@pytest.mark.parametrize(("pattern", "states"), [
    ("x{19999}", 20_000), ("[a-z0-9]{1,19999}", 20_000), ("(ab){3000}", 6_001),
    ("[0-9]{2,4}(-[0-9]{2,4}){1,3}", None),
])
def test_long_bounded_repeats_minimise_without_one_round_per_state(
        pattern: str, states: int | None) -> None:
    # Minimisation started from accepting/not, so a chain of n states took n rounds
    # (quadratic: x{19999} compiled for over a minute). Starting from the distance to
    # acceptance and the longest word left, it takes a few; the automaton is still the
    # minimal one (n + 1 live states for x{n}), and the language unchanged.
    with alarm(20):
        dfa = compile_dfa.__wrapped__(pattern)
    if states is not None:
        assert dfa.num_states == states
    for text in ["x" * 19999, "x" * 19998, "a1" * 10, "ab" * 3000, "12-345-67", "1-2"]:
        assert dfa.matches(text.encode()) == bool(regex.fullmatch(pattern, text)), text
