"""`--inputs` loses nothing (issue #12 item 4): every hostile line gets its own error with its
line number in the file and every other line its result, in order; the same values through
-v and --vars are usage errors; qrun's JSON output reads back line by line."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import rows, write

from qrun.cli import main

ECHO = "Q: {{ q }}|{{ gen a max_tokens=2 }}"
# (line as bytes, None when the line runs, else a piece of its error)
HOSTILE: list[tuple[bytes, str | None]] = [
    (b'\xef\xbb\xbf{"q": "after a BOM"}', None),  # a BOM opening the file is skipped
    (b'{"q": "bad \xff byte"}', "invalid UTF-8 at byte 12"),
    (b'{"q": 1, "n": ' + b"7" * 5000 + b"}", "more than 4300 digits"),
    (b"[" * 1000 + b"]" * 1000, "nested deeper than 100 levels"),
    (b'{"q": "\\ud800"}', "lone surrogate \\ud800"),
    ('{"q": "line\u2028sep"}'.encode(), None),  # valid JSON: U+2028 may stand in a string
    ('{"q": "next\u0085line"}'.encode(), None),  # U+0085 too
    (b'{"q": "form\x0cfeed"}', "Invalid control character"),  # raw control: not JSON
    (b"", None),  # blank: not a run, but it counts for the numbers
    (b'{"q": NaN}', "NaN is not a JSON number"),
    (b'{"q": 1e999}', "too large for a float"),
    (b'["not", "an object"]', "must be a JSON object, not a list"),
    (b'{"q": "windows line"}\r', None),
    (b'{"q": "\\u2029 escaped"}', None),
]


def hostile_file(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(line for line, _ in HOSTILE) + b"\n")
    return path


@pytest.mark.parametrize("batch_size", ["1", "3"])
def test_each_hostile_line_fails_alone_with_its_line_number(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str], batch_size: str
) -> None:
    code = main([write(tmp_path, ECHO), "--inputs", str(hostile_file(tmp_path)), "--model",
                 tiny_folder, "--batch-size", batch_size, "--quiet"])
    out = capsys.readouterr().out
    printed = rows(out)
    expected = [(number, error) for number, (line, error) in enumerate(HOSTILE, start=1)
                if line.strip()]
    assert code == 1
    assert len(printed) == len(expected)
    for row, (number, error) in zip(printed, expected, strict=True):
        if error is None:
            assert "error" not in row, row
            assert row["text"].startswith("Q: ")
        else:
            assert row["line"] == number
            assert error in row["error"]
            assert row["error"].startswith(f"{tmp_path / 'in.jsonl'}:{number}: ")
    texts = [r["text"] for r in printed if "text" in r]
    assert texts[0].startswith("Q: after a BOM|")
    assert texts[1].startswith("Q: line\u2028sep|") and texts[2].startswith("Q: next\u0085line|")
    assert texts[4].startswith("Q: \u2029 escaped|")
    # The output has no raw line separators: any line splitter reads it back.
    assert len(out.splitlines()) == len(printed)
    assert "\u2028" not in out and "\u2029" not in out and "\x85" not in out


def test_output_reads_back_as_inputs(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "first.jsonl"
    first.write_text('{"q": "a\u2028b\u2029c\u0085d"}\n{"q": "plain"}\n', encoding="utf-8")
    assert main([write(tmp_path, ECHO), "--inputs", str(first), "--model", tiny_folder,
                 "--fields", "text,vars,stats,holes"]) == 0
    again = tmp_path / "again.jsonl"
    again.write_text(capsys.readouterr().out, encoding="utf-8")
    code = main([write(tmp_path, "{{ text }}", "echo.tmpl"), "--inputs", str(again),
                 "--model", tiny_folder])
    back = rows(capsys.readouterr().out)
    assert code == 0
    assert back[0]["text"].startswith("Q: a\u2028b\u2029c\u0085d|")
    assert back[1]["text"].startswith("Q: plain|")


def stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    """`data` as this process's standard input, for qrun.cli.main run here: a process of its
    own costs torch's and transformers' imports (7-10 s on the 2-core VM), and the console
    script as a process is run by tests/cli/test_cli.py."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_inputs_from_stdin_keep_file_line_numbers(
        tmp_path: Path, tiny_folder: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    stdin(monkeypatch, b'\n{"q": "one"}\n\n{"q": \xc3}\n{"q": "three"}')  # no final newline
    code = main([write(tmp_path, ECHO), "--inputs", "-", "--model", tiny_folder,
                 "--fields", "vars"])
    done = capsys.readouterr()
    printed = rows(done.out)
    assert code == 1, done.err
    assert [r.get("line") for r in printed] == [None, 4, None]
    assert printed[1]["error"].startswith("-:4: invalid UTF-8")
    assert "Traceback" not in done.err


