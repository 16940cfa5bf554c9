"""Running a template's test cases (docs/testing.md §3): every case's inputs checked before
any model work (`Query.request`), the greedy cases batched together by the model's runner
(qrun/runtime/runner.py `map`, what `Query.run_many` does), a sampled case
(one that gives a temperature) run on its own with its seed, as `qrun FILE --seed S
--temperature T` would; then each expectation checked against the result."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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

__all__ = ["CaseOutcome", "check_case_inputs", "hole_places", "run_cases"]


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


def run_cases(query: Query, template: str, cases: list[Case], backend: Backend,
              batch_size: int = 8,
              on_outcome: Callable[[CaseOutcome], None] | None = None,
              requests: list[RunRequest] | None = None) -> list[CaseOutcome]:
    """Run `cases` of `query` (the template named `template` in reports) on `backend` and
    check them; outcomes in case order, `on_outcome` called as each is known (greedy cases
    when their batch ends). `requests`: the cases' runs, as check_case_inputs made them.

    Raises:
        CaseFileError: a case's inputs do not fit the template (nothing has run).
    """
    if requests is None:
        requests = check_case_inputs(query, cases)
    runner = query.runner(backend)
    outcomes: dict[int, CaseOutcome] = {}

    def finish(index: int, result: Result | QrunError) -> None:
        outcome = _judge(template, cases[index], requests[index].inputs, result)
        outcomes[index] = outcome
        if on_outcome is not None:
            on_outcome(outcome)

    greedy = [i for i, case in enumerate(cases) if case.temperature is None]
    if greedy:
        results = runner.map([requests[i].for_item(k) for k, i in enumerate(greedy)],
                             min(batch_size, len(greedy)))
        for index, batched in zip(greedy, results, strict=True):
            finish(index, batched)
    for index, case in enumerate(cases):
        if case.temperature is None:
            continue
        result: Result | QrunError
        try:
            result = runner.run(requests[index])
        except QrunError as exc:
            result = exc
        finish(index, result)
    return [outcomes[i] for i in range(len(cases))]


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

