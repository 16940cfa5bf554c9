"""Fixtures for the language front-end tests. `pytest --update-golden` (the option is registered
in tests/conftest.py) rewrites tests/lang/golden/*/{ir.txt,error.txt} from the current compiler
output."""

from __future__ import annotations

import pytest


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))
