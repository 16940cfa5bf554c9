"""`qrun test examples/` on the llama.cpp backend (the default model's GGUF as shipped): the
examples' cases hold there too. Skips without llama_cpp unless QRUN_REQUIRE_LLAMACPP=1."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from qrun.cli import main

pytestmark = pytest.mark.llamacpp

if importlib.util.find_spec("llama_cpp") is None:
    if os.environ.get("QRUN_REQUIRE_LLAMACPP") == "1":
        raise ImportError("QRUN_REQUIRE_LLAMACPP=1 but llama_cpp is not installed "
                          "(`make llamacpp`)")
    pytest.skip("llama-cpp-python is not installed (`make llamacpp`)", allow_module_level=True)

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_the_examples_cases_pass_on_llama_cpp(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["test", str(EXAMPLES), "--backend", "llamacpp",
                 "--functions", str(EXAMPLES / "calculator.py"),
                 "--functions", str(EXAMPLES / "agent.py")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert " passed in " in out and "FAILURES" not in out
