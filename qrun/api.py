"""The Python embedding (docs/language.md §16.1): Query(text).run(**inputs) -> Result.
Backends and the runtime are imported when a run needs them, so compiling a template loads
neither torch nor transformers."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qrun.errors import QrunError, TemplateWarning, UsageError
from qrun.functions import Functions
from qrun.lang import compile_file, compile_source
from qrun.lang.ir import Program
from qrun.options import ModelOptions, RunOptions

if TYPE_CHECKING:
    from qrun.backends.base import Backend
    from qrun.runtime.request import RunRequest
    from qrun.runtime.result import Result
    from qrun.runtime.runner import Runner, Ticket


HostFunctions = Functions | Mapping[str, Callable[..., Any]]
"""Host functions as a qrun.Functions or a dict of name -> callable (docs/language.md §22)."""


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One event of `Query.astream`: `kind` "text" (`text`), "hole" (`name`, `value`) or
    "done" (`result`)."""

    kind: str
    text: str = ""
    name: str = ""
    value: Any = None
    result: Result | None = None


class Query:
    """A compiled template, ready to run many times. A template given as text includes other
    files (`{% include %}`) only from `include_dir`. `functions` are the host functions its
    template may call (checked when it compiles: names and arguments).

    Raises (on construction from text):
        TemplateErrors: the template does not compile (every error found, with positions).
    """

    def __init__(self, template: str | Program, name: str = "<string>",
                 include_dir: str | os.PathLike[str] | None = None,
                 functions: HostFunctions | None = None) -> None:
        self.functions = Functions.of(functions)
        self.program: Program = (
            template if isinstance(template, Program)
            else compile_source(template, name, include_dir, self.functions.signatures()))
        self._models: dict[ModelOptions, Backend] = {}
        # The runner of each backend this query ran on, held so that it (its compiled
        # constraints) lives as long as the query does (qrun/runtime/runner.py).
        self._runners: dict[Backend, Runner] = {}

    @classmethod
    def from_file(cls, path: str | os.PathLike[str],
                  include_dir: str | os.PathLike[str] | None = None,
                  functions: HostFunctions | None = None) -> Query:
        """Compile a .tmpl file (errors are reported under its path); its includes stay inside
        `include_dir`, by default the file's folder.

        Raises:
            UsageError: the file cannot be read.
            TemplateErrors: the template does not compile.
        """
        registry = Functions.of(functions)
        return cls(compile_file(path, include_dir, registry.signatures()), functions=registry)

    @property
    def inputs(self) -> tuple[str, ...]:
        """The names a run must supply."""
        return self.program.inputs

    @property
    def optional_inputs(self) -> tuple[str, ...]:
        """The names a run may supply (tested with `is defined`, or given a `default`)."""
        return self.program.optional_inputs

    @property
    def input_schema(self) -> dict[str, Any]:
        """The JSON Schema of a run's inputs, an object with one property per input: a typed
        input's declared schema (docs/language.md §4.1), any value for an untyped one."""
        return self.program.input_schema

    @property
    def output_schema(self) -> dict[str, Any] | None:
        """The JSON Schema of `Result.output` (the front matter's `output:`), or None."""
        schema = self.program.output_schema
        return None if schema is None else dict(schema)

    @property
    def warnings(self) -> tuple[TemplateWarning, ...]:
        """What compiles but likely does not mean what it says (docs/language.md §13), in
        source order: `print(w)` shows each with its position, like an error."""
        return self.program.warnings

    def run(
        self,
        inputs: Mapping[str, Any] | None = None,
        /,
        *,
        model: Backend | ModelOptions | str | None = None,
        options: RunOptions | None = None,
        on_text: Callable[[str], None] | None = None,
        fill: Mapping[str, Any] | None = None,
        **values: Any,
    ) -> Result:
        """Run the template once. Inputs come as a mapping, as keyword arguments, or both.
        Keyword arguments named like a run option (temperature, top_p, top_k, seed,
        max_tokens: see RunOptions) are options, and override `options`; an input with such a
        name (or named `fill`) goes in the mapping. `model` is a loaded model, or a name or
        ModelOptions for `load`. `fill` gives holes their values (docs/language.md §16.1:
        inserted as fixed text, checked against the hole; a loop's hole takes a list).

        Raises:
            UsageError: a run option is invalid, or `fill` names no hole (before anything
                else).
            InputError: a declared input is missing or does not fit its type (before the
                model is loaded), or a known value does not fit its hole.
            ModelLoadError: the model cannot be loaded.
            GenerationError: a hole cannot be filled legally.
        """
        request = self._request(inputs, options, fill, values, on_text)
        return self.runner(model).run(request)

    async def arun(
        self,
        inputs: Mapping[str, Any] | None = None,
        /,
        *,
        model: Backend | ModelOptions | str | None = None,
        options: RunOptions | None = None,
        on_text: Callable[[str], None] | None = None,
        fill: Mapping[str, Any] | None = None,
        **values: Any,
    ) -> Result:
        """`run`, awaited: the run works in a thread of its own, and the runs of every
        `arun` and `astream` on the same loaded model (from any Query) share its forwards,
        one batch per step (qrun/runtime/runner.py; docs/serve.md §1.2), so concurrent
        coroutines are batched without a server. `on_text` is called from the run's thread.
        Cancelling the awaiting task cancels the run at its next forward.

        Raises:
            as `run`.
        """
        import asyncio

        ticket = await self._submit_shared(inputs, model, options, values, on_text, None, fill)
        try:
            result: Result = await asyncio.wrap_future(ticket.future)
        except asyncio.CancelledError:
            ticket.cancel()
            raise
        return result

    async def astream(
        self,
        inputs: Mapping[str, Any] | None = None,
        /,
        *,
        model: Backend | ModelOptions | str | None = None,
        options: RunOptions | None = None,
        fill: Mapping[str, Any] | None = None,
        **values: Any,
    ) -> AsyncIterator[RunEvent]:
        """`arun` as events, in the order the run makes them: `text` (each piece of text as it
        is produced), `hole` (each top-level hole's name and typed value as it ends), and last
        `done` (with the Result). Leaving the loop early cancels the run at its next forward.

        Raises:
            as `run` (from the loop, where the run failed).
        """
        import asyncio

        loop = asyncio.get_running_loop()
        events: asyncio.Queue[RunEvent | None] = asyncio.Queue()

        def push(event: RunEvent | None) -> None:
            # The caller may have left the loop early and closed the event loop while the run
            # still ends in its thread (cancelled at its next forward): no one listens then.
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:
                if not loop.is_closed():
                    raise

        ticket = await self._submit_shared(
            inputs, model, options, values, lambda text: push(RunEvent("text", text=text)),
            lambda name, value: push(RunEvent("hole", name=name, value=value)), fill)
        # After every text and hole event: the run's thread pushed those before it ended.
        ticket.future.add_done_callback(lambda _: push(None))
        try:
            while (event := await events.get()) is not None:
                yield event
            yield RunEvent("done", result=ticket.future.result())
        finally:
            ticket.cancel()

    async def _submit_shared(
        self, inputs: Mapping[str, Any] | None, model: Backend | ModelOptions | str | None,
        options: RunOptions | None, values: dict[str, Any],
        on_text: Callable[[str], None] | None, on_hole: Callable[[str, Any], None] | None,
        fill: Mapping[str, Any] | None = None,
    ) -> Ticket:
        """A run of this query admitted to its model's runner (arun, astream)."""
        import asyncio

        request = self._request(inputs, options, fill, values, on_text, on_hole)
        loads = model is None or isinstance(model, str | ModelOptions)  # not in the event loop
        runner = await asyncio.to_thread(self.runner, model) if loads else self.runner(model)
        return runner.submit(request)

    def request(
        self,
        inputs: Mapping[str, Any] | None = None,
        /,
        *,
        options: RunOptions | None = None,
        fill: Mapping[str, Any] | None = None,
        on_text: Callable[[str], None] | None = None,
        on_hole: Callable[[str, Any], None] | None = None,
        **values: Any,
    ) -> RunRequest:
        """A run of this query, checked and ready for a model's runner (`runner(model).run`,
        `.submit`, `.map`): the one place where keyword arguments named like a run option are
        split from inputs (as `run` takes them), the options merged over the template's own,
        and the inputs and known values checked. `on_text` is told each piece of text,
        `on_hole` each top-level hole's name and typed value as it ends.

        Raises:
            UsageError: a run option is invalid, or `fill` names no hole.
            InputError: a declared input is missing or does not fit its type.
        """
        return self._request(inputs, options, fill, values, on_text, on_hole)

    def _request(self, inputs: Mapping[str, Any] | None, options: RunOptions | None,
                 fill: Mapping[str, Any] | None, values: Mapping[str, Any],
                 on_text: Callable[[str], None] | None = None,
                 on_hole: Callable[[str, Any], None] | None = None) -> RunRequest:
        from qrun.runtime.fills import Fills
        from qrun.runtime.request import RunRequest

        chosen, named = RunOptions.split(values)
        run_options = chosen.over(options or RunOptions()).over(self.program.options)
        if named or inputs is None:
            inputs = {**(inputs or {}), **named}
        checked = self.program.check_inputs(inputs)
        fills = Fills(self.program, fill or {})  # a name that is no hole: refused here
        return RunRequest(self.program, checked, run_options, fills, self.functions, on_text,
                          on_hole)

    def runner(self, model: Backend | ModelOptions | str | None = None) -> Runner:
        """The runner of `model` (loaded as `run` loads it): what runs this query's requests
        (qrun/runtime/runner.py), shared with every other query on the same loaded model.

        Raises:
            ModelLoadError, UsageError: as load_model.
        """
        from qrun.runtime.runner import Runner

        backend = self._model(model)
        runner = self._runners.get(backend)
        if runner is None:
            runner = self._runners[backend] = Runner.of(backend)
        return runner

    def run_many(
        self,
        inputs: Iterable[Mapping[str, Any]],
        /,
        *,
        model: Backend | ModelOptions | str | None = None,
        options: RunOptions | None = None,
        batch_size: int = 1,
        on_result: Callable[[int, Result | QrunError], None] | None = None,
        fill: Sequence[Mapping[str, Any] | None] | None = None,
        **option_values: Any,
    ) -> list[Result | QrunError]:
        """Run the template once per input mapping; results come back in input order. Run
        options as for `run` (keywords override `options`); with a seed S, item i runs with a
        seed derived from S and i, whatever the batch size; without one each draws its own.

        Up to `batch_size` runs advance together, sharing one model forward per step; the
        model's prefix cache (see load_model's cache_mb) serves their common prefix once. A
        run that fails puts its error in its place and the others still run; `on_result(i, r)`
        is called as each run finishes, so nothing already produced is lost. `fill` gives
        each run its known values (as `run`'s, docs/language.md §16.1): one mapping (or None)
        per input, in the same order.

        Raises:
            UsageError: batch_size < 1, an invalid or unknown run option, or `fill` not one
                per input.
        """
        chosen, unknown = RunOptions.split(option_values)
        if unknown:
            raise UsageError(f"run_many() got unknown keyword argument(s): "
                             f"{', '.join(sorted(unknown))} (inputs go in the mappings)")
        if batch_size < 1:
            raise UsageError(f"batch_size must be ≥ 1, got {batch_size}")
        rows = [dict(values) for values in inputs]
        fills = [dict(f or {}) for f in fill] if fill is not None else [{} for _ in rows]
        if len(fills) != len(rows):
            raise UsageError(f"run_many() got {len(fills)} fill mappings for {len(rows)} inputs: "
                             "give one per input (None for none)")
        run_options = chosen.over(options or RunOptions())
        requests: list[RunRequest | QrunError] = []
        for index, (values, known) in enumerate(zip(rows, fills, strict=True)):
            try:
                # Item i's seed is derived from the run's seed (front matter's included) and i.
                requests.append(self._request(values, run_options, known, {})
                                .for_item(index))
            except QrunError as exc:  # this input's error in its place; the others run
                requests.append(exc)
        runner = self.runner(model)
        return runner.map(requests, min(batch_size, max(len(rows), 1)), on_result)

    def load(
        self,
        model: str | None = None,
        *,
        device: str | None = None,
        dtype: str | None = None,
        backend: str | None = None,
        cache_mb: int | None = None,
        url: str | None = None,
        timeout: float | None = None,
        options: ModelOptions | None = None,
    ) -> Backend:
        """The model a run uses, loaded once per Query for each `model_options`: the keywords
        (the fields of ModelOptions) override `options`, and what neither gives comes from
        the front matter, then the defaults. A template without holes gets the model's
        tokenizer only (no weights are loaded).

        Raises:
            ModelLoadError, UsageError: as load_model.
        """
        from qrun.backends import load_model

        given = ModelOptions(model=model, backend=backend, device=device, dtype=dtype,
                             cache_mb=cache_mb, url=url, timeout=timeout)
        chosen = self.model_options(given.over(options or ModelOptions()))
        if chosen not in self._models:
            self._models[chosen] = load_model(options=chosen)
        return self._models[chosen]

    def model_options(self, given: ModelOptions | None = None) -> ModelOptions:
        """The model a run of this query loads, every choice resolved (ModelOptions.resolved):
        `given`, over the front matter's model, device and dtype, over the defaults; the
        tokenizer alone (weights False) for a template without holes, unless `given` says.

        Raises:
            UsageError: choices that do not go together (the front matter's device with
                backend llamacpp).
        """
        needs = ModelOptions(weights=bool(self.program.captures))
        return (given or ModelOptions()).over(self.program.model).over(needs).resolved()

    def _model(self, model: Backend | ModelOptions | str | None) -> Backend:
        if isinstance(model, ModelOptions):
            return self.load(options=model)
        if model is None or isinstance(model, str):
            return self.load(model)
        return model
