"""Shared fixtures: the tiny random Llama (fast, default tier) and the real SmolLM2 model
(tests marked `real`, run by `make test` and CI)."""

from __future__ import annotations

import pytest

from qrun.backends.transformers import TransformersBackend


def pytest_addoption(parser: pytest.Parser) -> None:
    # Registered here, not in tests/lang/conftest.py: pytest only reads command-line options
    # from the conftest files it loads before parsing, which are those of the paths it is given.
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden expectations (tests/lang/golden) from current output")


@pytest.fixture(scope="session")
def tiny() -> TransformersBackend:
    from qrun.backends.tiny import load_tiny

    return load_tiny(seed=0)


@pytest.fixture(scope="session")
def smollm2() -> TransformersBackend:
    from qrun.backends import load_model

    backend = load_model("smollm2")
    assert isinstance(backend, TransformersBackend)
    return backend
