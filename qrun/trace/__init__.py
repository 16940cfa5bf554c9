"""Run traces (docs/trace.md): what a run did token by token, as JSON-compatible data the runtime
records, written out as JSON or as one self-contained HTML page (`qrun FILE --trace run.html`).
Torch-free: this package imports the standard library and itself only."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qrun.trace.format import (
    FORMAT,
    VERSION,
    Hole,
    SelectOption,
    SourcePos,
    TokenEvent,
    TopToken,
    Trace,
    TraceFormatError,
    validate,
)
from qrun.trace.html import render_html

__all__ = [
    "FORMAT",
    "VERSION",
    "Hole",
    "SelectOption",
    "SourcePos",
    "TokenEvent",
    "TopToken",
    "Trace",
    "TraceFormatError",
    "render_html",
    "to_json",
    "validate",
    "write_html",
    "write_json",
    "write_trace",
]


def to_json(trace: Mapping[str, Any]) -> str:
    """The trace as JSON text (validated first): top-level fields one per line, then one line
    per event and per hole, so a long run stays greppable and diffable. Never NaN/Infinity:
    json's allow_nan=False backs up validate's finiteness check."""
    checked = validate(trace)

    def dump(value: object) -> str:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))

    lines = [f"  {dump(key)}: {dump(value)}," for key, value in checked.items()
             if key not in ("events", "holes")]
    records: tuple[tuple[str, Sequence[object]], ...] = (
        ("events", checked["events"]), ("holes", checked["holes"]))
    for key, items in records:
        body = ",\n".join(f"    {dump(item)}" for item in items)
        lines.append(f"  {dump(key)}: [\n{body}\n  ]," if items else f"  {dump(key)}: [],")
    lines[-1] = lines[-1].rstrip(",")
    return "{\n" + "\n".join(lines) + "\n}\n"


def write_json(trace: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write the trace as JSON (UTF-8). A lone surrogate in a string (a str read back from JSON
    may hold one) is written as its JSON escape, so the file reads back as the same trace."""
    Path(path).write_text(to_json(trace), encoding="utf-8", errors="backslashreplace")


def write_html(trace: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write the trace's self-contained HTML page (UTF-8)."""
    Path(path).write_text(render_html(trace), encoding="utf-8")


def write_trace(trace: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write HTML or JSON by the file's suffix (.html/.htm or .json), as `--trace PATH` does."""
    suffix = Path(path).suffix.lower()
    if suffix in (".html", ".htm"):
        write_html(trace, path)
    elif suffix == ".json":
        write_json(trace, path)
    else:
        raise ValueError(f"{os.fspath(path)!r}: a trace is written as .html or .json")

