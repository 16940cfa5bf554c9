"""The Python blocks of README.md, docs/language.md, docs/serve.md and docs/trace.md run as
written (docs/cookbook.md's have tests/test_cookbook.py), on the default model (the `real`
tier), each in a namespace of its own in a folder holding a copy of examples/; a block's closing
`# ...` lines are what it prints."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/language.md", "docs/serve.md", "docs/trace.md")
BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```", re.M | re.S)
# README's second block lists the API on every backend (vLLM and llama.cpp load there, each a
# tier of its own: tests/test_vllm.py, tests/backends/test_llamacpp.py run the same calls).
OVERVIEW = "vmodel = qrun.load_model"


def python_blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            if OVERVIEW not in m.group("code"):
                found.append((f"{page}:{text.count(chr(10), 0, m.start()) + 1}",
                              m.group("code")))
    return found


def promised(code: str) -> list[re.Pattern[str]]:
    """What a block says it prints: its closing `# ...` lines, each a pattern where `…` and
    `...` stand for any text, less a note after two spaces in brackets."""
    lines = code.rstrip("\n").split("\n")
    shown: list[str] = []
    while lines and lines[-1].startswith("# "):
        shown.insert(0, re.sub(r"\s{2,}\(.*\)$", "", lines.pop()[2:]))
    return [re.compile(".*".join(re.escape(part) for part in re.split(r"…|\.\.\.", line)))
            for line in shown]


def test_the_pages_have_their_blocks() -> None:
    assert len(python_blocks()) >= 6


@pytest.mark.real
@pytest.mark.parametrize("where,code", python_blocks(), ids=[w for w, _ in python_blocks()])
def test_a_python_block_runs_as_written(where: str, code: str, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    here = Path.cwd()
    out = io.StringIO()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, where, "exec"), {"__name__": "__main__"})
    finally:
        os.chdir(here)
    patterns = promised(code)
    if patterns:
        got = out.getvalue().rstrip("\n").split("\n")
        assert len(got) == len(patterns) and all(
            p.fullmatch(line) for p, line in zip(patterns, got, strict=True)), \
            f"{where} shows {[p.pattern for p in patterns]}, prints:\n{out.getvalue()}"
