"""qrun: a constrained-generation template language. Public API only."""

from __future__ import annotations

from qrun.api import Query
from qrun.backends import load_model
from qrun.errors import (
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
    UsageError,
)
from qrun.lang import compile_file, compile_source
from qrun.lang.ir import Program
from qrun.runtime.result import Result
from qrun.runtime.stats import Stats

__version__ = "0.1.0"

__all__ = [
    "ConstraintError",
    "EvaluationError",
    "GenerationError",
    "InputError",
    "ModelLoadError",
    "Program",
    "QrunError",
    "Query",
    "Result",
    "Stats",
    "TemplateCompileError",
    "TemplateError",
    "TemplateErrors",
    "TemplateSyntaxError",
    "UsageError",
    "compile_file",
    "compile_source",
    "load_model",
]
