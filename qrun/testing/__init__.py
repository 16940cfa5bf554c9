"""`qrun test` (docs/testing.md): a template's test cases, read from the case file beside it,
run on a model (greedy cases batched), checked and reported as pytest reports."""

from qrun.testing.cases import Case, cases_file_of, load_cases, parse_cases
from qrun.testing.expect import Expectation
from qrun.testing.runner import CaseOutcome, Suite, run_suites
from qrun.testing.where import CaseFileError, Where

__all__ = ["Case", "CaseFileError", "CaseOutcome", "Expectation", "Suite", "Where",
           "cases_file_of", "load_cases", "parse_cases", "run_suites"]
