"""The user's qrun cache folder ($QRUN_CACHE, else ~/.cache/qrun), shared by every layer that
keeps files between runs: converted models (backends/loading.py) and the template parser's
tables (lang/parser_cache.py). A module of its own so that lang need not import backends."""

from __future__ import annotations

import os
from pathlib import Path

from qrun.errors import ModelLoadError

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """The qrun cache folder: $QRUN_CACHE, else ~/.cache/qrun.

    Raises:
        ModelLoadError: that path exists and is not a folder.
    """
    given = os.environ.get("QRUN_CACHE")
    path = Path(given).expanduser() if given else Path.home() / ".cache" / "qrun"
    if path.exists() and not path.is_dir():
        where = f"QRUN_CACHE={given}" if given else str(path)
        raise ModelLoadError(f"{where} is a file, not a folder; point QRUN_CACHE at a folder "
                             "(qrun creates it) or remove the file")
    return path
