"""`qrun test` end to end (qrun/cli/run_tests.py): the examples' cases on the tiny and the
real model, failures reported with the expectation, what was found and the hole, exit codes
0/1/2, -k and JUnit XML."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import record_loads
from test_doc_blocks import weights_shared_with

from qrun.backends.transformers import TransformersBackend
from qrun.cli import main

EXAMPLES = Path(__file__).parents[2] / "examples"
# The examples' host functions, for the two that call some (calculator.tmpl, agent.tmpl).
FUNCTIONS = ["--functions", str(EXAMPLES / "calculator.py"),
             "--functions", str(EXAMPLES / "agent.py")]
TEMPLATE = """\
---
inputs: [topic]
---
Topic: {{ topic }}
Label: {{ select label options=["alpha", "beta"] }}
Count: {{ gen count regex="[0-9]" }}
"""


def _write(tmp_path: Path, cases: str, template: str = TEMPLATE) -> Path:
    (tmp_path / "t.tmpl").write_text(template)
    (tmp_path / "t.tests.yaml").write_text(cases)
    return tmp_path / "t.tmpl"


def test_the_examples_cases_pass_on_the_tiny_model(
        tiny_folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["test", str(EXAMPLES), "--model", tiny_folder, *FUNCTIONS])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "classify.tmpl ..." in out and " passed in " in out and "FAILURES" not in out
    # Every example has cases.
    tested = {line.split()[0] for line in out.splitlines() if line.endswith((".", "F", "E"))}
    assert tested == {str(t) for t in EXAMPLES.glob("*.tmpl")}


@pytest.mark.real
def test_the_examples_cases_pass_on_the_real_model(
        capsys: pytest.CaptureFixture[str], smollm2: TransformersBackend) -> None:
    # The default model as `qrun test` loads it, over the session's weights (a load less)
    with weights_shared_with(smollm2):
        code = main(["test", str(EXAMPLES), *FUNCTIONS])
    out = capsys.readouterr().out
    assert code == 0, out


def test_a_failed_expectation_is_reported_with_its_place_and_the_hole(
        tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    template = _write(tmp_path, """\
- name: holds
  inputs: {topic: cats}
  expect:
    that: label in ["alpha", "beta"]
    schema: {count: {type: string, pattern: '^[0-9]$'}}
- name: wrong
  inputs: {topic: dogs}
  expect:
    vars: {count: "not a digit"}
    text: 'Topic: birds'
""")
    code = main(["test", str(template), "--model", tiny_folder])
    out = capsys.readouterr().out
    assert code == 1
    assert f"{template} .F" in out
    assert f"{tmp_path / 't.tests.yaml'}:9:19: expected vars.count: \"not a digit\"" in out
    assert f"(the hole: {template}:6:8)" in out
    assert f"{tmp_path / 't.tests.yaml'}:10:11: expected text: Topic: birds" in out
    assert "1 passed, 1 failed in" in out


def test_a_run_that_fails_is_an_error_of_its_case(
        tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    template = _write(tmp_path, """\
- name: divides by zero
  inputs: {topic: 0}
  expect: {that: 'true'}
