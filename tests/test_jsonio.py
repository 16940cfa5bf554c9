"""The command line's JSON edge (qrun/jsonio.py): the strict reader's limits, line splitting,
and output that any line splitter reads back."""

from __future__ import annotations

import json
import math

import pytest

from qrun.jsonio import MAX_DEPTH, BadInput, dumps_line, parse_line, parse_value, split_lines


def test_nesting_up_to_the_limit_is_read_and_one_more_is_refused() -> None:
    deepest = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert parse_value(deepest) is not None
    with pytest.raises(BadInput, match="nested deeper than 100 levels"):
        parse_value("[" + deepest + "]")
    with pytest.raises(BadInput, match="nested deeper"):
        parse_value('{"a": ' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1))


@pytest.mark.parametrize("text", ['{"\\udfff": 1}', '["ok", {"k": "\\ud83d"}]'])
def test_lone_surrogates_are_refused_in_keys_and_nested_values(text: str) -> None:
    with pytest.raises(BadInput, match="lone surrogate"):
        parse_value(text)


def test_a_surrogate_pair_is_one_character() -> None:
    assert parse_value('"\\ud83d\\ude00"') == "\U0001F600"


def test_lines_split_at_newlines_only() -> None:
    data = "\ufeff{}\n{\"a\": \"x\u2028y\"}\r\n  \n{\"b\": \"\x85\"}".encode()
    assert list(split_lines(data)) == [
        (1, b"{}"), (2, '{"a": "x\u2028y"}'.encode()), (4, '{"b": "\x85"}'.encode())]
    assert parse_line('{"a": "x\u2028y"}'.encode()) == {"a": "x\u2028y"}
    with pytest.raises(BadInput, match="not a string"):
        parse_line(b'"text"')


def test_output_lines_read_back_with_any_splitter() -> None:
    value = {"text": "a\u2028b\u2029c\x85d\x0ce\nf", "lp": [math.nan, -math.inf, 0.5],
             "nested": {"x": math.inf}}
    line = dumps_line(value)
    assert line.splitlines() == [line]
    assert json.loads(line) == {"text": value["text"], "lp": [None, None, 0.5],
                                "nested": {"x": None}}
    assert "NaN" not in line and "Infinity" not in line
