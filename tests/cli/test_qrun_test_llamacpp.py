"""`qrun test examples/` on the llama.cpp backend (the default model's GGUF as shipped): the
examples' cases hold there too. Skips without llama_cpp unless QRUN_REQUIRE_LLAMACPP=1."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiers import require_llama_cpp

from qrun.cli import main

pytestmark = pytest.mark.llamacpp

require_llama_cpp()

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_the_examples_cases_pass_on_llama_cpp(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["test", str(EXAMPLES), "--backend", "llamacpp",
                 "--functions", str(EXAMPLES / "calculator.py"),
                 "--functions", str(EXAMPLES / "agent.py")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert " passed in " in out and "FAILURES" not in out
