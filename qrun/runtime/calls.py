"""Calls a template makes besides the stdlib (docs/language.md §21-§22): its macros, the host
functions its caller registered (qrun/functions.py), and run_tool. lang/evaluate.py reaches
them through the Calls protocol; the executor runs a macro inline when its call is the whole
of a `{{ }}` (CallRunner.inline).

A host call's arguments and result are checked as plain data (lang/inputs.py), a failure
becomes an EvaluationError at the call, and every call is recorded (trace and Stats). Sync
functions run on a worker thread when a timeout applies (a thread cannot be stopped: one that
times out is left to finish in the background); async ones on a private event loop in its own
thread, so a call works whether or not the caller runs an event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from qrun.errors import (
    EvaluationError,
    HostFunctionError,
    LimitError,
    PositionedError,
    QrunError,
    UsageError,
)
from qrun.functions import Functions, HostFunction
from qrun.lang import expr as ex
from qrun.lang import ir
from qrun.lang.builtins import text_of
from qrun.lang.evaluate import evaluate
from qrun.lang.expr import Expr
from qrun.lang.inputs import plain_inputs
from qrun.lang.names import CALL, RUN_TOOL, TOOLS
from qrun.limits import Budget
from qrun.runtime.recorder import Recorder
from qrun.runtime.session import Session
from qrun.runtime.stats import Stats
from qrun.source import Source, Span, printable


class CallingRun(Protocol):
    """What calls need of the run making them (runtime/executor.py Run)."""

    program: ir.Program
    scope: dict[str, Any]
    source: Source
    budget: Budget
    stats: Stats
    recorder: Recorder
    session: Session
    pieces: list[str]
    quiet: int
    on_text: Callable[[str], None] | None

    def flush_text(self) -> None: ...

    def evaluate(self, expr: Expr) -> Any: ...

    def emit(self, text: str, special: bool = False, op: ir.Op | None = None) -> None: ...

    def enter_scope(self, scope: dict[str, Any], source: Source) -> tuple[Any, ...]: ...

    def leave_scope(self, saved: tuple[Any, ...]) -> None: ...

    def exec_body(self, ops: Sequence[ir.Op], after: str | None = None) -> None: ...

    def aside(self) -> AbstractContextManager[None]:
        """The block does no forward: a batched run's forwards do not wait for it."""
        ...

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    """The private event loop async host functions run on (started on first use)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="qrun-host-loop",
                             daemon=True).start()
            _LOOP = loop
        return _LOOP


def invoke(function: HostFunction, args: list[Any], kwargs: dict[str, Any],
           timeout: float | None) -> Any:
    """`function(*args, **kwargs)`, awaited when async, within `timeout` seconds.

    Raises:
        TimeoutError: it took longer.
        Exception: whatever the function raised.
    """
    if function.is_async:
        coroutine: Coroutine[Any, Any, Any] = function.function(*args, **kwargs)
        future = asyncio.run_coroutine_threadsafe(coroutine, _event_loop())
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None
    if timeout is None:
        return function.function(*args, **kwargs)
    # A thread of its own per call (about 0.1 ms): the timeout counts the function's own
    # time, never a wait behind other calls (a shared pool queued the branches' calls and
    # timed them out), and a call that times out keeps its thread, not one the next needs.
    outcome: list[Any] = []

    def call() -> None:
        try:
            outcome.append((True, function.function(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            outcome.append((False, exc))

    thread = threading.Thread(target=call, name=f"qrun-host-{function.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        raise TimeoutError
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


class MacroReturn(Exception):
    """`{% return %}` on its way out of the macro it ends."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


