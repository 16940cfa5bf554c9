"""Typed templates and known values on the command line (docs/language.md §4.1, §16.2): -v
values read as their declared type, a typed input that does not fit exits 2 before the model,
--check reports an unproven output at the hole, --fill gives holes their values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import record_loads, write

from qrun.cli import main

TYPED = """---
inputs:
  name: string
  count: integer = 2
  tags: list[string]?
output:
  age: integer
---
{{ name }} x{{ count }}: {{ gen age regex=INT max_tokens=3 }}"""


def test_v_values_read_as_their_declared_type(tmp_path: Path, tiny_folder: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    template = write(tmp_path, TYPED)
    code = main([template, "-v", "name=42", "-v", "count=5", "--model", tiny_folder, "--json",
                 "--fields", "text,vars,output", "--seed", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    row = json.loads(out)
    assert row["text"].startswith("42 x5: ")  # name stays a string, count is read as 5
    assert isinstance(row["output"]["age"], int)
    assert row["output"] == {"age": row["vars"]["age"]}


def test_typed_input_that_does_not_fit_exits_2_naming_the_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    template = write(tmp_path, TYPED)
    # No --model: the model is never loaded, the inputs are refused first.
    code = main([template, "-v", "name=a", "-v", 'tags:=["x", 3]'])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{template}:5:3: error: input 'tags' at [1]: 3 is not of type 'string'" in err


def test_check_reports_an_unproven_output_at_the_hole(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    template = write(tmp_path, "---\noutput:\n  age: integer\n---\nAge: {{ gen age }}")
    assert main([template, "--check"]) == 2
    err = capsys.readouterr().err
    assert f"{template}:5:6: error: output 'age' is not proven to be integer" in err
    assert "any text" in err


def test_check_of_a_typed_template(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([write(tmp_path, TYPED), "--check"]) == 0
    assert "ok (1 hole, inputs: name, count (optional), tags (optional))" in capsys.readouterr().out


def test_fill_gives_a_hole_its_value(tmp_path: Path, tiny_folder: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    template = write(tmp_path, "A: {{ gen a regex=INT }}\nB: {{ gen b max_tokens=3 }}\n"
                     "{% for i in range(2) %}{{ gen c regex=INT max_tokens=2 }};{% endfor %}")
    code = main([template, "--model", tiny_folder, "--json", "--fields", "text,vars,holes",
                 "--fill", "a=17", "--fill", "c:=[1, 2]"])
    out, err = capsys.readouterr()
    assert code == 0, err
    row = json.loads(out)
    assert row["text"].startswith("A: 17\nB: ")
    assert row["text"].endswith("1;2;")
    assert row["vars"]["a"] == 17 and row["vars"]["c"] == [1, 2]
    assert row["holes"]["a"]["finish"] == "filled"
    assert row["holes"]["b"]["finish"] != "filled"


@pytest.mark.parametrize(("fill", "message"), [
    ("a=x", "the value 'x' for hole 'a' does not match its constraint regex=INT"),
    ("z=1", "no hole of that name"),
    ("a", "--fill expects NAME=VALUE"),
    ("a:=[1", "--fill a:=[1"),
])
def test_bad_fill_exits_2(tmp_path: Path, tiny_folder: str, fill: str, message: str,
                          capsys: pytest.CaptureFixture[str]) -> None:
    template = write(tmp_path, "A: {{ gen a regex=INT }}")
    assert main([template, "--model", tiny_folder, "--fill", fill]) == 2
    err = capsys.readouterr().err
    assert message in err and "internal error" not in err


def test_a_fill_that_does_not_fit_is_refused_before_the_weights_load(
        tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # issue #38: the value was checked when the run began, after the model had loaded. It is
    # checked on the tokenizer alone now (max_tokens counts its tokens); a good one then
    # loads the weights and runs.
    loaded = record_loads(monkeypatch)
    template = write(tmp_path, "A: {{ gen a regex=INT max_tokens=2 }} {{ gen b max_tokens=1 }}")
    assert main([template, "--model", tiny_folder, "--fill", "a=x"]) == 2
    assert "does not match its constraint regex=INT" in capsys.readouterr().err
    assert loaded == [False]
    assert main([template, "--model", tiny_folder, "--fill", "a=123456"]) == 2
    assert "over its max_tokens=2" in capsys.readouterr().err
    assert loaded == [False, False]
    assert main([template, "--model", tiny_folder, "--fill", "a=17"]) == 0
    assert capsys.readouterr().out.startswith("A: 17 ")
    assert loaded == [False, False, False, True]


def test_check_lists_inputs_that_have_defaults_as_optional(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # issue #38: every input typed with a default printed "inputs: none".
    template = write(tmp_path, '---\ninputs:\n  name: {type: string, default: "Ada"}\n'
                               "  n: {type: integer, default: 2}\n---\n"
                               "Hi {{ name }} x{{ n }}: {{ gen a max_tokens=2 }}")
    assert main([template, "--check"]) == 0
    assert capsys.readouterr().out == (
        f"{template}: ok (1 hole, inputs: name (optional), n (optional))\n")
