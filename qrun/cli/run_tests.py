"""`qrun test PATH...` (docs/testing.md): argument parsing, finding the templates and their case
files, and the exit code; the cases, their checks and the report are qrun/testing/'s. Every
template is compiled and every case file read and checked against its template before a model
loads, so a mistake in either costs no model time (exit 2)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from qrun.cli.flags import add_functions_flag, add_model_flags, functions_of, model_options
from qrun.errors import UsageError
from qrun.options import ModelOptions

if TYPE_CHECKING:
    from qrun.api import Query
    from qrun.backends.base import Backend
    from qrun.runtime.request import RunRequest
    from qrun.testing import Case, CaseOutcome

EXIT_PASSED, EXIT_FAILED = 0, 1


def build_test_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qrun test",
        description="Run the test cases of templates: NAME.tests.yaml beside NAME.tmpl "
                    "(docs/testing.md).",
        epilog="Exit codes: 0 every case passed, 1 a case failed, 2 a template, case file "
               "or usage error (nothing ran), 3 an internal error of qrun.")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="templates (.tmpl), case files (.tests.yaml), or folders of them")
    parser.add_argument("-k", dest="keyword", metavar="EXPR",
                        help="only the cases whose id TEMPLATE::CASE matches: words "
                             "(substrings) with and, or, not, as pytest's -k")
    parser.add_argument("--junit-xml", metavar="PATH", help="also write a JUnit XML report")
    add_model_flags(parser, model_help="as for qrun FILE.tmpl (default: the template's, else "
                                       "smollm2)")
    parser.add_argument("--batch-size", type=int, default=8, metavar="N",
                        help="greedy cases run together, N at a time (default 8)")
    add_functions_flag(parser, "the templates")
    return parser


def run_tests(argv: Sequence[str]) -> int:
    """`qrun test ARGS`: the exit code (QrunErrors propagate to qrun.cli's main, exit 2)."""
    from qrun.api import Query
    from qrun.cli.output import LoadingNotice
    from qrun.testing import CaseFileError, cases_file_of, load_cases
    from qrun.testing.cases import front_matter_cases
    from qrun.testing.keyword import keyword_filter
    from qrun.testing.report import Report, write_junit
    from qrun.testing.runner import Suite, check_case_inputs, hole_places, run_suites

    args = build_test_parser().parse_args(list(argv))
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be ≥ 1, got {args.batch_size}")
    chosen = keyword_filter(args.keyword) if args.keyword is not None else None
    functions = functions_of(args)
    model = model_options(args)
    # Everything that can be wrong without a model is found first.
    suites: list[tuple[str, Query, list[Case], list[RunRequest]]] = []
    deselected = 0
    for template in _templates(args.paths):
        query = Query.from_file(template, functions=functions)
        cases = front_matter_cases(query.program)
        beside = cases_file_of(template)
        if beside.is_file() or not cases:
            cases += load_cases(_cases_file(template))
        names = [c.name for c in cases]
        for case in cases:
            if names.count(case.name) > 1:
                raise CaseFileError(f"two cases are named {case.name!r} (the front matter's "
                                    f"tests and {beside.name})", case.where)
        requests = check_case_inputs(query, cases)
        if chosen is not None:
            kept = [i for i, c in enumerate(cases) if chosen(f"{template}::{c.name}")]
            deselected += len(cases) - len(kept)
            cases, requests = [cases[i] for i in kept], [requests[i] for i in kept]
        if cases:
            suites.append((str(template), query, cases, requests))
    if not suites:
        raise UsageError("no test case to run" + (f" matches -k {args.keyword!r}"
                                                  if args.keyword is not None else ""))
    report = Report(sys.stdout)
    started = time.perf_counter()
    backends: dict[ModelOptions, Backend] = {}
    holes: dict[str, dict[str, str]] = {}
    ready: list[Suite] = []
    for name, query, cases, requests in suites:
        wanted = query.model_options(model)
        holes[name] = hole_places(query)
        if all(set(holes[name]) <= set(c.fill) for c in cases):
            # Every case fills every hole: the values are checked against the tokenizer's
            # tokens (max_tokens), and no model is run (docs/testing.md).
            wanted = dataclasses.replace(wanted, weights=False)
        if wanted not in backends:
            from qrun.backends import load_model

            with LoadingNotice(str(wanted.model or "the model")):
                backends[wanted] = load_model(options=wanted)
        ready.append(Suite(name, query, cases, requests, backends[wanted]))

    def told(outcome: CaseOutcome) -> None:
        if not report.outcomes or report.outcomes[-1].template != outcome.template:
            report.start(outcome.template)
        report.case(outcome)

    run_suites(ready, args.batch_size, told)
    seconds = time.perf_counter() - started
    report.finish(seconds, holes, deselected)
    if args.junit_xml:
        try:
            write_junit(Path(args.junit_xml), report.outcomes, seconds)
        except OSError as exc:
            raise UsageError(f"--junit-xml {args.junit_xml}: {exc}") from None
    return EXIT_PASSED if all(o.passed for o in report.outcomes) else EXIT_FAILED


def _templates(paths: Sequence[str]) -> list[Path]:
    """The templates the paths name: a .tmpl file, the template of a .tests.yaml file, or the
    templates of a folder that have cases, in a case file or in their front matter (in name
    order, each once).

    Raises:
        UsageError: a path that does not exist or is neither; a folder without cases.
    """
    from qrun.testing import cases_file_of

    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            inside = [t for t in sorted(path.rglob("*.tmpl"))
                      if cases_file_of(t).is_file() or _has_tests(t)]
            if not inside:
                raise UsageError(f"{path}: no template here has a case file "
                                 "(NAME.tests.yaml beside NAME.tmpl)")
            found.extend(inside)
        elif path.is_file() and path.name.endswith(".tests.yaml"):
            found.append(path.with_name(path.name.removesuffix(".tests.yaml") + ".tmpl"))
        elif path.is_file():
            found.append(path)
        else:
            from qrun.lang.size import missing_or_odd

            raise UsageError(f"{path}: {missing_or_odd(path)}")
    unique: list[Path] = []
    for template in found:
        if template.resolve() not in {t.resolve() for t in unique}:
            unique.append(template)
    return unique


def _has_tests(template: Path) -> bool:
    """Whether the template's front matter may hold `tests:` (a cheap look at its text; the
    compiler reads it for real)."""
    try:
        head = template.read_text(encoding="utf-8", errors="replace")[:65536]
    except OSError:
        return False
    return head.startswith("---") and "\ntests:" in head.split("\n---", 1)[0]


def _cases_file(template: Path) -> Path:
    from qrun.testing import cases_file_of

    cases = cases_file_of(template)
    if not template.is_file():
        raise UsageError(f"{cases}: its template {template} does not exist")
    if not cases.is_file():
        raise UsageError(f"{template}: no `tests:` in its front matter and no case file "
                         f"{cases.name} beside it (docs/testing.md)")
    return cases
