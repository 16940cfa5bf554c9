"""The parser's tables kept between processes (lang/parser_cache.py): a loaded parser parses and
fails exactly like a built one; the file lives in the user's qrun cache, is keyed by the grammar,
lark's version and the options, is written atomically, and any damage or failure falls back to
building the parser."""

from __future__ import annotations

import ast as pyast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lark
import pytest
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedInput

from qrun.lang.parser_cache import KEEP, cache_folder, decode, encode, open_cached

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = {"parser": "lalr", "lexer": "contextual", "propagate_positions": True,
           "maybe_placeholders": True}
BROKEN = ["{{ x", "{% if x %}", "{{ gen }}", "{% for %}", "{{ 1 + }}", "---\na: 1\n",
          "{% endif %}", "{{ x | }}", "{% raw %}", "{{ 'abc }}", "{# c", "{{ x is divisibleby 3 }}",
          "{% elif x %}", "text {{ a.b[ }}", "{{ gen a regex= }}", "{% set %}", "}}", "{{ {'a': }}"]


def corpus() -> list[str]:
    files = [*sorted((ROOT / "examples").glob("*.tmpl")),
             *sorted((ROOT / "tests/lang/golden").glob("*/template.tmpl"))]
    return [f.read_text() for f in files] + BROKEN


def describe(parser: Lark, text: str) -> str:
    """Everything qrun reads of a parse: the tree with every node's and token's position, or
    the error with its position, expected terminals and what the parser state accepts."""
    try:
        tree = parser.parse(text)
    except UnexpectedInput as err:
        accepts = sorted(err.interactive_parser.accepts()) if hasattr(
            err, "interactive_parser") else None
        expected = sorted(getattr(err, "expected", None) or getattr(err, "allowed", None) or ())
        return f"{type(err).__name__} {err.line}:{err.column} {expected} {accepts}"
    return "\n".join(_positions(tree))


def _positions(node: Tree[Token] | Token | None) -> list[str]:
    if isinstance(node, Token):
        return [f"{node.type} {node.value!r} {node.line}:{node.column}-{node.end_line}:"
                f"{node.end_column} {node.start_pos}-{node.end_pos}"]
    if node is None:
        return ["None"]
    meta = node.meta
    span = (f"{meta.line}:{meta.column}-{meta.end_line}:{meta.end_column}"
            if not meta.empty else "empty")
    # A rule's name by value: lark 1.3's own serialisation writes it as a plain str
    # (lark/grammar.py NonTerminal.serialize), where the built parser has a Token('RULE', ...);
    # qrun only compares names (lang/build.py, lang/parser.py).
    assert isinstance(node.data, str)
    lines = [f"{str(node.data)!r} {span}"]
    for child in node.children:
        lines.extend("  " + line for line in _positions(child))
    return lines


@pytest.fixture(scope="module")
def built() -> Lark:
    return open_cached("qrun.lang", "grammar.lark", OPTIONS, None)


