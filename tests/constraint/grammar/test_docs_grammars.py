"""The Lark grammars of docs/language.md §7.5 compile, and take and refuse the sentences the
text says they do (through qrun.Matcher, on a byte vocabulary); the SQL-like one is the
grammar of examples/query.tmpl."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from qrun.constraint.grammar import check_lark
from qrun.constraint.vocab import Vocabulary
from qrun.matcher import Matcher

ROOT = Path(__file__).resolve().parents[3]
BLOCK = re.compile(r"```lark\n(?P<grammar>.*?)```\s*\naccepts `(?P<good>[^`]+)`,\s+refuses\s+"
                   r"`(?P<bad>[^`]+)`", re.S)


def examples() -> list[tuple[str, str, str]]:
    text = (ROOT / "docs/language.md").read_text(encoding="utf-8")
    section = text[text.index("### 7.5 Lark grammars"):text.index("## 8. `select` holes")]
    return [(m["grammar"], m["good"], m["bad"]) for m in BLOCK.finditer(section)]


def test_the_section_has_its_three_examples() -> None:
    assert len(examples()) == 3


@pytest.mark.parametrize(("grammar", "good", "bad"), examples(),
                         ids=["arithmetic", "json-list", "sql"])
def test_a_documented_grammar_compiles_and_means_what_the_text_says(
        byte_vocab: Vocabulary, grammar: str, good: str, bad: str) -> None:
    assert check_lark(grammar) is None
    model = SimpleNamespace(vocabulary=byte_vocab)
    matcher = Matcher(model, grammar=grammar)
    assert matcher.consume_text(good) and matcher.accepting(), good
    matcher.reset()
    assert not (matcher.consume_text(bad) and matcher.accepting()), bad


def test_the_sql_example_is_the_template_example() -> None:
    sql = examples()[2][0]
    template = (ROOT / "examples" / "query.tmpl").read_text(encoding="utf-8")
    lines = re.findall(r"^  '(.*)',?$", template, flags=re.M)
    assert [line.replace("\\\\", "\\") for line in lines] == sql.strip().split("\n")