@pytest.mark.parametrize(
    ("value", "message"),
    [("7" * 5000, "more than 4300 digits"), ("[" * 1000 + "]" * 1000, "deeper than 100"),
     ('"\\ud800"', "lone surrogate"), ("NaN", "NaN is not a JSON number"),
     ("-Infinity", "-Infinity is not a JSON number"), ("1e400", "too large for a float"),
     ('"a\x0cb"', "Invalid control character")],
)
def test_the_same_values_through_v_and_vars_are_usage_errors(
    tmp_path: Path, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    template = write(tmp_path, "{{ x }}")
    assert main([template, "-v", f"x:={value}"]) == 2
    err = capsys.readouterr().err
    assert message in err and "internal error" not in err
    assert len(err) < 400  # the value is cut in the message, not printed whole
    vars_file = tmp_path / "v.json"
    vars_file.write_text(f'{{"x": {value}}}', encoding="utf-8")
    assert main([template, "--vars", str(vars_file)]) == 2
    err = capsys.readouterr().err
    assert message in err and "internal error" not in err


@pytest.mark.parametrize("flag", ["--vars", "--inputs"])
def test_an_endless_inputs_file_is_refused(tmp_path: Path, flag: str,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    # /dev/zero never ends: it was read until memory ran out. (The limit is lowered here so
    # the test reads 1 KiB, not 256 MiB.)
    monkeypatch.setattr("qrun.cli.command.MAX_INPUT_BYTES", 1024)
    template = write(tmp_path, "{{ x }}")
    assert main([template, flag, "/dev/zero"]) == 2
    err = capsys.readouterr().err
    assert f"{flag}: /dev/zero holds more than 1,024 bytes" in err


def test_vars_file_with_bad_utf8_or_a_bom(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    template = write(tmp_path, "x={{ x }}")
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"x": "\xff"}')
    assert main([template, "--vars", str(bad)]) == 2
    assert "invalid UTF-8 at byte 8" in capsys.readouterr().err
    bom = tmp_path / "bom.json"
    bom.write_bytes(b'\xef\xbb\xbf{"x": 1}')
    assert main([template, "--vars", str(bom), "--model", tiny_folder]) == 0
    assert capsys.readouterr().out == "x=1\n"


def test_a_command_line_that_is_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    # Python hands undecodable argv bytes over as lone surrogates (PEP 383).
    done = subprocess.run([sys.executable, "-m", "qrun.cli", write(tmp_path, "{{ x }}").encode(),
                           b"-v", b"x=caf\xe9"], capture_output=True, check=False)
    err = done.stderr.decode("utf-8")
    assert done.returncode == 2
    assert "-v x: a string holds the lone surrogate \\udce9" in err
    assert "Traceback" not in err


def test_json_output_is_one_line_without_raw_separators(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([write(tmp_path, ECHO), "-v", "q=a\u2028b", "--model", tiny_folder, "--json",
                 "--fields", "text,holes"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("\n") == 1 and len(out.splitlines()) == 1
    assert "\u2028" not in out
    row = json.loads(out)
    assert row["text"].startswith("Q: a\u2028b|")
    assert set(row) == {"text", "holes"}


def test_the_template_from_standard_input(
        tmp_path: Path, tiny_folder: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`qrun -` reads the template from standard input (issue #38 item 8), compiled as
    <stdin> with its includes from the working folder."""
    (tmp_path / "part.tmpl").write_text("and {{ who }}")
    monkeypatch.chdir(tmp_path)
    stdin(monkeypatch, b'Hello {% include "part.tmpl" %}: {{ gen g regex="[a-z]{2}" }}.')
    code = main(["-", "-v", "who=Ada", "--model", tiny_folder, "--json"])
    done = capsys.readouterr()
    assert code == 0, done.err
    row = json.loads(done.out)
    assert row["text"].startswith("Hello and Ada: ") and len(row["vars"]["g"]) == 2
    stdin(monkeypatch, b"Hi {{ who }.")
    assert main(["-", "--check"]) == 2
    assert capsys.readouterr().err.startswith("<stdin>:1:")
    stdin(monkeypatch, b"Hi.")
    assert main(["-", "--inputs", "-"]) == 2
    assert "standard input" in capsys.readouterr().err
