"""Options for the language front-end tests: `pytest tests/lang --update-golden` rewrites
tests/lang/golden/*/{ir.txt,error.txt} from the current compiler output. pytest only reads
options from the conftest files of the paths it is given, so from the repository root use
QRUN_UPDATE_GOLDEN=1 instead (or register --update-golden in tests/conftest.py)."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    try:
        parser.addoption("--update-golden", action="store_true", default=False,
                         help="rewrite golden expectations from current output")
    except ValueError:  # already registered by a conftest higher up: share it
        pass


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden", default=False)) or (
        os.environ.get("QRUN_UPDATE_GOLDEN") == "1")
