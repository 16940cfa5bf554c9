"""The VS Code extension (editors/vscode/, issue #27 item 5): its manifest names what it ships,
and its TextMate grammar, tokenized by vscode-textmate with the Oniguruma engine (as VS Code
tokenizes it), gives the sample templates the scopes editors/vscode/test/samples/
expectations.json lists. The grammar test needs node and the extension's node_modules
(`make editors`, part of `make test`); without them it skips."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

EXTENSION = Path(__file__).resolve().parents[2] / "editors" / "vscode"


def test_the_manifest_names_the_files_it_ships() -> None:
    manifest = json.loads((EXTENSION / "package.json").read_text())
    [language] = manifest["contributes"]["languages"]
    assert language["id"] == "qrun" and language["extensions"] == [".tmpl"]
    [grammar] = manifest["contributes"]["grammars"]
    assert grammar["scopeName"] == "source.qrun"
    for relative in (language["configuration"], grammar["path"], manifest["main"]):
        assert (EXTENSION / relative).is_file(), relative
    syntax = json.loads((EXTENSION / grammar["path"]).read_text())
    assert syntax["scopeName"] == grammar["scopeName"]
    configuration = json.loads((EXTENSION / language["configuration"]).read_text())
    assert configuration["comments"]["blockComment"] == ["{#", "#}"]


def test_the_grammar_gives_the_samples_their_scopes() -> None:
    node = shutil.which("node")
    if node is None or not (EXTENSION / "node_modules" / "vscode-textmate").is_dir():
        pytest.skip("needs node and editors/vscode/node_modules (make editors)")
    done = subprocess.run([node, "test/grammar.test.js"], cwd=EXTENSION, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    expected = len(json.loads((EXTENSION / "test/samples/expectations.json").read_text()))
    assert f"{expected} of {expected} expectations hold" in done.stdout


def test_the_grammar_knows_every_hole_argument() -> None:
    """The grammar's list of argument names stays in step with the compiler's
    (qrun/lang/args.py): a new argument is highlighted as one."""
    from qrun.lang.args import GEN_ARGS, SELECT_ARGS

    syntax = json.loads((EXTENSION / "syntaxes" / "qrun.tmLanguage.json").read_text())
    pattern = syntax["repository"]["argument-name"]["match"]
    listed = set(pattern.split("(", 1)[1].split(")", 1)[0].split("|"))
    assert set(GEN_ARGS) | set(SELECT_ARGS) <= listed
