"""docs/cookbook.md runs as written: its blocks, in page order, on the default model (the
`real` tier), in a fresh folder holding a copy of examples/. Shell blocks run in bash with this
interpreter's scripts folder first on PATH (so `qrun` is the installed console script); Python
blocks run in this process, each loading the model as written (each Query loads its own), over
the session's weights (test_doc_blocks.py weights_shared_with). Beyond running without error,
each task's promised outputs are checked: the files the shell blocks write, and the types the
Python blocks print."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_doc_blocks import promised, weights_shared_with

from qrun.backends.transformers import TransformersBackend

ROOT = Path(__file__).resolve().parents[1]
COOKBOOK = ROOT / "docs/cookbook.md"
BLOCK = re.compile(r"^```(?P<lang>sh|python)\n(?P<code>.*?)^```", re.M | re.S)


def blocks() -> list[tuple[str, str]]:
    return [(m.group("lang"), m.group("code"))
            for m in BLOCK.finditer(COOKBOOK.read_text(encoding="utf-8"))]


def test_the_cookbook_has_its_five_tasks_in_both_forms() -> None:
    text = COOKBOOK.read_text(encoding="utf-8")
    assert len(re.findall(r"^## \d\. ", text, re.M)) == 5
    langs = [lang for lang, _ in blocks()]
    assert langs.count("sh") >= 2 and langs.count("python") >= 4


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory,
            smollm2: TransformersBackend) -> tuple[Path, list[str]]:
    """Run every block once, in order, in one folder; each block's stdout. Python blocks run in
    this process (as a script: `__name__ == "__main__"`, a namespace of their own), which
    saves an interpreter start and torch's import per block, and their loads of the default
    model share the session's weights (weights_shared_with)."""
    folder = tmp_path_factory.mktemp("cookbook")
    shutil.copytree(ROOT / "examples", folder / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    printed = []
    here = Path.cwd()
    os.chdir(folder)
    try:
        for n, (lang, code) in enumerate(blocks(), 1):
            if lang == "sh":
                done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], env=env,
                                      capture_output=True, text=True, timeout=600)
                assert done.returncode == 0, f"block {n} failed:\n{code}\n{done.stderr[-3000:]}"
                printed.append(done.stdout)
            else:
                out = io.StringIO()
                with contextlib.redirect_stdout(out), weights_shared_with(smollm2):
                    exec(compile(code, f"docs/cookbook.md block {n}", "exec"),
                         {"__name__": "__main__"})
                printed.append(out.getvalue())
    finally:
        os.chdir(here)
    return folder, printed


@pytest.mark.real
def test_classification_rows_carry_ids_labels_and_probabilities(
        outputs: tuple[Path, list[str]]) -> None:
    folder, _ = outputs
    rows = [json.loads(line) for line in (folder / "labels.jsonl").read_text().splitlines()]
    assert [row["id"] for row in rows] == [1, 2, 3]
    for row in rows:
        assert row["vars"]["sentiment"] in {"positive", "negative", "mixed"}
        probs = row["holes"]["sentiment"]["option_probs"]
        assert set(probs) == {"positive", "negative", "mixed"}
        assert abs(sum(probs.values()) - 1) < 1e-4


@pytest.mark.real
def test_python_blocks_print_typed_values(outputs: tuple[Path, list[str]]) -> None:
    _, printed = outputs
    python_out = [out for (lang, _), out in zip(blocks(), printed, strict=True) if lang == "python"]
    labels, person, chat, sums, inspect = python_out
    for line in labels.splitlines():
        label, prob = line.split()
        assert label in {"positive", "negative", "mixed"} and 0 < float(prob) <= 1
    assert person.strip().split()[-1].isdigit()            # age + 1: an int came back
    assert chat.count("> ") == 2
    assert sums.count(" int ") == 5                         # regex=INT values are ints
    assert {"city", "why"} <= {line.split()[0] for line in inspect.splitlines()[:2]}


@pytest.mark.real
def test_python_blocks_print_what_the_page_shows(outputs: tuple[Path, list[str]]) -> None:
    # The page's `# ...` lines after a block are its output as this model writes it
    # greedily or at the block's seed: they go stale when the model's numbers move.
    _, printed = outputs
    for (lang, code), out in zip(blocks(), printed, strict=True):
        patterns = promised(code) if lang == "python" else []
        if patterns:
            got = out.rstrip("\n").split("\n")
            assert len(got) == len(patterns) and all(
                p.fullmatch(line) for p, line in zip(patterns, got, strict=True)), \
                f"the page shows:\n{[p.pattern for p in patterns]}\nthe block prints:\n{out}"


@pytest.mark.real
def test_inspection_files_are_written(outputs: tuple[Path, list[str]]) -> None:
    folder, _ = outputs
    for page in ("run.html", "hello.html"):
        html = (folder / page).read_text(encoding="utf-8")
        assert html.startswith("<!DOCTYPE html>") and "city" in html
    assert "forward_tokens" in (folder / "stats.txt").read_text()
    program = (folder / "program.txt").read_text()
    assert "select sentiment options=" in program and "captures: sentiment, topic" in program
