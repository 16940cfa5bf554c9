"""Options for the language front-end tests: `--update-golden` (or QRUN_UPDATE_GOLDEN=1, which
also works when pytest runs from the repository root) rewrites tests/lang/golden/*/ir.txt and
error.txt from the current compiler output."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/lang/golden expectations from current output")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden", default=False)) or (
        os.environ.get("QRUN_UPDATE_GOLDEN") == "1")
