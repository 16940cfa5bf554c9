"""Golden tests: each tests/lang/golden/<case>/template.tmpl compiles to exactly ir.txt (the
dump_program), or fails with exactly error.txt (the rendered TemplateErrors). A case includes
from its own folder.
Rewrite the expectations with `pytest tests/lang --update-golden`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qrun.errors import TemplateErrors
from qrun.lang import compile_source
from qrun.lang.ir_dump import dump_program

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "template.tmpl").exists())


def _actual(case: Path) -> tuple[str, str]:
    text = (case / "template.tmpl").read_text(encoding="utf-8")
    try:
        return "ir.txt", dump_program(compile_source(text, "template.tmpl", include_dir=case))
    except TemplateErrors as err:
        return "error.txt", str(err) + "\n"


@pytest.mark.parametrize("name", CASES)
def test_golden(name: str, update_golden: bool) -> None:
    case = GOLDEN / name
    kind, actual = _actual(case)
    expected_path = case / kind
    if update_golden:
        for stale in ("ir.txt", "error.txt"):
            if stale != kind and (case / stale).exists():
                (case / stale).unlink()
        expected_path.write_text(actual, encoding="utf-8")
    assert expected_path.exists(), f"{name}: no {kind}; run with --update-golden"
    assert actual == expected_path.read_text(encoding="utf-8")


_DUMP_ALL = """
import sys
from pathlib import Path
from qrun.errors import TemplateErrors
from qrun.lang import compile_file
from qrun.lang.ir_dump import dump_program
for case in sorted(Path(sys.argv[1]).iterdir()):
    try:
        print(dump_program(compile_file(case / "template.tmpl")))
    except TemplateErrors as err:
        print(err)
"""


def test_dump_is_deterministic_across_processes() -> None:
    # Set and dict orders follow the string hash seed, which differs between processes; the
    # golden files pin the output too, this says why a difference would show.
    outputs = {
        subprocess.run([sys.executable, "-c", _DUMP_ALL, str(GOLDEN)], capture_output=True,
                       text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed},
                       timeout=120).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1 and "inputs:" in next(iter(outputs))


def test_there_are_cases() -> None:
    assert len(CASES) >= 10
