"""Running templates' test cases (docs/testing.md §3): every case's inputs checked before
any model work (`Query.request`), the greedy cases of every template on a model batched
together by the model's runner (qrun/runtime/runner.py `map`, what `Query.run_many` does), a
sampled case (one that gives a temperature) run on its own with its seed, as `qrun FILE
--seed S --temperature T` would; then each expectation checked against the result."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from qrun.errors import InputError, QrunError
from qrun.lang import ir
from qrun.options import RunOptions
from qrun.testing.cases import Case
from qrun.testing.expect import Expectation
from qrun.testing.where import CaseFileError

if TYPE_CHECKING:
    from qrun.api import Query
    from qrun.backends.base import Backend
    from qrun.runtime.request import RunRequest
    from qrun.runtime.result import Result

__all__ = ["CaseOutcome", "Suite", "check_case_inputs", "hole_places", "run_suites"]


@dataclass
class CaseOutcome:
    """A case's result: the expectations it failed with what was found instead, or the
    error that stopped its run; `text` and `values` what the run produced, `seconds` its
    wall time (Stats.wall_s; greedy cases run batched, so theirs overlap; 0 for a run that
    failed)."""

    template: str
    case: Case
    failures: list[tuple[Expectation, str]] = field(default_factory=list)
    error: QrunError | None = None
    text: str = ""
    values: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.error is None and not self.failures

    @property
    def id(self) -> str:
        """`TEMPLATE::CASE`, as -k matches it and the report prints it."""
        return f"{self.template}::{self.case.name}"


def check_case_inputs(query: Query, cases: list[Case]) -> list[RunRequest]:
    """Each case's run (Query.request): its inputs as the template takes them and its known
    values checked as far as they can be without a model (runtime/fills.py), before any model
    work; greedy unless the case gives a temperature.

    Raises:
        CaseFileError: a case's inputs do not fit the template (at the case).
    """
    requests = []
    for case in cases:
        options = (RunOptions(temperature=0.0) if case.temperature is None
                   else RunOptions(temperature=case.temperature, seed=case.seed))
        try:
            requests.append(query.request(case.inputs, options=options, fill=case.fill))
        except InputError as exc:
            raise CaseFileError(f"case {case.name!r}: {exc.message}", case.where) from None
        except QrunError as exc:
            raise CaseFileError(f"case {case.name!r}: {exc}", case.where) from None
    return requests


@dataclass(frozen=True)
class Suite:
    """A template's cases as `qrun test` runs them: `template` its name in reports, `requests`
    the cases' runs (check_case_inputs), `backend` the model they run on."""

    template: str
    query: Query
    cases: list[Case]
    requests: list[RunRequest]
    backend: Backend


def run_suites(suites: Sequence[Suite], batch_size: int = 8,
               on_outcome: Callable[[CaseOutcome], None] | None = None,
               ) -> list[list[CaseOutcome]]:
    """Run and check every suite's cases: per backend, the greedy cases of all its suites
    batched together (one Runner.map: a template with one case still shares its forwards with
    the others'), then each sampled case alone with its seed. Outcomes per suite in case
    order; `on_outcome` is told them in the same order (suite by suite), each as soon as it
    and every one before it are known."""
    outcomes: dict[tuple[int, int], CaseOutcome] = {}
    order = [(s, c) for s, suite in enumerate(suites) for c in range(len(suite.cases))]
    told = 0
    lock = threading.Lock()

    def finish(place: tuple[int, int], result: Result | QrunError) -> None:
        nonlocal told
        suite = suites[place[0]]
        outcome = _judge(suite.template, suite.cases[place[1]],
                         suite.requests[place[1]].inputs, result)
        with lock:  # map tells its results from the runs' threads
            outcomes[place] = outcome
            while told < len(order) and order[told] in outcomes:
                if on_outcome is not None:
                    on_outcome(outcomes[order[told]])
                told += 1

    for backend in dict.fromkeys(suite.backend for suite in suites):
        mine = [(s, c) for s, c in order if suites[s].backend is backend]
        # The backend's one runner (Query.runner: the same for every query on it).
        runner = suites[mine[0][0]].query.runner(backend)
        greedy = [(s, c) for s, c in mine if suites[s].cases[c].temperature is None]
        if greedy:
            runner.map([suites[s].requests[c].for_item(k) for k, (s, c) in enumerate(greedy)],
                       min(batch_size, len(greedy)), partial(_told, finish, greedy))
        for s, c in mine:
            if suites[s].cases[c].temperature is None:
                continue
            result: Result | QrunError
            try:
                result = runner.run(suites[s].requests[c])
            except QrunError as exc:
                result = exc
            finish((s, c), result)
    return [[outcomes[s, c] for c in range(len(suite.cases))] for s, suite in enumerate(suites)]


def _told(finish: Callable[[tuple[int, int], Result | QrunError], None],
          places: list[tuple[int, int]], index: int, outcome: Result | QrunError) -> None:
    """Runner.map's `on_result` for the runs of `places`, in that order."""
    finish(places[index], outcome)


def _judge(template: str, case: Case, inputs: Mapping[str, Any],
           result: Result | QrunError) -> CaseOutcome:
    if isinstance(result, QrunError):
        return CaseOutcome(template, case, error=result)
    values = {**inputs, **result.vars}
    outcome = CaseOutcome(template, case, text=result.text, values=values,
                          seconds=result.stats.wall_s)
    for expectation in case.expectations:
        failure = expectation.check(result.text, values)
        if failure is not None:
            outcome.failures.append((expectation, failure))
    return outcome


def hole_places(query: Query) -> dict[str, str]:
    """`FILE:LINE:COL` of each capture's hole (its first, for one written twice), for the
    report of a failed expectation about it."""
    places: dict[str, str] = {}
    for op, source in ir.holes(query.program.ops, query.program.source, macros=True):
        if op.name not in places:
            places[op.name] = f"{source.name}:{op.span.line}:{op.span.column}"
    return places

