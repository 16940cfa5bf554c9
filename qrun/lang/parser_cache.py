"""The template parser kept between processes: building Lark's LALR parser takes ~0.3 s at every
start (the grammar analysis, and interegular's terminal-collision checks, which only warn), while
loading its saved tables takes ~30 ms in a fresh process. The tables are saved as JSON, never
pickle, in the user's own qrun cache folder; any failure to read or write them falls back to
building the parser."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pkgutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lark
from lark import Lark, Token
from lark.grammar import Rule
from lark.lexer import TerminalDef

from qrun.cache_dir import cache_dir

__all__ = ["cache_folder", "decode", "encode", "open_cached"]

# Bump when the file layout or the JSON tagging changes.
FORMAT = 1
# Saved table files kept per folder: one per grammar text, lark version and options, so a few
# installs sharing a cache do not evict each other, while grammar edits do not pile up.
KEEP = 8
# Options that hold loader objects, not tables: they only matter while the grammar text is read.
_LOADER_OPTIONS = ("import_paths", "source_path")


def cache_folder() -> Path | None:
    """The `parsers` folder of the user's qrun cache, or None when there is none."""
    try:
        return cache_dir() / "parsers"
    except Exception:  # QRUN_CACHE names a file, or there is no home folder: just build
        return None


def open_cached(
    package: str, grammar_path: str, options: Mapping[str, Any], folder: Path | None
) -> Lark:
    """`Lark.open_from_package(package, grammar_path, ("",), **options)` (an LALR parser), loaded
    from the tables a previous process saved in `folder` when they match the grammar text, lark's
    version and the options; otherwise built, and its tables saved there for the next process.
    A missing, unreadable, damaged or stale file only costs the build; None: never cache."""
    text = pkgutil.get_data(package, grammar_path)
    if folder is None or text is None:
        return Lark.open_from_package(package, grammar_path, ("",), **options)
    key = _key(package, grammar_path, text, options)
    path = folder / f"{Path(grammar_path).stem}-{key[:32]}.json"
    loaded = _load(path, key)
    if loaded is not None:
        return loaded
    parser = Lark.open_from_package(package, grammar_path, ("",), **options)
    _save(parser, path, key)
    return parser


def _key(package: str, grammar_path: str, text: bytes, options: Mapping[str, Any]) -> str:
    described = repr((FORMAT, lark.__version__, package, grammar_path, sorted(options.items())))
    return hashlib.sha256(described.encode() + b"\0" + text).hexdigest()


def _load(path: Path, key: str) -> Lark | None:
    """The parser saved at `path`, or None when the file is missing or is not exactly what
    `_save` wrote for `key` (the header holds the key and the SHA-256 of the body)."""
    try:
        header, _, body = path.read_bytes().partition(b"\n")
        if header != f"{key} {hashlib.sha256(body).hexdigest()}".encode():
            return None
        return Lark.load(decode(body))
    except Exception:  # unreadable, or tables this lark cannot load: build instead
        return None


def _save(parser: Lark, path: Path, key: str) -> None:
    """Write the parser's tables atomically (a temporary file renamed over `path`, so a reader
    never sees half a file), then drop the oldest saved files beyond KEEP."""
    try:
        body = encode(parser)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(f"{key} {hashlib.sha256(body).hexdigest()}\n".encode() + body)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _prune(path.parent)
    except Exception:  # a read-only or full cache, or tables JSON cannot hold: keep building
        return


def _prune(folder: Path) -> None:
    saved = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in saved[KEEP:]:
        with contextlib.suppress(OSError):
            stale.unlink()


def encode(parser: Lark) -> bytes:
    """The parser's tables (Lark's own serialisation, as `Lark.save` pickles it) as JSON.

    Raises:
        TypeError: the tables hold a value the JSON tagging does not know (a newer lark).
    """
    data, memo = parser.memo_serialize([TerminalDef, Rule])
    options = {k: v for k, v in data["options"].items() if k not in _LOADER_OPTIONS}
    tables = {"data": {**data, "options": options}, "memo": memo}
    return json.dumps(_tag(tables), separators=(",", ":")).encode()


def decode(body: bytes) -> dict[str, Any]:
    """The tables `encode` wrote, ready for `Lark.load`."""
    tables = json.loads(body, object_hook=_untag)
    if not isinstance(tables, dict):
        raise ValueError("not a table file")
    return tables


# JSON has no tuples, no non-string keys and no lark Tokens (the str subclass that names rules),
# so those are written as one-key objects; a dict whose own keys could be read as such a tag is
# written as a "#dict" too, which makes the tagging unambiguous.
def _tag(value: Any) -> Any:
    kind = type(value)
    if value is None or kind in (str, int, bool):
        return value
    if kind is list:
        return [_tag(v) for v in value]
    if kind is tuple:
        return {"#tuple": [_tag(v) for v in value]}
    if kind is Token:
        return {"#token": [value.type, value.value, value.start_pos, value.line, value.column,
                           value.end_line, value.end_column, value.end_pos]}
    if kind is dict:
        if all(type(k) is str and not k.startswith("#") for k in value):
            return {k: _tag(v) for k, v in value.items()}
        return {"#dict": [[_tag(k), _tag(v)] for k, v in value.items()]}
    raise TypeError(f"cannot save a {kind.__name__} in the parser tables")


def _untag(obj: dict[str, Any]) -> Any:
    if len(obj) == 1:
        tag, value = next(iter(obj.items()))
        if tag == "#tuple":
            return tuple(value)
        if tag == "#token":
            return Token(*value)
        if tag == "#dict":
            return dict(value)
    return obj
