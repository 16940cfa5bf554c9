"""`qrun FILE --functions FILE.py` (docs/language.md §16.2, §22): host functions come only from
a file named on the command line; --check knows their names and arguments, and without the
flag a call to one is an error that names the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import write

from qrun.cli import main

FUNCTIONS = '''
import qrun

functions = qrun.Functions()

@functions.register
def double(x: int) -> int:
    return 2 * x
'''


def functions_file(tmp_path: Path, text: str = FUNCTIONS) -> str:
    path = tmp_path / "fns.py"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_check_without_functions_names_the_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "{{ double(2) }}")
    assert main([path, "--check"]) == 2
    err = capsys.readouterr().err
    assert "unknown function 'double'" in err and "--functions FILE.py" in err


def test_check_with_functions_knows_names_and_arities(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fns = functions_file(tmp_path)
    assert main([write(tmp_path, "{{ double(2) }}"), "--check", "--functions", fns]) == 0
    assert ": ok (0 holes" in capsys.readouterr().out
    bad = write(tmp_path, "x\n{{ double(1, 2) }}", "bad.tmpl")
    assert main([bad, "--check", "--functions", fns]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2:4: error: double() takes 1 argument, got 2" in err


def test_a_run_calls_the_files_functions(
        tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "{{ double(n) }}")
    code = main([path, "--functions", functions_file(tmp_path), "-v", "n:=21", "--json",
                 "--model", tiny_folder, "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert json.loads(out)["text"] == "42"


@pytest.mark.parametrize(("text", "message"), [
    (None, "no such file"),
    ("x = 1\n", "defines no `functions`"),
    ("raise RuntimeError('broken')\n", "importing it failed: RuntimeError: broken"),
    # sys.exit() at import ended qrun at once, exit 0 and nothing printed (issue #38).
    ("import sys\nsys.exit(0)\n", "importing it called sys.exit(0)"),
    ("raise SystemExit('bye')\n", "sys.exit('bye')"),
    ("functions = 3\n", "functions must be a qrun.Functions or a dict"),
    ("functions = {'len': len}\n", "is a builtin's or reserved"),
    ("functions = {'calc': 3}\n", "fns.py: host function 'calc' must be callable, got int"),
])
def test_a_bad_functions_file_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None,
        message: str) -> None:
    fns = functions_file(tmp_path, text) if text is not None else str(tmp_path / "none.py")
    assert main([write(tmp_path, "hi"), "--check", "--functions", fns]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_failed_run_with_json_prints_its_error_row(
        tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #38 item 8: `--json` printed nothing on stdout for a run that failed, where a
    failed `--inputs` line is an error row; a script reading rows got nothing to read."""
    fns = functions_file(tmp_path, "def boom():\n    raise ValueError('nope')\n"
                                   "functions = {'boom': boom}\n")
    path = write(tmp_path, "Hi {{ who }}: {{ boom() }}")
    code = main([path, "--functions", fns, "-v", "who=Ada", "--json", "--id", "who",
                 "--model", tiny_folder, "--quiet"])
    out, err = capsys.readouterr()
    assert code == 1
    row = json.loads(out)
    assert row["id"] == "Ada" and "boom() failed: ValueError: nope" in row["error"]
    assert "boom() failed" in err  # the message on stderr as before
