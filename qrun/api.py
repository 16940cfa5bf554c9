"""The Python embedding (LANGUAGE.md §5): Query(text).run(**inputs) -> Result."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from qrun.backends import load_model
from qrun.backends.base import Backend
from qrun.backends.loading import DEFAULT_MODEL
from qrun.errors import QrunError, UsageError
from qrun.lang import compile_file, compile_source
from qrun.lang.ir import Program
from qrun.lang.limits import Limits
from qrun.runtime.batch import run_batched
from qrun.runtime.constraints import ConstraintCompiler
from qrun.runtime.executor import RunOptions, check_inputs, execute
from qrun.runtime.prefix_cache import DEFAULT_CACHE_MB
from qrun.runtime.result import Result


class Query:
    """A compiled template, ready to run many times.

    Raises (on construction):
        TemplateErrors: the template does not compile (every error found, with positions).
    """

    def __init__(self, text: str, name: str = "<string>") -> None:
        self._setup(compile_source(text, name))

    def _setup(self, program: Program) -> None:
        self.program: Program = program
        self._backends: dict[tuple[str, str | None, str | None, str, str | None], Backend] = {}
        self._constraints: dict[Backend, ConstraintCompiler] = {}

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Query:
        """Compile a .tmpl file (errors are reported under its path).

        Raises:
            UsageError: the file cannot be read.
            TemplateErrors: the template does not compile.
        """
        query = cls.__new__(cls)
        query._setup(compile_file(path))
        return query

    @property
    def inputs(self) -> tuple[str, ...]:
        """The names a run must supply."""
        return self.program.inputs

    def run(
        self,
        inputs: Mapping[str, Any] | None = None,
        /,
        *,
        model: Backend | str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        max_tokens: int | None = None,
        limits: Limits | None = None,
        on_text: Callable[[str], None] | None = None,
        **named_inputs: Any,
    ) -> Result:
        """Run the template once. Inputs come as a mapping, as keyword arguments, or both (an
        input named like an option, e.g. `seed`, must go in the mapping). `limits` bounds the
        evaluation work of the run (lang/limits.py).

        Raises:
            InputError: a declared input is missing (before the model is loaded).
            ModelLoadError: the model cannot be loaded.
            GenerationError: a hole cannot be filled legally.
        """
        values = {**(inputs or {}), **named_inputs}
        check_inputs(self.program, values)
        backend = self.backend(model, device, dtype)
        options = RunOptions(temperature, top_p, seed, max_tokens, limits or Limits())
        return execute(self.program, backend, values, options, on_text,
                       self._constraint_compiler(backend))

    def run_many(
        self,
        inputs: Iterable[Mapping[str, Any]],
        /,
        *,
        model: Backend | str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        max_tokens: int | None = None,
        limits: Limits | None = None,
        batch_size: int = 1,
        on_result: Callable[[int, Result | QrunError], None] | None = None,
    ) -> list[Result | QrunError]:
        """Run the template once per input mapping; results come back in input order.

        Up to `batch_size` runs advance together, sharing one model forward per step; the
        model's prefix cache (see load_model's cache_mb) serves their common prefix once. A
        run that fails puts its error in its place and the others still run; `on_result(i, r)`
        is called as each run finishes, so nothing already produced is lost.

        Raises:
            UsageError: batch_size < 1.
        """
        if batch_size < 1:
            raise UsageError(f"batch_size must be ≥ 1, got {batch_size}")
        rows = [dict(values) for values in inputs]
        backend = self.backend(model, device, dtype)
        options = RunOptions(temperature, top_p, seed, max_tokens, limits or Limits())
        constraints = self._constraint_compiler(backend)
        if batch_size > 1 and len(rows) > 1:
            return run_batched(self.program, backend, rows, options, constraints, batch_size,
                               on_result)
        results: list[Result | QrunError] = []
        for index, values in enumerate(rows):
            outcome: Result | QrunError
            try:
                outcome = execute(self.program, backend, values, options, None, constraints)
            except QrunError as exc:
                outcome = exc
            results.append(outcome)
            if on_result is not None:
                on_result(index, outcome)
        return results

    def backend(
        self, model: Backend | str | None = None, device: str | None = None,
        dtype: str | None = None, cache_mb: int | None = None, kind: str = "transformers",
        url: str | None = None,
    ) -> Backend:
        """The backend a run would use: `model` if given a loaded one, else the named model
        (argument, then front matter, then the default), loaded once per Query on the backend
        `kind` ("transformers" or "vllm"; with `url`, a vLLM server)."""
        if model is not None and not isinstance(model, str):
            return model
        defaults = self.program.defaults
        name = model or defaults.model or DEFAULT_MODEL
        key = (name, device or defaults.device, dtype or defaults.dtype, kind, url)
        if key not in self._backends:
            budget = DEFAULT_CACHE_MB if cache_mb is None else cache_mb
            self._backends[key] = load_model(name, key[1], key[2], kind, cache_mb=budget,
                                             url=url)
        return self._backends[key]

    def _constraint_compiler(self, backend: Backend) -> ConstraintCompiler:
        # One per backend (keyed by the object itself): compiled token indexes are shared by
        # every run of this query.
        if backend not in self._constraints:
            self._constraints[backend] = ConstraintCompiler(backend)
        return self._constraints[backend]
