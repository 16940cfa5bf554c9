"""Helpers of the command-line suites (imported by name: tests/ folders are not packages)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

QA = 'Question: {{ question }}\nAnswer:{{ gen answer max_tokens=6 }}\nDone.'


def write(tmp_path: Path, text: str, name: str = "t.tmpl") -> str:
    """A template file in tmp_path; its path."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def rows(out: str) -> list[dict[str, Any]]:
    """JSON Lines printed by qrun, split at "\\n" only, each line parsed."""
    assert out.endswith("\n") or out == ""
    return [json.loads(line) for line in out.split("\n")[:-1]]


def record_loads(monkeypatch: pytest.MonkeyPatch,
                 on_load: Callable[[Any], None] | None = None) -> list[bool | None]:
    """The `weights` option of every model load from now on (a load of the tokenizer alone
    is False), in order; the loads still happen, and `on_load` is given each loaded backend
    that has weights."""
    import qrun.backends

    loaded: list[bool | None] = []
    load = qrun.backends.load_model

    def recording(*args: Any, **kwargs: Any) -> Any:
        loaded.append(kwargs["options"].weights)
        backend = load(*args, **kwargs)
        if on_load is not None and loaded[-1] is not False:
            on_load(backend)
        return backend

    monkeypatch.setattr(qrun.backends, "load_model", recording)
    return loaded
