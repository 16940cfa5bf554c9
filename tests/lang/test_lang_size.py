"""lang/size.py (docs/language.md §2.1, §13): template files are read only when they are regular
files and only up to MAX_TEMPLATE_SIZE; a template over the size, tag or item limits is refused
before it is parsed, at the first character, tag or item past the limit, and quickly (the
templates here are built just over a limit, where parsing would take seconds to minutes)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from lark import Token

from qrun.errors import TemplateError, TemplateErrors, UsageError
from qrun.lang import compile_file, compile_source, parse, size
from qrun.lang.size import MAX_TAG_ITEMS, MAX_TAGS, MAX_TEMPLATE_SIZE, Size, measure
from qrun.source import Source

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs/language.md"


def error_of(text: str) -> TemplateError:
    """The one error compile_source reports for `text`, which must come within a second."""
    start = time.perf_counter()
    with pytest.raises(TemplateErrors) as info:
        compile_source(text, "t.tmpl")
    assert time.perf_counter() - start < 1
    (err,) = info.value.errors
    return err


def sparse_file(path: Path, length: int) -> Path:
    """A file of `length` zero bytes that takes no room on disk."""
    with path.open("wb") as handle:
        handle.truncate(length)
    return path


# ---- what a template file may be ---------------------------------------------------------------


def test_an_include_of_a_named_pipe_is_refused_at_the_tag_without_blocking(
        tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.tmpl")  # nobody writes to it: opening it to read would block
    (tmp_path / "main.tmpl").write_text('Hi\n  {% include "pipe.tmpl" %}', encoding="utf-8")
    with pytest.raises(TemplateErrors) as info:
        compile_file(tmp_path / "main.tmpl")
    (err,) = info.value.errors
    assert err.message == (f"cannot include {tmp_path / 'pipe.tmpl'}: it is a named pipe "
                           "(FIFO), not a file")
    assert (err.span.line, err.span.column) == (2, 3)
    assert err.source.name == str(tmp_path / "main.tmpl")


@pytest.mark.parametrize("name", ["zero", "null"])
def test_an_include_of_a_device_says_what_it_is(name: str) -> None:
    with pytest.raises(TemplateErrors) as info:
        compile_source(f'x {{% include "{name}" %}}', include_dir="/dev")
    assert info.value.first.message == (f"cannot include /dev/{name}: it is a character device, "
                                        "not a file")
    assert info.value.first.span.column == 3


def test_a_too_large_include_is_refused_at_its_first_byte_past_the_limit(
        tmp_path: Path) -> None:
    sparse_file(tmp_path / "big.tmpl", MAX_TEMPLATE_SIZE + 1)
    (tmp_path / "main.tmpl").write_text('{% include "big.tmpl" %}', encoding="utf-8")
    start = time.perf_counter()
    with pytest.raises(TemplateErrors) as info:
        compile_file(tmp_path / "main.tmpl")
    assert time.perf_counter() - start < 2
    (err,) = info.value.errors
    assert err.message == (f"the template is too large: {MAX_TEMPLATE_SIZE + 1:,} bytes (at "
                           f"most {MAX_TEMPLATE_SIZE:,})")
    assert err.source.name == str(tmp_path / "big.tmpl")
    assert (err.span.line, err.span.column) == (1, MAX_TEMPLATE_SIZE + 1)
    assert err.notes[-1] == f"included from {tmp_path / 'main.tmpl'}:1:1"


def test_a_template_file_over_the_limit_is_read_only_up_to_it(tmp_path: Path) -> None:
    path = (tmp_path / "huge.tmpl")
    path.write_text("{{ x }}\n" * 1000, encoding="utf-8")
    with path.open("ab") as handle:
        handle.truncate(50 << 20)  # 50 MB, the rest of it zero bytes
    start = time.perf_counter()
    with pytest.raises(TemplateErrors) as info:
        compile_file(path)
    assert time.perf_counter() - start < 2
    err = info.value.first
    assert err.message == (f"the template is too large: {50 << 20:,} bytes (at most "
                           f"{MAX_TEMPLATE_SIZE:,})")
    assert (err.span.line, err.span.column) == (1001, MAX_TEMPLATE_SIZE - 8000 + 1)


def test_a_template_file_at_the_limit_is_read(tmp_path: Path) -> None:
    path = tmp_path / "t.tmpl"
    path.write_text("{{ x }}\n" + "a" * (MAX_TEMPLATE_SIZE - 8), encoding="utf-8")
    assert compile_file(path).inputs == ("x",)


@pytest.mark.parametrize(("make", "kind"), [
    (lambda p: os.mkfifo(p), "a named pipe (FIFO)"),
    (lambda p: p.mkdir(), "a directory"),
])
def test_the_top_template_must_be_a_regular_file(tmp_path: Path, make: object, kind: str
                                                 ) -> None:
    path = tmp_path / "t.tmpl"
    make(path)  # type: ignore[operator]
    with pytest.raises(UsageError) as info:
        compile_file(path)
    assert str(info.value) == f"cannot read template {path}: it is {kind}, not a file"


# ---- template size, tags and what they hold ----------------------------------------------------


def test_a_string_template_over_the_size_limit_is_refused_at_the_first_character_past_it(
        ) -> None:
    text = "{{ x }}\n" * 1_500_000  # the 10 MB template that hung (no answer in 90 s)
    err = error_of(text)
    assert err.message == (f"the template is too large: {len(text):,} characters (at most "
                           f"{MAX_TEMPLATE_SIZE:,})")
    assert (err.span.line, err.span.column) == (MAX_TEMPLATE_SIZE // 8 + 1, 1)
    assert error_of("a" * (MAX_TEMPLATE_SIZE + 1)).span.column == MAX_TEMPLATE_SIZE + 1
    compile_source("a" * MAX_TEMPLATE_SIZE)


def test_too_many_tags_are_refused_at_the_first_tag_past_the_limit() -> None:
    err = error_of("Hi\n" + "{{ x }}\n" * (MAX_TAGS + 5))
    assert err.message == f"too many tags: {MAX_TAGS + 5:,} (at most {MAX_TAGS:,})"
    assert (err.span.line, err.span.column, err.span.end_column) == (MAX_TAGS + 2, 1, 3)
    assert f"the template has {3 + 8 * (MAX_TAGS + 5):,} characters" in err.notes[0]
    # Comments are tags too; a raw block is one, whatever it holds.
    assert "too many tags" in error_of("{# c #}" * (MAX_TAGS + 1)).message
    assert measure(Source("t", "{# c #}" * MAX_TAGS)) == Size(MAX_TAGS, 0)
    raw = "{% raw %}" + "{{ x }}" * (2 * MAX_TAGS) + "{% endraw %}"
    assert measure(Source("t", raw)) == Size(1, 0)


def test_a_template_just_under_the_tag_limit_counts_to_it() -> None:
    assert measure(Source("t", "{{ x }}" * MAX_TAGS)) == Size(MAX_TAGS, 2 * MAX_TAGS)


def test_too_much_inside_tags_is_refused_at_the_first_item_past_the_limit() -> None:
    text = "{{ [" + "1, " * MAX_TAG_ITEMS + "1] }}"
    err = error_of(text)
    assert err.message == (f"the tags hold too much: more than {MAX_TAG_ITEMS:,} names, values "
                           "and symbols")
    # `[` is the first item, then `1` and `,` alternate: item MAX_TAG_ITEMS + 1 is a `,`.
    assert err.span.start == len("{{ [") + 3 * (MAX_TAG_ITEMS // 2 - 1) + 1
    assert text[err.span.start:err.span.end] == ","
    assert any("given as an input" in note for note in err.notes)


@pytest.mark.parametrize(("text", "expected"), [
    ("{{ x }}", Size(1, 2)),
    ('{{ {"a": {"b": 1}}} }}', Size(1, 10)),  # `}` closes a dict before it closes the tag
    ('{{ "}}" ~ "%}" }}{% if a %}{% endif %}', Size(3, 9)),  # strings are skipped whole
    ("{% set x = {'a': 1} %}", Size(1, 9)),
    ('{{ select s options=["a", "b", "c"] }}', Size(1, 6)),  # a list of strings is one item
    ("---\nseed: {{ 1 }}\n---\n{{ x -}}", Size(1, 3)),  # front matter holds no tags
    ("{{ x } }", Size(1, 2)),
    ("{{ x ", Size(1, 1)),  # unclosed: the parser reports it
    ("{# x ", Size(1, 0)),
    ("{% raw %}{{ x }}", Size(1, 0)),  # an unclosed raw block ends the scan, as the parse
])
def test_what_counts(text: str, expected: Size) -> None:
    assert measure(Source("t", text)) == expected


def parsed(text: str) -> Size:
    """The tags the parser finds, and the tokens it keeps inside them (but the second `}` of
    each `}}`, which the scan does not count)."""
    tokens = [t.type for t in parse(Source("t", text)).scan_values(lambda t: isinstance(t, Token))]
    tags = sum(tokens.count(kind) for kind in ("VAR_OPEN", "BLOCK_OPEN", "COMMENT", "RAW"))
    outside = tags + tokens.count("TEXT") + tokens.count("FRONT_MATTER")
    return Size(tags, len(tokens) - outside - tokens.count("VAR_OPEN"))


@pytest.mark.parametrize("path", sorted([*(ROOT / "examples").glob("*.tmpl"),
                                         *(ROOT / "tests/lang/golden").glob("*/template.tmpl")]),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_scan_counts_the_tags_the_parser_finds(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    counted = measure(Source("t", text))
    try:
        found = parsed(text)
    except TemplateError:
        return  # the golden error cases: the parser stops early
    assert counted.tags == found.tags
    assert counted.items >= found.items  # an operator of two characters counts as two


def test_the_limits_hold_for_a_compile_with_its_includes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(size, "MAX_TAGS", 30)
    (tmp_path / "part.tmpl").write_text("{{ x }}" * 10, encoding="utf-8")
    (tmp_path / "main.tmpl").write_text('{% include "part.tmpl" %}\n' * 4, encoding="utf-8")
    with pytest.raises(TemplateErrors) as info:
        compile_file(tmp_path / "main.tmpl")
    # 4 tags of its own, then 10 per include: the third brings the compile to 34.
    first = info.value.first
    assert first.message == 'cannot include "part.tmpl": the compile would hold more than 30 tags'
    assert first.span.line == 3
    assert first.notes == ("an included template counts each time it is included",)
    (tmp_path / "main.tmpl").write_text('{% include "part.tmpl" %}\n' * 2, encoding="utf-8")
    compile_file(tmp_path / "main.tmpl")


def test_the_docs_show_the_limits_and_their_error() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    for limit in (MAX_TEMPLATE_SIZE, MAX_TAGS, MAX_TAG_ITEMS):
        assert f"{limit:,}" in docs
    err = error_of("Hi\n" + "{{ x }}\n" * (MAX_TAGS + 5))
    assert err.render().replace("t.tmpl", "big.tmpl") in docs
