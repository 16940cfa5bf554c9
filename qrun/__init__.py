"""qrun: a constrained-generation template language. Public API only.

Names are imported on first use (PEP 562), so `import qrun` and compiling a template load
neither torch nor transformers: those come with the first model (tests/test_structure.py)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "BackendError": "qrun.errors",
    "ConstraintError": "qrun.errors",
    "EvaluationError": "qrun.errors",
    "GenerationError": "qrun.errors",
    "InputError": "qrun.errors",
    "ModelLoadError": "qrun.errors",
    "QrunError": "qrun.errors",
    "TemplateCompileError": "qrun.errors",
    "TemplateError": "qrun.errors",
    "TemplateErrors": "qrun.errors",
    "TemplateSyntaxError": "qrun.errors",
    "TemplateWarning": "qrun.errors",
    "UsageError": "qrun.errors",
    "RunOptions": "qrun.options",
    "ModelOptions": "qrun.options",
    "Limits": "qrun.limits",
    "Program": "qrun.lang.ir",
    "compile_file": "qrun.lang",
    "compile_source": "qrun.lang",
    "Query": "qrun.api",
    "RunEvent": "qrun.api",
    "Functions": "qrun.functions",
    "Matcher": "qrun.matcher",
    "load_model": "qrun.backends",
    "Result": "qrun.runtime.result",
    "HoleRecord": "qrun.runtime.result",
    "GenRecord": "qrun.runtime.result",
    "SelectRecord": "qrun.runtime.result",
    "Stats": "qrun.runtime.stats",
}

__all__ = [
    "BackendError",
    "ConstraintError",
    "EvaluationError",
    "Functions",
    "GenRecord",
    "GenerationError",
    "HoleRecord",
    "InputError",
    "Limits",
    "Matcher",
    "ModelLoadError",
    "ModelOptions",
    "Program",
    "QrunError",
    "Query",
    "Result",
    "RunEvent",
    "RunOptions",
    "SelectRecord",
    "Stats",
    "TemplateCompileError",
    "TemplateError",
    "TemplateErrors",
    "TemplateSyntaxError",
    "TemplateWarning",
    "UsageError",
    "compile_file",
    "compile_source",
    "load_model",
]
assert sorted(__all__) == sorted(_EXPORTS), "every export has a module, and only those"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'qrun' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:
    from qrun.api import Query
    from qrun.backends import load_model
    from qrun.errors import (
        BackendError,
        ConstraintError,
        EvaluationError,
        GenerationError,
        InputError,
        ModelLoadError,
        QrunError,
        TemplateCompileError,
        TemplateError,
        TemplateErrors,
        TemplateSyntaxError,
        TemplateWarning,
        UsageError,
    )
    from qrun.functions import Functions
    from qrun.lang import compile_file, compile_source
    from qrun.lang.ir import Program
    from qrun.limits import Limits
    from qrun.matcher import Matcher
    from qrun.options import RunOptions
    from qrun.runtime.result import GenRecord, HoleRecord, Result, SelectRecord
    from qrun.runtime.stats import Stats
