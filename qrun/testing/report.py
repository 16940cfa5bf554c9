"""What `qrun test` prints (docs/testing.md §4), as pytest does: a line per template with a
character per case (`.` passed, `F` an expectation failed, `E` the run failed), then each
failure with the expectation, where it was written, what was found and the hole that
produced it, and a summary line; and the JUnit XML file CI systems read."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from qrun.source import printable
from qrun.testing.runner import CaseOutcome

__all__ = ["Report", "write_junit"]

_MARK = {"passed": ".", "failed": "F", "error": "E"}
# Characters neither a terminal nor XML 1.0 should get as they are (a case file's regex or a
# generated text may hold them): written as \xNN (\uNNNN), newlines and tabs kept.
_UNSHOWN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ufffe\uffff]")


def visible(text: str) -> str:
    """`text` safe for a terminal and for XML: control characters escaped, lone surrogates
    as U+FFFD."""
    return printable(_UNSHOWN.sub(lambda m: f"\\x{ord(m.group()):02x}"
                                  if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                                  text))


def _state(outcome: CaseOutcome) -> str:
    if outcome.error is not None:
        return "error"
    return "failed" if outcome.failures else "passed"


class Report:
    """The text report on `stream`: `start(template)` before a template's cases,
    `case(outcome)` as each is known, `finish(...)` at the end."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.outcomes: list[CaseOutcome] = []
        self._open = False

    def start(self, template: str) -> None:
        self._end_line()
        self._write(f"{template} ")
        self._open = True

    def case(self, outcome: CaseOutcome) -> None:
        self.outcomes.append(outcome)
        self._write(_MARK[_state(outcome)])

    def finish(self, seconds: float, holes: Mapping[str, Mapping[str, str]],
               deselected: int = 0) -> None:
        """The failures (`holes`: per template, each capture's hole place) and the summary."""
        self._end_line()
        failed = [o for o in self.outcomes if not o.passed]
        if failed:
            self._write("\n" + " FAILURES ".center(72, "=") + "\n")
        for outcome in failed:
            self._write(f" {outcome.id} ".center(72, "_") + "\n")
            self._write(f"case at {outcome.case.where}\n")
            if outcome.error is not None:
                self._write(f"the run failed:\n{outcome.error}\n\n")
                continue
            places = holes.get(outcome.template, {})
            for expectation, found in outcome.failures:
                self._write(f"{expectation.where}: expected {expectation.describe()}\n"
                                  f"  {found}\n")
                hole = places.get(expectation.subject or "")
                if hole is not None:
                    self._write(f"  (the hole: {hole})\n")
            self._write("\n")
        counts = {state: sum(1 for o in self.outcomes if _state(o) == state)
                  for state in ("passed", "failed", "error")}
        parts = [f"{n} {state if state != 'error' else 'errors' if n != 1 else 'error'}"
                 for state, n in counts.items() if n]
        if deselected:
            parts.append(f"{deselected} deselected")
        summary = f" {', '.join(parts) or 'no cases'} in {seconds:.2f}s "
        self._write(summary.center(72, "=") + "\n")

    def _end_line(self) -> None:
        if self._open:
            self._write("\n")
            self._open = False

    def _write(self, text: str) -> None:
        self._stream.write(visible(text))
        self._stream.flush()


def write_junit(path: Path, outcomes: list[CaseOutcome], seconds: float) -> None:
    """The outcomes as JUnit XML (one testsuite `qrun`, a testcase per case: classname the
    template, name the case, time its run's seconds, which CI pages list to find slow cases).

    Raises:
        OSError: the file cannot be written.
    """
    failures = sum(1 for o in outcomes if o.error is None and o.failures)
    errors = sum(1 for o in outcomes if o.error is not None)
    suite = ElementTree.Element("testsuite", name="qrun", tests=str(len(outcomes)),
                                failures=str(failures), errors=str(errors),
                                skipped="0", time=f"{seconds:.3f}")
    for outcome in outcomes:
        case = ElementTree.SubElement(suite, "testcase", classname=visible(outcome.template),
                                      name=visible(outcome.case.name),
                                      file=visible(outcome.case.where.file),
                                      line=str(outcome.case.where.line),
                                      time=f"{outcome.seconds:.3f}")
        if outcome.error is not None:
            element = ElementTree.SubElement(case, "error", message="the run failed")
            element.text = visible(str(outcome.error))
        elif outcome.failures:
            first = outcome.failures[0][0]
            element = ElementTree.SubElement(case, "failure",
                                             message=visible(f"expected {first.describe()}"))
            element.text = visible("\n".join(f"{e.where}: expected {e.describe()}\n  {f}"
                                              for e, f in outcome.failures))
    root = ElementTree.Element("testsuites")
    root.append(suite)
    ElementTree.indent(root)
    path.write_bytes(ElementTree.tostring(root, encoding="utf-8", xml_declaration=True))
