"""JSON rows shaped for post-processing (issue #15 item 2: `--id`, `--fields`) and the
compiled program printed by `--dump` (item 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import QA, rows, write

from qrun.api import Query
from qrun.cli import main
from qrun.lang.ir_dump import dump_program

LOOP = ('{% for i in range(2) %}{{ select pick options=["yes", "no"] }}{% endfor %}'
        ' {{ gen word regex="[a-z]{2}" }}')


def test_id_echoes_an_input_field_on_results_and_errors(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"id": 17, "question": "a"}\n{"id": "x-2"}\n{"question": "c"}\nnope\n')
    code = main([write(tmp_path, QA), "--inputs", str(lines), "--model", tiny_folder, "--id",
                 "id", "--fields", "vars"])
    printed = rows(capsys.readouterr().out)
    assert code == 1
    assert [list(r)[0] for r in printed] == ["id"] * 4  # "id" comes first
    assert printed[0]["id"] == 17 and set(printed[0]) == {"id", "vars"}
    assert printed[1]["id"] == "x-2" and "missing input 'question'" in printed[1]["error"]
    assert printed[2]["id"] is None and "answer" in printed[2]["vars"]
    assert printed[3] == {"id": None, "error": printed[3]["error"], "line": 4}


def test_fields_choose_what_each_row_holds(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([write(tmp_path, LOOP), "--model", tiny_folder, "--json", "--fields",
                 "holes,vars", "--id", "who", "-v", "who=me"])
    row = json.loads(capsys.readouterr().out)
    assert code == 0
    assert list(row) == ["id", "holes", "vars"]
    assert row["id"] == "me"
    picks, word = row["holes"]["pick"], row["holes"]["word"]
    assert [p["kind"] for p in picks] == ["select", "select"]  # a loop's records: a list
    assert [p["value"] for p in picks] == row["vars"]["pick"]
    assert sum(picks[0]["option_probs"].values()) == pytest.approx(1.0, abs=1e-5)
    assert word["kind"] == "gen" and word["value"] == row["vars"]["word"]
    assert word["constraint"] is not None
    assert len(word["token_ids"]) == len(word["logprobs"]) == len(word["forced"])
    # A forced token made no choice: its log-probability is null, never NaN.
    assert all((lp is None) == forced for lp, forced in zip(word["logprobs"], word["forced"],
                                                            strict=True))


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--fields", "text,answer", "--json"], "--fields: choose among text, vars, stats, holes"),
     (["--fields", ",", "--json"], "--fields"),
     (["--id", "question"], "give --json or --inputs"),
     (["--fields", "vars"], "give --json or --inputs")],
)
def test_bad_row_options(tmp_path: Path, args: list[str], message: str,
                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main([write(tmp_path, QA), "-v", "question=x", *args]) == 2
    assert message in capsys.readouterr().err


def test_dump_prints_the_compiled_program_without_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, QA)
    # A model that does not exist: --dump never looks at it, nor at the inputs.
    code = main([path, "--dump", "--model", str(tmp_path / "absent")])
    out = capsys.readouterr().out
    assert code == 0
    assert out == dump_program(Query.from_file(path).program) + "\n"
    assert "gen answer" in out and "@2:8" in out


def test_dump_of_a_broken_template_is_the_compile_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([write(tmp_path, "{{ gen }}"), "--dump"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and ":1:" in captured.err