def no_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, a parser can only come from a saved file."""
    def refuse(*args: Any, **kwargs: Any) -> Lark:
        raise AssertionError("the parser was built instead of loaded")
    monkeypatch.setattr(Lark, "open_from_package", refuse)


def saved_files(folder: Path) -> list[Path]:
    return sorted(folder.iterdir())


def test_a_loaded_parser_parses_and_fails_like_a_built_one(
        tmp_path: Path, built: Lark, monkeypatch: pytest.MonkeyPatch) -> None:
    open_cached("qrun.lang", "grammar.lark", OPTIONS, tmp_path)
    [saved] = saved_files(tmp_path)
    no_build(monkeypatch)
    loaded = open_cached("qrun.lang", "grammar.lark", OPTIONS, tmp_path)
    for text in corpus():
        assert describe(loaded, text) == describe(built, text), text
    for terminal in built.terminals:  # parser.py reads a terminal's pattern kind and value
        got, want = loaded.get_terminal(terminal.name).pattern, terminal.pattern
        assert type(got) is type(want) and got.value == want.value and got.raw == want.raw
        # Lark's own save/load (its pickle cache too) gives the flags back as a list.
        assert set(got.flags) == set(want.flags)
    assert saved_files(tmp_path) == [saved]


def test_the_tables_survive_json_exactly(built: Lark) -> None:
    """Every tuple, int key and Token comes back with its own type, not as a list or str."""
    from lark.grammar import Rule
    from lark.lexer import TerminalDef

    data, memo = built.memo_serialize([TerminalDef, Rule])
    del data["options"]["import_paths"], data["options"]["source_path"]
    assert _typed(decode(encode(built))) == _typed({"data": data, "memo": memo})


def _typed(value: Any) -> Any:
    """A comparable form that keeps every value's exact type (so 1 != True, tuple != list)."""
    if isinstance(value, dict):
        return ("dict", sorted((repr(_typed(k)), _typed(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, [_typed(v) for v in value])
    if isinstance(value, Token):
        return ("Token", value.type, value.value, value.start_pos, value.line, value.column,
                value.end_line, value.end_column, value.end_pos)
    return (type(value).__name__, value)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "header", "empty", "garbage",
                                    "valid digest, not tables", "wrong key"])
def test_a_damaged_file_is_rebuilt_and_replaced(
        tmp_path: Path, built: Lark, damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    open_cached("qrun.lang", "grammar.lark", OPTIONS, tmp_path)
    [saved] = saved_files(tmp_path)
    good = saved.read_bytes()
    header, _, body = good.partition(b"\n")
    key = header.split(b" ")[0]
    damaged = {
        "truncated": good[: len(good) // 2],
        "flipped": good[:-40] + bytes([good[-40] ^ 0x01]) + good[-39:],
        "header": b"not a header\n" + body,
        "empty": b"",
        "garbage": os.urandom(4096),
        "valid digest, not tables": _with_digest(key, b'{"data": [1, 2], "memo": {}}'),
        "wrong key": _with_digest(b"0" * 64, body),
    }[damage]
    saved.write_bytes(damaged)
    parser = open_cached("qrun.lang", "grammar.lark", OPTIONS, tmp_path)
    for text in corpus():
        assert describe(parser, text) == describe(built, text), text
    # The build wrote the file again (Lark's tables are equivalent from build to build, not
    # byte-identical), and the next process loads it.
    assert saved.read_bytes().startswith(key + b" ") and saved.read_bytes() != damaged
    no_build(monkeypatch)
    reloaded = open_cached("qrun.lang", "grammar.lark", OPTIONS, tmp_path)
    assert describe(reloaded, "{{ x") == describe(built, "{{ x")


def _with_digest(key: bytes, body: bytes) -> bytes:
    import hashlib

    return key + b" " + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def test_the_file_is_keyed_by_options_and_lark_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    open_cached("qrun.lang", "grammar.lark", OPTIONS, tmp_path)
    open_cached("qrun.lang", "grammar.lark", {**OPTIONS, "propagate_positions": False}, tmp_path)
    assert len(saved_files(tmp_path)) == 2
    monkeypatch.setattr(lark, "__version__", "0.0.0")
    open_cached("qrun.lang", "grammar.lark", OPTIONS, tmp_path)
    assert len(saved_files(tmp_path)) == 3
    assert all(f.name.startswith("grammar-") and f.suffix == ".json"
               for f in saved_files(tmp_path))


def test_writing_leaves_no_temporary_file_and_keeps_the_newest(tmp_path: Path) -> None:
    for i in range(KEEP + 3):
        stale = tmp_path / f"grammar-{i:032x}.json"
        stale.write_text("{}")
        os.utime(stale, (1_000_000 + i, 1_000_000 + i))
    open_cached("qrun.lang", "grammar.lark", OPTIONS, tmp_path)
    left = saved_files(tmp_path)
    assert len(left) == KEEP
    assert not any(f.name.startswith(".") for f in left)
    newest = max(left, key=lambda f: f.stat().st_mtime)
    assert newest.read_bytes().startswith(newest.stem.split("-")[1].encode())
    assert (tmp_path / f"grammar-{KEEP + 2:032x}.json").exists()
    assert not (tmp_path / f"grammar-{0:032x}.json").exists()


def test_a_folder_that_is_a_file_only_costs_the_build(tmp_path: Path, built: Lark) -> None:
    blocker = tmp_path / "parsers"
    blocker.write_text("not a folder")
    parser = open_cached("qrun.lang", "grammar.lark", OPTIONS, blocker)
    assert describe(parser, "Hi {{ x }}") == describe(built, "Hi {{ x }}")
    assert blocker.read_text() == "not a folder"


def test_the_folder_is_the_users_qrun_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QRUN_CACHE", str(tmp_path / "cache"))
    assert cache_folder() == tmp_path / "cache" / "parsers"
    monkeypatch.delenv("QRUN_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_folder() == tmp_path / "home" / ".cache" / "qrun" / "parsers"
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("QRUN_CACHE", str(afile))
    assert cache_folder() is None


def test_the_cache_folder_is_shared_with_model_loading() -> None:
    from qrun.backends import loading
    from qrun.cache_dir import cache_dir

    assert loading.cache_dir is cache_dir


def test_the_language_does_not_import_the_backends() -> None:
    """lang finds the cache folder through qrun/cache_dir.py, which imports only qrun.errors."""
    bad = []
    for path in [*sorted((ROOT / "qrun/lang").rglob("*.py")), ROOT / "qrun/cache_dir.py"]:
        for node in pyast.walk(pyast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, pyast.Import)
                     else [node.module or ""] if isinstance(node, pyast.ImportFrom) else [])
            bad += [f"{path.name}:{node.lineno} {n}" for n in names
                    if n.startswith(("qrun.backends", "qrun.runtime"))]
    assert bad == []


# Run in fresh processes, through qrun's own parse(): the first builds and saves the tables, the
# second may not build (Lark.open_from_package raises), so it must load them.
TEMPLATE_SCRIPT = """
import sys
import lark
from qrun.errors import TemplateSyntaxError
from qrun.lang import parse
from qrun.source import Source
if sys.argv[1] == "load":
    def refuse(*args, **kwargs):
        raise AssertionError("built instead of loaded")
    lark.Lark.open_from_package = refuse
for i, text in enumerate(sys.stdin.read().split("\\0")):
    try:
        print(parse(Source(f"t{i}.tmpl", text)).pretty())
    except TemplateSyntaxError as err:
        print(f"{type(err).__name__} {err.span}\\n{err}")
"""


def test_qrun_parses_the_same_from_saved_tables(tmp_path: Path) -> None:
    env = {**os.environ, "QRUN_CACHE": str(tmp_path)}
    texts = "\0".join(corpus())
    outputs = [subprocess.run([sys.executable, "-c", TEMPLATE_SCRIPT, mode], input=texts,
                              capture_output=True, text=True, check=True, cwd=ROOT, env=env,
                              timeout=120).stdout
               for mode in ("build", "load")]
    assert outputs[0] == outputs[1]
    # Most of BROKEN fail here; unpaired blocks such as `{% endif %}` fail later, in build_ast.
    assert outputs[0].count("TemplateSyntaxError") >= 12
    assert len(list((tmp_path / "parsers").glob("grammar-*.json"))) == 1