""", "Topic: {{ 1 / topic }} {{ gen x max_tokens=2 }}\n")
    code = main(["test", str(template), "--model", tiny_folder])
    out = capsys.readouterr().out
    assert code == 1
    assert f"{template} E" in out and "division by zero" in out and "1 error in" in out


@pytest.mark.parametrize("cases, message", [
    ("- name: a\n  inputs: {subject: x}\n  expect: {that: 'true'}\n", "t.tests.yaml:1:3: case 'a'"),
    ("- name: a\n  expect: {vars: [1]}\n", "t.tests.yaml:2:18: vars maps capture names"),
])
def test_case_file_mistakes_exit_2_before_any_model_work(
        tmp_path: Path, cases: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    template = _write(tmp_path, cases)
    # No --model: were the model loaded, SmolLM2 would be; the error comes first.
    code = main(["test", str(template)])
    captured = capsys.readouterr()
    assert code == 2 and message in captured.err and captured.out == ""


def test_template_errors_and_missing_files_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    template = _write(tmp_path, "- name: a\n  expect: {that: 'true'}\n",
                      "{{ gen x regex='[' }}\n")
    assert main(["test", str(template)]) == 2
    assert "t.tmpl:1:" in capsys.readouterr().err
    (tmp_path / "lonely.tmpl").write_text("hello\n")
    assert main(["test", str(tmp_path / "lonely.tmpl")]) == 2
    assert "no case file lonely.tests.yaml" in capsys.readouterr().err
    assert main(["test", str(tmp_path / "nowhere")]) == 2
    assert main(["test", str(EXAMPLES), "-k", "no-such-case", *FUNCTIONS]) == 2
    assert "no test case to run matches -k" in capsys.readouterr().err
    # Host functions the templates call must be given; two files may not share a name.
    assert main(["test", str(EXAMPLES / "calculator.tmpl")]) == 2
    assert "unknown function 'calc'" in capsys.readouterr().err
    calculator = str(EXAMPLES / "calculator.py")
    assert main(["test", str(EXAMPLES / "calculator.tmpl"), "--functions", calculator,
                 "--functions", calculator]) == 2
    assert "'calc' is registered by an earlier --functions file" in capsys.readouterr().err


def test_keyword_selection_and_junit_xml(
        tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "report.xml"
    code = main(["test", str(EXAMPLES / "classify.tests.yaml"), "--model", tiny_folder,
                 "-k", "not sampled", "--junit-xml", str(report)])
    out = capsys.readouterr().out
    assert code == 0 and "1 deselected" in out
    suite = ElementTree.parse(report).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "0"
    names = [case.get("name") for case in suite.iter("testcase")]
    assert names == ["broken on arrival", "praise"]
    # Each case's run time, as CI pages read it (both ran: a forward each at least).
    seconds = [float(case.get("time", "")) for case in suite.iter("testcase")]
    assert all(0 < s <= float(suite.get("time", "")) for s in seconds), seconds


def test_the_example_of_docs_testing_runs(
        tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    # The example of docs/testing.md §1.
    doc = (EXAMPLES.parent / "docs/testing.md").read_text()
    template = doc.split("```tmpl\n", 1)[1].split("```", 1)[0]
    cases = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "label.tmpl").write_text(template)
    (tmp_path / "label.tests.yaml").write_text(cases)
    code = main(["test", str(tmp_path), "--model", tiny_folder])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "label.tmpl .." in out


FRONT = """\
---
inputs: {topic: string}
tests:
  - name: filled
    inputs: {topic: cats}
    fill: {label: beta, count: "7"}
    expect:
      vars: {label: beta, count: "7"}
      text: 'Label: beta\\nCount: 7'
  - name: bad fill
    inputs: {topic: cats}
    fill: {count: "x"}
    expect: {that: 'true'}
---
Topic: {{ topic }}
Label: {{ select label options=["alpha", "beta"] }}
Count: {{ gen count regex="[0-9]" }}
"""


def test_cases_in_the_front_matter_with_known_values(
        tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.tmpl").write_text(FRONT)
    code = main(["test", str(tmp_path), "--model", tiny_folder])
    out = capsys.readouterr().out
    assert code == 1
    assert "t.tmpl .E" in out  # the filled case passes whatever the model; "x" breaks the regex
    assert "count" in out and "1 passed, 1 error in" in out


def test_a_mistake_in_front_matter_tests_points_into_the_template(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.tmpl").write_text(FRONT.replace("fill: {label: beta", "fill: {nohole: beta"))
    assert main(["test", str(tmp_path / "t.tmpl")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 't.tmpl'}:4:5: case 'filled': cannot fill 'nohole'" in err, err
    misspelt = FRONT.replace("    expect:\n      vars", "    expekt:\n      vars")
    (tmp_path / "t.tmpl").write_text(misspelt)
    assert main(["test", str(tmp_path / "t.tmpl")]) == 2
    assert f"{tmp_path / 't.tmpl'}:8:7: unknown key 'expekt'" in capsys.readouterr().err


def test_the_front_matter_example_of_docs_testing_runs(
        tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    # The second template of docs/testing.md §1: cases in the front matter.
    doc = (EXAMPLES.parent / "docs/testing.md").read_text()
    template = doc.split("```tmpl\n")[2].split("```", 1)[0]
    (tmp_path / "front.tmpl").write_text(template)
    code = main(["test", str(tmp_path), "--model", tiny_folder])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "front.tmpl ." in out


def test_control_characters_are_escaped_in_the_report_and_the_xml(
        tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    template = _write(tmp_path, """\
