"""`{% include %}` (docs/language.md §2.1, lang/include.py): names relative to the including
file inside a root folder, string templates only with a folder, errors positioned in the file
they are in (with a note naming the tag), cycles reported with their chain, and bounded
expansion."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qrun.api import Query
from qrun.errors import InputError, TemplateError, TemplateErrors
from qrun.lang import compile_file, compile_source, ir
from qrun.lang.include import MAX_INCLUDE_DEPTH, MAX_INCLUDES
from qrun.lang.ir_dump import dump_program

DOCS = Path(__file__).resolve().parents[2] / "docs/language.md"


def write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def errors_of(path: Path, include_dir: Path | None = None) -> tuple[TemplateError, ...]:
    with pytest.raises(TemplateErrors) as info:
        compile_file(path, include_dir)
    return info.value.errors


def texts(ops: tuple[ir.Op, ...]) -> str:
    return "".join(op.text for op in ir.walk(ops) if isinstance(op, ir.EmitText))


def test_names_are_relative_to_the_including_file(tmp_path: Path) -> None:
    write(tmp_path, {
        "main.tmpl": 'A{% include "parts/b.tmpl" %}D',
        "parts/b.tmpl": 'B{% include "c.tmpl" %}{% include "../e.tmpl" %}',
        "parts/c.tmpl": "C",
        "e.tmpl": "E",
    })
    program = compile_file(tmp_path / "main.tmpl")
    assert texts(program.ops) == "ABCED"
    (_, include, _) = program.ops
    assert isinstance(include, ir.Include) and include.name == "parts/b.tmpl"
    assert include.source.name == os.path.join(str(tmp_path), "parts", "b.tmpl")
    names = [op.source.name for op in ir.walk(program.ops) if isinstance(op, ir.Include)]
    assert [os.path.basename(n) for n in names] == ["b.tmpl", "c.tmpl", "e.tmpl"]


def test_included_text_keeps_its_final_newline_and_tags_trim_as_usual(tmp_path: Path) -> None:
    write(tmp_path, {"main.tmpl": 'one\n{% include "x.tmpl" %}\nthree\n',
                     "x.tmpl": "two\n"})
    assert texts(compile_file(tmp_path / "main.tmpl").ops) == "one\ntwo\nthree\n"


def test_captures_and_sets_of_an_include_are_the_includers(tmp_path: Path) -> None:
    write(tmp_path, {
        "main.tmpl": '{% include "ask.tmpl" %}{{ answer }} {{ mood }}'
                     '{% for q in qs %}{% include "each.tmpl" %}{% endfor %}{{ notes }}',
        "ask.tmpl": "{{ gen answer }}{% set mood = 'ok' %}",
        "each.tmpl": "{{ q }}: {{ gen notes }}",
    })
    program = compile_file(tmp_path / "main.tmpl")
    assert program.captures == ("answer", "notes") and program.inputs == ("qs",)
    gens = [op for op in ir.walk(program.ops) if isinstance(op, ir.Gen)]
    assert [(g.name, g.in_loop) for g in gens] == [("answer", False), ("notes", True)]


def test_a_string_template_includes_only_with_a_folder(tmp_path: Path) -> None:
    write(tmp_path, {"x.tmpl": "X{{ y | default('') }}"})
    with pytest.raises(TemplateErrors) as info:
        compile_source('{% include "x.tmpl" %}', "t.tmpl")
    err = info.value.first
    assert "needs a folder to include from" in err.message and err.span.column == 1
    assert "include_dir" in err.notes[0]
    assert texts(compile_source('{% include "x.tmpl" %}', include_dir=tmp_path).ops) == "X"
    query = Query('{% include "x.tmpl" %}', include_dir=str(tmp_path))
    assert query.optional_inputs == ("y",) and query.inputs == ()


@pytest.mark.parametrize(("tag", "message"), [
    ('{% include "missing.tmpl" %}', "missing.tmpl: not found"),
    ('{% include "../secret.tmpl" %}', "is outside the folder templates include from"),
    ('{% include "/etc/passwd" %}', "the name must be a relative path"),
    ('{% include "" %}', "the name must be a relative path"),
    ("{% include name %}", "the included template must be a string literal"),
    ('{% include "a" ~ "b" %}', "the included template must be a string literal"),
    ('{% include "sub" %}', "sub: it is a directory, not a file"),
    ('{% include "latin1.tmpl" %}', "is not valid UTF-8"),
])
def test_refused_includes_are_errors_at_the_tag(tmp_path: Path, tag: str, message: str) -> None:
    root = tmp_path / "root"
    write(tmp_path, {"secret.tmpl": "s", "root/main.tmpl": "ok\n  " + tag})
    (root / "sub").mkdir()
    (root / "latin1.tmpl").write_bytes(b"caf\xe9")
    (err,) = errors_of(root / "main.tmpl")
    assert message in err.message, err.render()
    assert (err.span.line, err.span.column) == (2, 3)
    assert err.source.name == str(root / "main.tmpl")


def test_a_link_out_of_the_root_is_refused(tmp_path: Path) -> None:
    write(tmp_path, {"outside.tmpl": "o", "root/main.tmpl": '{% include "link.tmpl" %}'})
    (tmp_path / "root" / "link.tmpl").symlink_to(tmp_path / "outside.tmpl")
    (err,) = errors_of(tmp_path / "root" / "main.tmpl")
    assert "outside the folder" in err.message
    # A wider root allows it.
    program = compile_file(tmp_path / "root" / "main.tmpl", include_dir=tmp_path)
    assert texts(program.ops) == "o"


def test_errors_in_an_included_file_are_positioned_there(tmp_path: Path) -> None:
    write(tmp_path, {
        "main.tmpl": 'x\n{% include "a.tmpl" %}',
        "a.tmpl": 'a\n  {% include "b.tmpl" %}\n{{ s.upper() }}',
        "b.tmpl": "\n\n{{ nope(1) }}",
        "bad.tmpl": 'x\n{% include "syntax.tmpl" %}',
        "syntax.tmpl": "ok\n{{ x ? }}",
        "fm.tmpl": '{% include "front.tmpl" %}',
        "front.tmpl": "---\nseed: 1\n---\nhi",
    })
    inner, outer = sorted(errors_of(tmp_path / "main.tmpl"), key=lambda e: e.source.name,
                          reverse=True)
    assert inner.source.name.endswith("b.tmpl") and (inner.span.line, inner.span.column) == (
        3, 4)
    assert "unknown function 'nope'" in inner.message
    main, a = str(tmp_path / "main.tmpl"), str(tmp_path / "a.tmpl")
    assert inner.notes[-2:] == (f"included from {a}:2:3", f"included from {main}:2:1")
    assert outer.source.name == a and (outer.span.line, outer.span.column) == (3, 4)
    assert outer.notes[-1] == f"included from {main}:2:1"
    (syntax,) = errors_of(tmp_path / "bad.tmpl")
    assert syntax.source.name.endswith("syntax.tmpl") and syntax.span.line == 2
    assert "unexpected '?'" in syntax.message and syntax.notes[-1].startswith("included from")
    (front,) = errors_of(tmp_path / "fm.tmpl")
    assert "cannot have front matter" in front.message and front.span.line == 1
    assert front.source.name.endswith("front.tmpl")


def test_a_cycle_is_reported_at_the_tag_that_closes_it(tmp_path: Path) -> None:
    write(tmp_path, {
        "a.tmpl": 'A\n{% include "b.tmpl" %}',
        "b.tmpl": '{% include "a.tmpl" %}',
        "self.tmpl": 'x {% include "self.tmpl" %}',
    })
    cwd = os.getcwd()
    os.chdir(tmp_path)  # names as the docs show them
    try:
        (err,) = errors_of(Path("a.tmpl"))
        (again,) = errors_of(Path("self.tmpl"))
    finally:
        os.chdir(cwd)
    assert err.source.name == "b.tmpl" and (err.span.line, err.span.column) == (1, 1)
    assert err.message == "include cycle: a.tmpl -> b.tmpl -> a.tmpl"
    assert err.notes == ("a.tmpl:2:1 includes b.tmpl", "included from a.tmpl:2:1")
    docs = DOCS.read_text(encoding="utf-8")
    assert err.render() in docs  # the example in docs/language.md §13 is this error
    assert again.message == "include cycle: self.tmpl -> self.tmpl"
    assert again.span.column == 3


def test_depth_and_count_are_bounded(tmp_path: Path) -> None:
    depth = MAX_INCLUDE_DEPTH + 5
    write(tmp_path, {f"d{i}.tmpl": f'{{% include "d{i + 1}.tmpl" %}}' for i in range(depth)})
    write(tmp_path, {f"d{depth}.tmpl": "end"})
    (err,) = errors_of(tmp_path / "d0.tmpl")
    assert f"nest too deeply (more than {MAX_INCLUDE_DEPTH})" in err.message
    # Each file includes the next twice: 2 ** 11 expansions.
    write(tmp_path, {f"w{i}.tmpl": f'{{% include "w{i + 1}.tmpl" %}}' * 2 for i in range(11)})
    write(tmp_path, {"w11.tmpl": "leaf"})
    errors = errors_of(tmp_path / "w0.tmpl")
    assert f"too many includes (more than {MAX_INCLUDES} in all)" in errors[0].message
    assert len(errors) <= 50


def test_an_input_first_used_in_an_include_is_reported_at_the_tag(tmp_path: Path) -> None:
    write(tmp_path, {"main.tmpl": 'Hi\n{% include "p.tmpl" %}', "p.tmpl": "\n{{ who }}"})
    program = compile_file(tmp_path / "main.tmpl")
    with pytest.raises(InputError) as info:
        program.check_inputs({})
    err = info.value
    assert (err.span.line, err.span.column) == (2, 1)
    assert err.render().splitlines()[1] == '  {% include "p.tmpl" %}'


def test_an_included_file_cannot_end_the_includers_loop(tmp_path: Path) -> None:
    write(tmp_path, {"main.tmpl": '{% for x in xs %}{% include "b.tmpl" %}{% endfor %}',
                     "b.tmpl": "{% if x %}{% break %}{% endif %}"})
    (err,) = errors_of(tmp_path / "main.tmpl")
    assert err.message == "'{% break %}' outside a loop" and err.span.column == 11
    assert err.notes[0] == "an included template cannot end the loop it is included in"


def test_the_dump_shows_the_included_ops_at_their_own_positions(tmp_path: Path) -> None:
    write(tmp_path, {"main.tmpl": 'x\n{% include "p.tmpl" %}', "p.tmpl": "a\n{{ b }}"})
    dump = dump_program(compile_file(tmp_path / "main.tmpl"))
    assert dump.splitlines()[2:] == ['text "x\\n"  @1:1', 'include "p.tmpl"  @2:1',
                                     '  text "a\\n"  @1:1', "  value b  @2:1"]
