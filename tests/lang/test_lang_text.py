"""lang/text.py: template encodings and newlines. A byte order mark or CR-only newlines never
turn front matter into prompt text, positions stay those of the editor, UTF-16/UTF-32 files
are refused naming the encoding, and text UTF-8 cannot encode fails at compile time."""

from __future__ import annotations

from pathlib import Path

import pytest

from qrun.errors import TemplateErrors, TemplateSyntaxError, UsageError
from qrun.lang import compile_file, compile_source, ir
from qrun.lang.text import decode_template, normalize_text

FRONT = "---\nmax_tokens: 7\ntemperature: 0.5\n---\nQ: {{ q }}\n{{ gen a }}\n"


def texts(program: ir.Program) -> str:
    return "".join(op.text for op in program.ops if isinstance(op, ir.EmitText))


@pytest.mark.parametrize(("label", "data"), [
    ("lf", FRONT.encode()),
    ("crlf", FRONT.replace("\n", "\r\n").encode()),
    ("cr", FRONT.replace("\n", "\r").encode()),
    ("bom-lf", b"\xef\xbb\xbf" + FRONT.encode()),
    ("bom-crlf", b"\xef\xbb\xbf" + FRONT.replace("\n", "\r\n").encode()),
    ("bom-cr", b"\xef\xbb\xbf" + FRONT.replace("\n", "\r").encode()),
])
def test_front_matter_is_read_whatever_the_newlines_or_bom(tmp_path: Path, label: str,
                                                           data: bytes) -> None:
    path = tmp_path / f"{label}.tmpl"
    path.write_bytes(data)
    program = compile_file(path)
    assert program.options.max_tokens == 7 and program.options.temperature == 0.5
    assert texts(program) == "Q: \n\n"  # no front matter, no BOM, no "\r" in the prompt
    assert program.inputs == ("q",)


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_error_positions_are_the_editors_lines(tmp_path: Path, newline: str) -> None:
    path = tmp_path / "t.tmpl"
    body = "---\nseed: 1\n---\nline four\n  {{ gen a max_tokens=0 }}\n"
    path.write_bytes(b"\xef\xbb\xbf" + body.replace("\n", newline).encode())
    with pytest.raises(TemplateErrors) as info:
        compile_file(path)
    err = info.value.first
    assert (err.span.line, err.span.column) == (5, 23)
    assert "\n    {{ gen a max_tokens=0 }}\n" in err.render() and "\r" not in err.render()


def test_the_api_string_gets_the_same_treatment() -> None:
    for text in ("\ufeff" + FRONT, FRONT.replace("\n", "\r"), FRONT.replace("\n", "\r\n")):
        program = compile_source(text)
        assert program.options.max_tokens == 7
        assert texts(program) == "Q: \n\n"


def test_newlines_normalize_as_jinja_does() -> None:
    # jinja2.lexer: newline_re = re.compile(r"(\r\n|\r|\n)"), written as newline_sequence "\n".
    assert normalize_text("a\r\nb\rc\nd\r\r\ne") == "a\nb\nc\nd\n\ne"
    assert normalize_text("\ufeffx\ufeff") == "x\ufeff"  # only a leading BOM goes
    # Other line separators are ordinary characters, as in Jinja.
    assert normalize_text("a\x0bb\x0cc\x85d\u2028e") == "a\x0bb\x0cc\x85d\u2028e"
    program = compile_source('{{ "a\\r\\nb" }}\r{% raw %}x\r\ny{% endraw %}')
    assert program.ops[0].expr.value == "a\r\nb"  # type: ignore[union-attr]
    assert texts(program) == "\nx\ny"  # escapes are kept; raw text is normalized too


@pytest.mark.parametrize(("encoding", "name"), [
    ("utf-16", "UTF-16"), ("utf-16-le", "UTF-16 (little-endian)"),
    ("utf-16-be", "UTF-16 (big-endian)"), ("utf-32", "UTF-32"),
])
def test_utf16_and_utf32_files_are_refused_naming_the_encoding(tmp_path: Path, encoding: str,
                                                               name: str) -> None:
    path = tmp_path / "wide.tmpl"
    path.write_bytes(FRONT.encode(encoding))
    with pytest.raises(UsageError) as info:
        compile_file(path)
    message = str(info.value)
    assert f"cannot read template {path}: " in message and name in message
    assert "save the file as UTF-8" in message
    assert info.value.exit_code == 2


def test_utf16_without_bom_is_named_even_for_a_short_file() -> None:
    with pytest.raises(UsageError, match=r"UTF-16 \(little-endian\) text without a byte order"):
        decode_template("hi".encode("utf-16-le"), "t.tmpl")


def test_invalid_utf8_names_the_byte_and_line() -> None:
    with pytest.raises(UsageError, match="byte 0xe9 on line 2 is not valid UTF-8"):
        decode_template(b"ok\ncaf\xe9 {{ x }}", "t.tmpl")
    with pytest.raises(UsageError, match="byte 0xed on line 1"):  # an encoded surrogate
        decode_template(b"\xed\xa0\x80", "t.tmpl")


def test_utf8_text_with_a_few_nul_bytes_is_still_utf8() -> None:
    assert decode_template(b"a\x00b {{ x }} \x00", "t.tmpl") == "a\x00b {{ x }} \x00"
    assert decode_template("añ€😀".encode(), "t.tmpl") == "añ€😀"


@pytest.mark.parametrize(("template", "line", "column"), [
    ('{{ "\\ud800" }}', 1, 4),
    ('{{ gen a stop="\\ud800" }}', 1, 15),
    ('{{ gen a stop=["ok", "x\\udfff"] }}', 1, 22),
    ('{{ select s options=["\\udc00"] }}', 1, 22),
    ('{% set v = {"k": "\\ud800"} %}', 1, 18),
    ('{{ gen a regex="[\\ud800-\\udfff]" }}', 1, 16),
    ('{% if x == "\\udc00" %}{% endif %}', 1, 12),
    ("a\n\udc80", 2, 1),
])
def test_unencodable_strings_fail_at_compile_time(template: str, line: int,
                                                  column: int) -> None:
    with pytest.raises(TemplateErrors) as info:
        compile_source(template)
    err = info.value.first
    assert isinstance(err, TemplateSyntaxError) and "lone surrogate" in err.message
    assert (err.span.line, err.span.column) == (line, column)
    str(info.value).encode("utf-8")  # the report itself can be printed


def test_a_surrogate_pair_written_as_two_escapes_is_one_character() -> None:
    (op,) = compile_source('{{ "\\ud83d\\ude00" }}').ops
    assert op.expr.value == "😀"  # type: ignore[union-attr]
    (op,) = compile_source('{{ "\\U0001F600\\u00e9" }}').ops
    assert op.expr.value == "😀é"  # type: ignore[union-attr]
