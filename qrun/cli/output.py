"""What the `qrun` command shows while it works (qrun/cli/command.py decides when): the template's
opening text before the model loads, a notice on a terminal while loading takes long, JSON
Lines printed in input order, and Ctrl-C during batched runs, which ends the command
with every line already printed whole (docs/language.md §16.2)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from qrun.jsonio import dumps_line
from qrun.lang import ir

# Loading shorter than this shows nothing: a notice that flashes is noise.
NOTICE_AFTER_S = 0.5


class StdoutText:
    """Streams text to stdout and remembers whether the last line is open, so an error
    message after streamed text starts on a fresh line."""

    def __init__(self) -> None:
        self.open_line = False

    def __call__(self, text: str) -> None:
        if not text:
            return
        sys.stdout.write(text)
        sys.stdout.flush()
        self.open_line = not text.endswith("\n")

    def end_line(self) -> None:
        if self.open_line:
            self("\n")


write = StdoutText()


def leading_text(program: ir.Program) -> str:
    """The fixed text a template starts with, known before any model work: its leading text
    ops (a role block, a value or a hole ends it)."""
    pieces = []
    for op in program.ops:
        if not isinstance(op, ir.EmitText):
            break
        pieces.append(op.text)
    return "".join(pieces)


class SkipEcho:
    """The run's on_text, when `shown` was printed already: the run's first text is that
    text again, so it is dropped once, and everything after is passed to `out`."""

    def __init__(self, shown: str, out: Callable[[str], None]) -> None:
        self.pending = shown
        self.out = out

    def __call__(self, text: str) -> None:
        if self.pending:
            same = 0
            while same < min(len(text), len(self.pending)) and text[same] == self.pending[same]:
                same += 1
            # A text that departs from what was shown (never, for fixed text) ends the skip.
            self.pending = self.pending[same:] if same == len(text) else ""
            text = text[same:]
        self.out(text)


class LoadingNotice:
    """`with LoadingNotice(name, quiet):` around loading a model: when it takes longer than
    NOTICE_AFTER_S and stderr is a terminal, "qrun: loading model NAME ..." appears there,
    and is erased when loading ends (the cursor goes back where it was)."""

    def __init__(self, name: str, quiet: bool = False) -> None:
        self.name = name
        self.enabled = not quiet and sys.stderr.isatty()
        self.lock = threading.Lock()
        self.shown = False
        self.timer: threading.Timer | None = None

    def __enter__(self) -> LoadingNotice:
        if self.enabled:
            self.timer = threading.Timer(NOTICE_AFTER_S, self._show)
            self.timer.daemon = True
            self.timer.start()
        return self

    def _show(self) -> None:
        with self.lock:
            if self.timer is None:
                return
            # ESC 7 saves the cursor; the notice is written after it.
            sys.stderr.write(f"\0337qrun: loading model {self.name} ...")
            sys.stderr.flush()
            self.shown = True

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            if self.shown:
                # ESC 8 restores the cursor, ESC [J erases from there to the end of the screen.
                sys.stderr.write("\0338\033[J")
                sys.stderr.flush()
                self.shown = False


class OrderedPrinter:
    """Prints JSON lines in input order as results arrive in any order (thread-safe). Each
    line is one write, under the lock; after `stop()` nothing more is printed, so an
    interrupted command leaves only whole lines."""

    def __init__(self, total: int, quiet: bool = False) -> None:
        self.lines: dict[int, dict[str, Any]] = {}
        self.next = 0
        self.failed = False
        self.stopped = False
        self.progress = _progress(total, quiet)
        self.lock = threading.Lock()

    def put(self, index: int, line: dict[str, Any]) -> None:
        with self.lock:
            if self.stopped:
                return
            self.lines[index] = line
            self.failed |= "error" in line
            if self.progress is not None:
                self.progress.update(1)
            while self.next in self.lines:
                sys.stdout.write(dumps_line(self.lines.pop(self.next)) + "\n")
                sys.stdout.flush()
                self.next += 1

    def stop(self) -> None:
        """Print nothing more (waits for a line being printed to end)."""
        with self.lock:
            self.stopped = True
            if self.progress is not None:
                self.progress.close()
                self.progress = None

    def close(self) -> None:
        self.stop()


def _progress(total: int, quiet: bool) -> Any:
    if quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="run", file=sys.stderr)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while runs went on in a worker thread; `runs_left`: they still do."""

    def __init__(self, runs_left: bool) -> None:
        super().__init__()
        self.runs_left = runs_left


def end_process(code: int) -> None:
    """End the process now, its output flushed. For a Ctrl-C while runs are still inside
    torch in worker threads: the interpreter's normal shutdown would stop those threads in
    the middle of C++ code and abort ("terminate called without an active exception",
    measured with --batch-size 4), losing the exit status."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def in_background(job: Callable[[], None], printer: OrderedPrinter) -> None:
    """Run `job` (runs that print through `printer`) in a worker thread while this thread
    waits, so Ctrl-C reaches this thread alone, never the middle of a run, a batch or a
    line: the printer is stopped (the line being printed ends first) and KeyboardInterrupt
    goes on to the caller. The worker, a daemon, ends with the process.

    Raises:
        Interrupted: Ctrl-C while waiting.
        Exception: whatever `job` raised.
    """
    failure: list[BaseException] = []
    done = threading.Event()

    def work() -> None:
        try:
            job()
        except BaseException as exc:  # handed to the waiting thread
            failure.append(exc)
        finally:
            done.set()

    # Waiting on an Event, not Thread.join: a join interrupted by Ctrl-C leaves the thread
    # reported dead while it still runs (CPython gh-90882; seen here with Python 3.11).
    threading.Thread(target=work, name="qrun-runs", daemon=True).start()
    try:
        while not done.wait(0.1):
            pass
    except KeyboardInterrupt:
        printer.stop()
        raise Interrupted(runs_left=not done.is_set()) from None
    printer.close()
    if failure:
        raise failure[0]