- name: escapes
  inputs: {topic: "\\e[31mred"}
  expect:
    text: "\\e\\\\[32m"
""")
    report = tmp_path / "r.xml"
    code = main(["test", str(template), "--model", tiny_folder, "--junit-xml", str(report)])
    out = capsys.readouterr().out
    assert code == 1 and "\x1b" not in out and "\\x1b" in out
    ElementTree.parse(report)  # well-formed: no raw control character in it


def test_a_suite_whose_cases_fill_every_hole_loads_no_weights(
        tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Every case gives every hole's value: the tokenizer checks them (max_tokens), no model
    # runs (issue #38); one case that leaves a hole to the model loads the weights.
    loaded = record_loads(monkeypatch)
    filled = """\
- name: all given
  inputs: {topic: cats}
  fill: {label: beta, count: "7"}
  expect: {vars: {label: beta, count: "7"}}
"""
    template = _write(tmp_path, filled)
    assert main(["test", str(template), "--model", tiny_folder]) == 0, capsys.readouterr()
    assert loaded == [False]
    _write(tmp_path, filled + "- name: generated\n  inputs: {topic: dogs}\n"
                              "  expect: {that: 'count in \"0123456789\"'}\n")
    assert main(["test", str(template), "--model", tiny_folder]) == 0, capsys.readouterr()
    assert loaded == [False, True]


def test_a_named_pipe_is_refused_for_what_it_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pipe = tmp_path / "pipe.tmpl"
    os.mkfifo(pipe)
    assert main(["test", str(pipe)]) == 2
    assert f"{pipe}: it is a named pipe (FIFO), not a file" in capsys.readouterr().err
    assert main(["serve", str(pipe), "--port", "1"]) == 2
    assert f"{pipe}: it is a named pipe (FIFO), not a file" in capsys.readouterr().err


def test_greedy_cases_of_different_templates_share_forwards_and_report_in_order(
        tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # One Runner.map for every template's greedy cases on a model: the one-case templates b
    # and c run in the same batches; the report keeps the templates' order, a (no weights:
    # its case fills every hole) first, b's sampled case (run alone, after) in b's line.
    from qrun.runtime.runner import Runner

    rows: list[int] = []
    runners: list[Runner] = []  # held, so the watched runner is the one the runs get

    def watch(backend: Any) -> None:
        runners.append(Runner.of(backend))
        runners[-1].watch_batches(rows.append)

    record_loads(monkeypatch, watch)
    template = "Say: {{ gen x regex=\"[a-z]{3}( [a-z]{3}){7}\" }}\n"
    given = ("- name: given\n  fill: {x: abc abc abc abc abc abc abc abc}\n"
             "  expect: {vars: {x: abc abc abc abc abc abc abc abc}}\n")
    greedy = "- name: greedy\n  expect: {that: 'x | length == 31'}\n"
    sampled = "- name: sampled\n  temperature: 1\n  seed: 3\n  expect: {that: 'x | length == 31'}\n"
    for name, cases in [("a", given), ("b", greedy + sampled), ("c", greedy)]:
        (tmp_path / f"{name}.tmpl").write_text(template)
        (tmp_path / f"{name}.tests.yaml").write_text(cases)
    assert main(["test", str(tmp_path), "--model", tiny_folder]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.endswith(".")]
    assert lines == [f"{tmp_path / 'a.tmpl'} .", f"{tmp_path / 'b.tmpl'} ..",
                     f"{tmp_path / 'c.tmpl'} ."], out
    assert len(runners) == 1 and max(rows) == 2, rows
