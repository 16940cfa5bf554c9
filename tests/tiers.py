"""The optional tiers' guards, shared by their test modules (`make test` runs each tier in a
pytest process of its own; Makefile)."""

from __future__ import annotations

import importlib.util
import os

import pytest


def require_llama_cpp() -> None:
    """At a llamacpp-tier module's top: skip the module without llama-cpp-python, unless
    QRUN_REQUIRE_LLAMACPP=1 (`make test`), where a missing build fails instead."""
    if importlib.util.find_spec("llama_cpp") is not None:
        return
    if os.environ.get("QRUN_REQUIRE_LLAMACPP") == "1":
        raise ImportError("QRUN_REQUIRE_LLAMACPP=1 but llama_cpp is not installed "
                          "(`make llamacpp`)")
    pytest.skip("llama-cpp-python is not installed (`make llamacpp`)", allow_module_level=True)