class CallRunner:
    """The Calls of one run (lang/evaluate.py): macros of `run.program`, the host functions
    of `functions`, and run_tool."""

    def __init__(self, run: CallingRun, functions: Functions | None) -> None:
        self.run = run
        self.functions = functions if functions is not None else Functions()
        self.depth = 0
        # The program whose ops run now: the run's, or a file's that call() runs.
        self.programs = [run.program]
        # What tools() has offered so far in this run (shared with its branches): with the
        # functions its programs call by name, what run_tool() may call.
        self.offered = _Offered()

    def for_branch(self, run: CallingRun) -> CallRunner:
        """The calls of a fork branch's run (runtime/branches.py): the same functions, and the
        macros of the program running where the fork is, run in the branch's context."""
        branch = CallRunner(run, self.functions)
        branch.depth, branch.programs = self.depth, list(self.programs)
        branch.offered = self.offered
        return branch

    @property
    def macros(self) -> Mapping[str, ir.Macro]:
        return self.programs[-1].macros

    def globals(self) -> set[str]:
        """What a macro sees of its program: the inputs and top-level `set`s
        (docs/language.md §21.1)."""
        program = self.programs[-1]
        return {*program.inputs, *program.optional_inputs,
                *(op.name for op in program.ops if isinstance(op, ir.Set))}

    def check(self) -> None:
        """Before any model work: the registry has every host function the program calls
        (it may have been compiled with another).

        Raises:
            EvaluationError: at the first call of a function not registered.
        """
        for name, span in self.run.program.host_calls.items():
            if name != RUN_TOOL and name not in self.functions:
                raise EvaluationError(f"no host function '{name}' is registered for this run",
                                      span, self.run.program.source)

    def __contains__(self, name: object) -> bool:
        return (name in self.macros or name in self.functions
                or name in (RUN_TOOL, TOOLS, CALL))

    def call(self, name: str, args: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
        if name in self.macros:
            with hidden(self.run) as taken:
                value = self.macro(self.macros[name], args, kwargs, span)
            return taken.text if value is _NO_RETURN else value
        if name == CALL:
            with hidden(self.run) as taken:
                self.call_file(args, kwargs, span)
            return taken.text
        if name == RUN_TOOL:
            return self.run_tool(args, kwargs, span)
        if name == TOOLS:
            return self.tools(args, kwargs, span)
        return self.host(self.functions[name], args, kwargs, span)

    # ---- macros --------------------------------------------------------------------------------

    def inline(self, call: ir.EmitValue, after: str | None = None) -> bool:
        """Run `{{ macro(...) }}` in the current context (its text and tokens stay, and are
        streamed), then emit its `return` value, if any. False when `call` is not a macro
        call (the executor evaluates it as any value). `after`: the template text known to
        follow the call, which a hole ending the body may end at (docs/language.md §14.5), as
        if the body were written in its place; not where a `return` value comes first."""
        expr = call.expr
        if not isinstance(expr, ex.Call) or (expr.func not in self.macros
                                             and expr.func != CALL):
            return False
        run = self.run
        args = [run.evaluate(arg) for arg in expr.args]
        kwargs = {name: run.evaluate(value) for name, value in expr.kwargs}
        if expr.func not in self.macros:
            self.call_file(args, kwargs, expr.span, after)
            return True
        macro = self.macros[expr.func]
        returns = any(isinstance(op, ir.Return) for op in ir.walk(macro.body))
        value = self.macro(macro, args, kwargs, expr.span, None if returns else after)
        if value is not _NO_RETURN:
            run.emit(text_of(value), op=call)
        return True

    def macro(self, macro: ir.Macro, args: list[Any], kwargs: dict[str, Any], span: Span,
              after: str | None = None) -> Any:
        """Run `macro`'s body with its own scope and captures; its `return` value, or
        _NO_RETURN. Errors inside get a note naming the call."""
        run = self.run
        call_source = run.source
        self.check_depth(span)
        globals_ = self.globals()
        scope: dict[str, Any] = {k: run.scope[k] for k in globals_ if k in run.scope}
        # Counted from before its defaults are evaluated: a default that calls the macro
        # (`{% macro m(x=m()) %}`) recursed without bound (issue #38).
        self.depth += 1
        try:
            scope.update(self.bind(macro, args, kwargs, span, scope))
        except BaseException:
            self.depth -= 1
            raise
        saved = run.enter_scope(scope, self.programs[-1].source)
        try:
            run.exec_body(macro.body, after)
        except MacroReturn as returned:
            return returned.value
        except PositionedError as err:
            where = f"in macro '{macro.name}' called at {call_source.name}:{span}"
            raise _with_note(err, where) from None
        finally:
            self.depth -= 1
            run.leave_scope(saved)
        return _NO_RETURN

    def check_depth(self, span: Span) -> None:
        run = self.run
        if self.depth >= run.budget.limits.call_depth:
            raise LimitError(
                f"calls nested more than {run.budget.limits.call_depth} deep", span,
                run.source, ["raise the limit with run(..., limits=qrun.Limits(call_depth=...))"
                             " (docs/language.md §14.9)"])
        run.budget.step(span)

    def call_file(self, args: list[Any], kwargs: dict[str, Any], span: Span,
                  after: str | None = None) -> None:
        """`call("file.tmpl", name=value, ...)`: run the file's program (compiled with the
        calling template: lang/compiler.py) with the keyword arguments as its inputs, in the
        current context; its captures are its own."""
        run = self.run
        call_source = run.source
        name = args[0] if args else None
        program = run.program.called.get((call_source.name, name)) \
            if isinstance(name, str) else None
        if program is None or len(args) != 1:
            raise EvaluationError("call() runs a template file named by a string literal, "
                                  "with its inputs by name", span, call_source)
        self.check_depth(span)
        try:
            inputs = program.check_inputs(kwargs)
        except QrunError as err:
            message = err.message if isinstance(err, PositionedError) else str(err)
            raise EvaluationError(f"call({name!r}): {message}", span, call_source) from None
        saved = run.enter_scope(dict(inputs), program.source)
        self.programs.append(program)
        self.depth += 1
        try:
            run.exec_body(program.ops, after)
        except PositionedError as err:
            where = f"in call({name!r}) at {call_source.name}:{span}"
            raise _with_note(err, where) from None
        finally:
            self.depth -= 1
            self.programs.pop()
            run.leave_scope(saved)

    def bind(self, macro: ir.Macro, args: list[Any], kwargs: dict[str, Any], span: Span,
             scope: dict[str, Any]) -> dict[str, Any]:
        names = [p.name for p in macro.params]
        if len(args) > len(names):
            raise EvaluationError(f"{macro.name}() takes {len(names)} arguments, got "
                                  f"{len(args)}", span, self.run.source)
        bound = dict(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name not in names or name in bound:
                raise EvaluationError(f"{macro.name}() got an unexpected argument '{name}'",
                                      span, self.run.source)
            bound[name] = value
        for param in macro.params:
            if param.name in bound:
                continue
            if param.default is None:
                raise EvaluationError(f"{macro.name}() is missing argument '{param.name}'",
                                      span, self.run.source)
            bound[param.name] = evaluate(param.default, {**scope, **bound},
                                         self.programs[-1].source, self.run.budget, self)
        return bound

    def returned(self, value: Any) -> None:
        raise MacroReturn(value)

    # ---- host functions ------------------------------------------------------------------------

    def tools(self, args: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
        """`tools()` or `tools(["calc", ...])`: OpenAI tool specs of registered functions."""
        names = args[0] if args else kwargs.get("names")
        if names is not None and (not isinstance(names, list)
                                  or not all(isinstance(n, str) for n in names)):
            raise EvaluationError("tools() takes a list of host function names", span,
                                  self.run.source)
        try:
            specs = self.functions.tools(names)
        except UsageError as err:
            listed = ", ".join(self.functions) or "none"
            raise EvaluationError(f"tools(): {err} (registered: {listed})", span,
                                  self.run.source) from None
        if names is None:
            self.offered.everything = True
        else:
            self.offered.names.update(names)
        return specs

    def run_tool(self, args: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
        source = self.run.source
        call = args[0] if args else kwargs.get("call")
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            raise EvaluationError("run_tool() takes a tool call {\"name\": ..., \"arguments\": "
                                  "{...}}", span, source)
        name, arguments = call["name"], call.get("arguments", {})
        if not isinstance(arguments, Mapping):
            raise EvaluationError(f"run_tool(): the arguments of '{name}' must be a dict",
                                  span, source)
        # A call's name comes from the model or an input: it reaches only what the template
        # itself names or offers, never any function the caller registered (issue #38).
        reachable = set(self.functions) if self.offered.everything else {
            n for n in (*self.offered.names, *(c for p in self.programs for c in p.host_calls))
            if n in self.functions}
        function = self.functions.get(name) if name in reachable else None
        if function is None:
            listed = ", ".join(sorted(reachable)) or "none"
            raise EvaluationError(f"run_tool(): '{printable(name[:80])}' is not a function this "
                                  f"template calls or offers with tools() (it may call: "
                                  f"{listed})", span, source)
        return self.host(function, [], dict(arguments), span)

    def host(self, function: HostFunction, args: list[Any], kwargs: dict[str, Any],
             span: Span) -> Any:
        run = self.run
        source = run.source
        name = function.name
        try:
            plain = plain_inputs({f"{name}() argument {i + 1}": v for i, v in enumerate(args)}
                                 | {f"{name}() argument '{k}'": v for k, v in kwargs.items()})
        except UsageError as err:
            raise EvaluationError(str(err).removeprefix("input "), span, source) from None
        args, kwargs = list(plain.values())[:len(args)], dict(zip(
            kwargs, list(plain.values())[len(args):], strict=True))
        refused = function.signature.check(name, len(args), tuple(kwargs))
        if refused is not None:
            raise EvaluationError(refused, span, source)
        timeout = run.budget.limits.call_timeout_s
        started = time.perf_counter()
        error: str | None = None
        raised = False  # the function raised (HostFunctionError), not a timeout or a value
        result: Any = None
        try:
            with run.aside():
                result = invoke(function, args, kwargs, timeout)
            result = plain_inputs({"result": result})["result"]
        except TimeoutError:
            error = f"{name}() took longer than {timeout:g}s"
        except UsageError as err:
            error = f"{name}() returned a value that is not plain data: " + \
                str(err).removeprefix("input 'result'").lstrip(": ")
        except Exception as exc:  # noqa: BLE001 - the caller's function failing is the error
            error = f"{name}() failed: {type(exc).__name__}: {exc}"
            raised = True
        seconds = time.perf_counter() - started
        run.stats.host_calls += 1
        run.stats.host_s += seconds
        run.recorder.host_call(name, args, kwargs, result, error, seconds, span.line,
                               span.column)
        if raised:
            raise HostFunctionError(str(error), span, source, name)
        if error is not None:
            raise EvaluationError(error, span, source)
        return result


_NO_RETURN: Any = object()


class _Offered:
    """The host functions tools() has offered in a run: `everything` after a bare tools()."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.everything = False


class Mark:
    """A point of the run to come back to: the context's length and the result's pieces when
    it was made. Text emitted after it is held back from the stream (the run is `quiet`)
    until release() shows it, or take_back() drops it from the session (the KV cache cropped,
    nothing re-encoded), the result text and the stream. Captures made since stay."""

    def __init__(self, run: CallingRun) -> None:
        run.flush_text()
        session = run.session
        if session.overshoot is not None:
            # A hole's tokens past its value, held until the next text says whether they stay:
            # resolved now (dropped, the value's bytes appended as text's tokens), so that
            # what take_back drops is only what came after the mark.
            session.settle()
        # The context's last token, when it is text not fed yet, is read again with the text
        # after the mark, as a hidden block's is (runtime/contexts.py exec_hidden): so that
        # the body reads it as a plain run would, and a fork inside the body, which takes it
        # back the same way (Session.share), cannot take it from before the mark.
        self.tail = session.take_tail()
        self.run = run
        self.length, self.pieces = len(session.token_ids), len(run.pieces)
        self.fixed_tail = session.fixed_tail
        session.fixed_tail = 0  # a hole in the body heals no text from before the mark
        session.append_text(self.tail)
        run.quiet += 1

    def text(self) -> str:
        """The text emitted since the mark."""
        return "".join(self.run.pieces[self.pieces:])

    def release(self) -> None:
        """Keep what came since; stream it now unless an enclosing mark holds it."""
        run = self.run
        run.quiet -= 1
        if not run.quiet and run.on_text is not None:
            for piece in run.pieces[self.pieces:]:
                if piece:
                    run.on_text(piece)

    def take_back(self) -> str:
        """Drop what came since; returns its text."""
        run = self.run
        run.quiet -= 1
        text = self.text()
        del run.pieces[self.pieces:]
        run.session.take_back(self.length, self.fixed_tail)
        run.session.append_text(self.tail)
        return text


class Taken:
    """The text a hidden stretch emitted (set when it ends)."""

    text = ""


@contextmanager
def hidden(run: CallingRun) -> Iterator[Taken]:
    """Run the body in the current context, then take its text back (Mark.take_back), also
    when it fails."""
    taken = Taken()
    mark = Mark(run)
    try:
        yield taken
    finally:
        taken.text = mark.take_back()


MAX_CALL_NOTES = 5
"""An error inside nested calls names at most this many calls (the innermost first)."""


def _with_note(err: PositionedError, note: str) -> PositionedError:
    """`err` with `note` added, unless it repeats the last note (a recursive call from the
    same place) or the error names MAX_CALL_NOTES calls already."""
    called = [n for n in err.notes if n.startswith(("in macro ", "in call("))]
    if (called and called[-1] == note) or len(called) >= MAX_CALL_NOTES:
        return err
    return type(err)(err.message, err.span, err.source, [*err.notes, note])
