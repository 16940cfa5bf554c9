"""A grammar rule that can never end (no base case) is a `--check` error naming the rule and its
line (qrun/constraint/grammar/lark_ends.py). llguidance compiles such a grammar; before this
check, `start: a` / `a: "x" a` passed `--check` and the run stopped at its first token with
llguidance's "Too many items (limit 50000; ff_tokens)"."""

from __future__ import annotations

import pytest
from hang import alarm

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.constraint.grammar import check_lark
from qrun.constraint.grammar.lark_ends import never_ending_rule
from qrun.errors import ConstraintError, TemplateErrors

NEVER_ENDING = [  # (grammar, the rule blamed, its line)
    ('start: a\na: "x" a', "a", 2),
    ('start: "x" start', "start", 1),
    ('start: a\na: a "x"', "a", 2),  # left recursion without a base case
    ('start: "q" | a\na: "x" a', "a", 2),  # start ends, but the model can walk into a
    ('start: b\nb: "q" | a\na: "x" a', "a", 3),  # reached through a rule that ends
    ('start: a?\na: "(" a ")"', "a", 2),  # optional uses are still reachable
    ('start: a*\na: "x" a', "a", 2),
    ('start: [a] "z"\na: "x" a', "a", 2),
    ('start: a{0,3}\na: "x" a', "a", 2),
    ('start: a ~ 1 .. 2\na: "x" a', "a", 2),
    ('start: (a "y") | "z"\na: "x" a', "a", 2),
    ('?start: a\n!a: "x" a -> named', "a", 2),
    ('start: a\na: "x" a // a comment: a: "y"\n# another', "a", 2),
    ('start: a\na: "x" a\n  | "y" a', "a", 2),  # `|` continues the rule on the next line
]

ENDING = [
    'start: a\na: "x" a | "y"',
    'start: a\na: "(" a ")"\n    | "x"',
    'start: a\na: "x" a?',  # the recursion itself is optional
    'start: a\na: "x" a*',
    'start: a\na: "x" [a]',
    'start: a\na: "x" a{0,2}',
    'start: a\na: "x" a ~ 0 .. 2',
    'start: a\na: "x" a\n  | %json {"type": "integer"}',
    'start: a\na: "x" a | %regex {"substring_words": "a b"}',
    'start: a\na[max_tokens=5, stop="\\n"]: /x+/',
    'start: A\nA: "x"+',
    '%import common.NUMBER\nstart: NUMBER ("," NUMBER)*',
    'start: a\na: "x" %lark {\nstart: "y"\n}',  # not read: counts as ending
    'start: expr\nexpr: term (("+" | "-") term)*\nterm: factor (("*" | "/") factor)*\n'
    'factor: NUMBER | "(" expr ")"\nNUMBER: /[0-9]+(\\.[0-9]+)?/',
    'start: "a"\nunused: "x" unused',  # start never reaches it: llguidance ignores it
]


@pytest.mark.parametrize(("grammar", "rule", "line"), NEVER_ENDING)
def test_a_rule_without_a_base_case_is_refused_with_its_line(grammar: str, rule: str,
                                                             line: int) -> None:
    error = check_lark(grammar)
    assert error is not None
    assert error.reason.startswith(f"rule '{rule}' can never end")
    assert (error.line, error.column) == (line, 1)


@pytest.mark.parametrize("grammar", ENDING)
def test_grammars_whose_rules_end_pass(grammar: str) -> None:
    assert check_lark(grammar) is None


def test_a_cycle_through_several_rules_names_them() -> None:
    error = check_lark('start: a b\na: "x"\nb: c\nc: b "y"')
    assert error is not None and error.line == 3
    assert error.reason.startswith("rule 'b' can never end: each of its alternatives needs "
                                   "'b' again (through 'c')")


def test_a_long_cycle_is_named_briefly_and_checked_fast() -> None:
    grammar = "\n".join(["start: r0", *(f"r{i}: r{i + 1}" for i in range(499)), 'r499: "x" r0'])
    with alarm(10):  # a linear walk: ~15 ms; a search over paths would not end
        found = never_ending_rule(grammar)
    assert found is not None and found[1] == 2
    assert "(through 'r1', 'r2', 'r3', 496 more)" in found[0]


def test_a_grammar_at_the_size_limit_is_read_fast() -> None:
    grammar = "start: " + " | ".join(f'"w{i}" rest' for i in range(6_000)) + '\nrest: "." rest'
    assert len(grammar) < 100_000
    with alarm(10):  # ~80 ms
        found = never_ending_rule(grammar)
    assert found is not None and found[1] == 2


def test_syntax_llguidance_refuses_keeps_its_own_error() -> None:
    error = check_lark('start: a\na: "x" a |')  # an empty alternative is allowed: it ends
    assert error is None
    error = check_lark('start: a\na: "x" (a')
    assert error is not None and "can never end" not in error.reason


def test_the_template_error_points_at_the_rule() -> None:
    with pytest.raises(TemplateErrors) as caught:
        qrun.Query('x\n{{ gen g grammar="start: a\\na: \\"x\\" a" }}')
    (error,) = caught.value.errors
    assert "rule 'a' can never end" in error.message and error.span.line == 2


def test_a_grammar_in_a_variable_is_refused_before_sampling(tiny: TransformersBackend) -> None:
    # Before: a GenerationError at the first token ("Too many items (limit 50000;
    # ff_tokens)"), after the compile had passed.
    with pytest.raises(ConstraintError) as caught:
        qrun.Query("A: {{ gen w grammar=g max_tokens=8 }}").run(model=tiny,
                                                                 g='start: a\na: "x" a')
    assert "rule 'a' can never end" in caught.value.message


def test_the_matcher_refuses_it_too(tiny: TransformersBackend) -> None:
    with pytest.raises(ConstraintError, match="rule 'a' can never end"):
        qrun.Matcher(tiny, grammar='start: a\na: "x" a')
