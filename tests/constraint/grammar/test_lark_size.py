"""Hostile Lark grammars get a clear error, never a crash (qrun/constraint/grammar/lark_size.py): a
chain of 3,000 rules killed the process with SIGSEGV inside llguidance, a megabyte of alternatives
compiled for seconds and stopped mid-sampling; and llguidance's parser giving up while a hole runs
is a GenerationError at the hole, not a traceback."""

from __future__ import annotations

import subprocess
import sys

import llguidance
import pytest
from hang import alarm

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.constraint.grammar import ConstraintLimits, check_lark
from qrun.constraint.grammar.lark_size import MAX_GRAMMAR_CHARS, MAX_RULE_DEPTH
from qrun.errors import TemplateErrors


def chain(n: int) -> str:
    """`start: r0`, `r0: r1`, ..., `rN: "x"`: n + 2 rules, each using the next."""
    return "\n".join(["start: r0", *(f"r{i}: r{i + 1}" for i in range(n)), f'r{n}: "x"'])


def test_a_chain_of_3000_rules_is_refused_not_a_crash() -> None:
    # In a process of its own: before the limit, this call died with SIGSEGV.
    code = ("from qrun.constraint.grammar import check_lark\n"
            f"e = check_lark({chain(3000)!r})\n"
            "print(e.reason, e.line)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-500:]
    assert "rule 'start' begins a chain of 3,002 rules" in done.stdout
    assert done.stdout.strip().endswith(" 1")  # the line of `start`


def test_a_chain_within_the_limit_compiles() -> None:
    assert check_lark(chain(MAX_RULE_DEPTH - 10)) is None
    error = check_lark(chain(MAX_RULE_DEPTH))
    assert error is not None and f"more than the {MAX_RULE_DEPTH}" in error.reason


def test_cycles_and_literals_do_not_count_as_depth() -> None:
    grammar = ('start: a\na: "(" b ")" | "x"\nb: a ("," a)*\n'
               'WORD: /[a-z_]+ r0 r1/ // a comment naming start a b\n%ignore " "')
    assert check_lark(grammar) is None


def test_a_huge_grammar_is_refused_at_once() -> None:
    grammar = "start: " + " | ".join(f'"w{i}"' for i in range(100_000))  # 1.1 MB
    with alarm(10):  # refused before llguidance reads it (which took seconds)
        error = check_lark(grammar)
    assert error is not None and f"more than the {MAX_GRAMMAR_CHARS:,}" in error.reason


def test_the_template_error_points_at_the_rule() -> None:
    grammar = chain(MAX_RULE_DEPTH + 5).replace("\n", "\\n")
    with pytest.raises(TemplateErrors) as caught:
        qrun.Query("x\n{{ gen g grammar='" + grammar + "' }}")
    (error,) = caught.value.errors
    assert "begins a chain of" in error.message and error.span.line == 2


def test_the_parser_giving_up_mid_hole_is_a_generation_error(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # llguidance's rows hold at most max_items_in_row items; 20,000 alternatives passed the
    # check and then stopped the parser at the first token, which escaped as a ValueError.
    # (The limit is lowered so a small grammar meets it.)
    monkeypatch.setattr(ConstraintLimits, "parser_limits",
                        lambda self: llguidance.LLParserLimits(max_items_in_row=50))
    grammar = "start: " + " | ".join(f'"w{i}"' for i in range(200))
    with pytest.raises(qrun.GenerationError) as caught:
        qrun.Query("A: {{ gen w grammar=g max_tokens=4 }}").run(model=tiny, g=grammar)
    assert "llguidance's parser stopped" in caught.value.message
    assert "items" in caught.value.message and caught.value.span.line == 1
