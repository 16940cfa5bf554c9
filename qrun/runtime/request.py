"""RunRequest: one run of a program as every face asks for it (`Query.request` makes it, the
only place where options are split from inputs and the inputs and known values are checked);
qrun/runtime/runner.py runs it, and the executor trusts what it holds."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from qrun.functions import Functions
from qrun.lang.ir import Program
from qrun.options import RunOptions
from qrun.runtime.fills import Fills

TextCallback = Callable[[str], None]
"""Told each piece of a run's text as it is produced (from the run's thread)."""
HoleCallback = Callable[[str, Any], None]
"""Told each top-level capture (name, typed value) as its hole ends (from the run's thread)."""
ValueCallback = Callable[[str, str], None]
"""Told each piece of a top-level hole's text as the model writes it (the hole's name, the
piece; from the run's thread): what of the text is the model's, as it comes (a select's whole
option at once; a known value given to the run is fixed text, not told)."""


@dataclass(frozen=True, slots=True)
class RunRequest:
    """A run, checked and ready: `inputs` as `program.check_inputs` returned them, `options`
    merged over the template's own (resolved, a fresh seed drawn where none is given, when
    each run starts), `fills` the known values checked against the program's holes, and the
    host `functions` its template may call. A request may run more than once."""

    program: Program
    inputs: Mapping[str, Any]
    options: RunOptions
    fills: Fills
    functions: Functions
    on_text: TextCallback | None = None
    on_hole: HoleCallback | None = None
    on_value: ValueCallback | None = None

    def for_item(self, index: int) -> RunRequest:
        """This request as item `index` of a batch (RunOptions.for_item: a seed derived from
        the request's and the index)."""
        return replace(self, options=self.options.for_item(index))

    def streaming(self, on_text: TextCallback | None, on_hole: HoleCallback | None = None,
                  on_value: ValueCallback | None = None) -> RunRequest:
        """This request with callbacks told its text, holes and values as they come."""
        return replace(self, on_text=on_text, on_hole=on_hole, on_value=on_value)
