"""qrun/source.py: lines split on "\\n" only, positions from a line-start index computed once,
spans clamped to the text, and excerpts with a caret."""

from __future__ import annotations

import dataclasses
import pickle
import time

import pytest

from qrun.source import EXCERPT_WIDTH, Source, Span, excerpt


def test_lines_split_on_newline_only() -> None:
    source = Source("t", "a\x0cb\u2028c\x1cd\x85e\nsecond\rstill second\nthird")
    assert source.line_text(1) == "a\x0cb\u2028c\x1cd\x85e"
    assert source.line_text(2) == "second\rstill second"
    assert source.line_text(3) == "third"
    assert source.position(len(source.text)) == (3, 6)


def test_line_text_drops_the_cr_of_crlf_only() -> None:
    source = Source("t", "one\r\ntwo\r\n\r\nlast\r")
    assert [source.line_text(n) for n in range(1, 5)] == ["one", "two", "", "last\r"]


@pytest.mark.parametrize("line", [0, -1, 4, 100])
def test_line_text_out_of_range_is_empty(line: int) -> None:
    assert Source("t", "a\nb\nc").line_text(line) == ""


def test_trailing_newline_starts_an_empty_last_line() -> None:
    source = Source("t", "a\n")
    assert source.line_text(2) == ""
    assert source.position(2) == (2, 1)
    assert Source("t", "").position(0) == (1, 1)


def test_positions_are_one_based_characters() -> None:
    source = Source("t", "héllo\n✓ {{ x }}")
    assert source.position(0) == (1, 1)
    assert source.position(5) == (1, 6)  # the newline itself ends line 1
    assert source.position(6) == (2, 1)
    assert source.position(8) == (2, 3)


def test_span_at_and_end_span() -> None:
    source = Source("t", "ab\ncd")
    assert source.span_at(1, 3) == Span(1, 4, 1, 2, 2, 2)
    assert source.span_at(4, 99) == Span(4, 5, 2, 2, 2, 3)  # clamped to the text
    assert source.span_at(-5, 1) == Span(0, 1, 1, 1, 1, 2)
    assert source.end_span() == Span(5, 5, 2, 3, 2, 3)
    assert str(source.span_at(3)) == "2:1"


def test_positions_agree_with_a_naive_count() -> None:
    text = "x\n\ny\r\n  z\x0c\n" * 7 + "end"
    source = Source("t", text)
    for offset in range(len(text) + 1):
        line = text.count("\n", 0, offset) + 1
        column = offset - (text.rfind("\n", 0, offset) + 1) + 1
        assert source.position(offset) == (line, column), offset


def test_line_index_is_computed_once_and_lookups_are_fast() -> None:
    text = "some text {{ x }}\n" * 200_000
    source = Source("big", text)
    start = time.perf_counter()
    spans = [source.span_at(offset, 5) for offset in range(0, len(text), 97)]
    elapsed = time.perf_counter() - start
    assert spans[-1].line == 1 + text.count("\n", 0, spans[-1].start)
    assert source.line_starts() is source.line_starts()
    assert elapsed < 2, elapsed  # a rescan per span would take minutes


def test_public_shape_is_kept() -> None:
    source = Source("name.tmpl", "text")
    source.position(2)  # fills the lazy index
    assert source == Source("name.tmpl", "text")
    assert hash(source) == hash(Source("name.tmpl", "text"))
    assert repr(source) == "Source(name='name.tmpl', text='text')"
    assert pickle.loads(pickle.dumps(source)) == source
    with pytest.raises(dataclasses.FrozenInstanceError):
        source.text = "other"  # type: ignore[misc]


def test_excerpt_points_at_the_span() -> None:
    source = Source("t", "first\r\n\tsecond {{ x }}\r\n")
    span = source.span_at(source.text.index("{{"), 7)
    assert excerpt(source, span) == "  \tsecond {{ x }}\n  \t       ^~~~~~~"


@pytest.mark.parametrize("column", [1, 30, 2_000, 3_990, 4_000])
def test_a_long_line_is_cut_to_a_window_around_the_span(column: int) -> None:
    line = "".join(chr(ord("a") + i % 26) for i in range(4_000))
    source = Source("t", line + "\n")
    span = source.span_at(column - 1, 3)
    shown, caret = excerpt(source, span).split("\n")
    assert len(shown) <= 2 + EXCERPT_WIDTH + 2  # the indent, the window, a '…' at each cut
    assert shown.startswith("  …") == (column > 41) and shown.endswith("…") == (column < 3_881)
    at = caret.index("^")
    # The caret stands under the span's first character, the tildes under the rest of it.
    assert shown[at:at + 3] == line[column - 1:column + 2][:len(shown) - at]
    assert caret[at:] == "^" + "~" * (min(3, 4_001 - column) - 1)


def test_a_line_of_exactly_the_width_is_not_cut() -> None:
    line = "x" * EXCERPT_WIDTH
    assert excerpt(Source("t", line), Source("t", line).span_at(EXCERPT_WIDTH - 1, 1)) == (
        f"  {line}\n  {' ' * (EXCERPT_WIDTH - 1)}^")
