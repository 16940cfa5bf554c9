"""Parser and AST builder: source -> ast.Template, shown as a compact dump (one node per line,
expressions in expr.format_expr form). Covers every construct, whitespace control, raw blocks,
front matter positions and the tricky lexing cases (nested dict braces, lone braces, keywords
used as names)."""

from __future__ import annotations

import pytest

from qrun.lang import ast, build_ast, parse
from qrun.lang import expr as ex
from qrun.lang.expr import format_expr
from qrun.source import Source


def build(text: str) -> ast.Template:
    source = Source("t.tmpl", text)
    return build_ast(parse(source), source)


def show(nodes: tuple[ast.Node, ...], depth: int = 0) -> list[str]:
    pad = "  " * depth
    lines: list[str] = []
    for node in nodes:
        match node:
            case ast.Text(text=text, raw=raw):
                lines.append(f"{pad}{'raw' if raw else 'text'} {text!r}")
            case ast.Interp(expr=value):
                lines.append(f"{pad}interp {format_expr(value)}")
            case ast.Gen() | ast.Select():
                kind = "gen" if isinstance(node, ast.Gen) else "select"
                args = " ".join(f"{a.name}={format_expr(a.expr)}" for a in node.args)
                lines.append(f"{pad}{kind} {node.name} {args}".rstrip())
            case ast.If(arms=arms, orelse=orelse):
                for arm in arms:
                    lines.append(f"{pad}if {format_expr(arm.test)}")
                    lines.extend(show(arm.body, depth + 1))
                if orelse is not None:
                    lines.append(f"{pad}else")
                    lines.extend(show(orelse, depth + 1))
            case ast.For(targets=targets, iterable=iterable, body=body):
                lines.append(f"{pad}for {', '.join(targets)} in {format_expr(iterable)}")
                lines.extend(show(body, depth + 1))
            case ast.Break() | ast.Continue():
                lines.append(f"{pad}{type(node).__name__.lower()}")
            case ast.Include(template=template):
                lines.append(f"{pad}include {format_expr(template)}")
            case ast.Set(name=name, expr=value):
                lines.append(f"{pad}set {name} = {format_expr(value)}")
            case ast.Role(role=role, body=body):
                lines.append(f"{pad}role {role}")
                lines.extend(show(body, depth + 1))
    return lines


def dump(text: str) -> str:
    return "\n".join(show(build(text).body))


CASES = [
    ("plain text only", "text 'plain text only'"),
    ("a { b } {a} {", "text 'a { b } {a} {'"),
    ("{{ x }}", "interp x"),
    ("Q: {{ q }}!", "text 'Q: '\ninterp q\ntext '!'"),
    ('{{ gen a stop="\\n" max_tokens=3 }}', 'gen a stop="\\n" max_tokens=3'),
    ("{{gen a}}", "gen a"),
    ('{{ select c options=["x", "y"] }}', 'select c options=["x", "y"]'),
    ('{{ gen x json={"type": "object", "properties": {"a": {"type": "string"}}} }}',
     'gen x json={"type": "object", "properties": {"a": {"type": "string"}}}'),
    ('{{ {"a": {"b": 1}} }}', 'interp {"a": {"b": 1}}'),
    ('{{{"a": 1}}}', 'interp {"a": 1}'),
    ("{{ gen_count }} {{ x.gen }} {{ notes }} {{ in_stock }} {{ selection }}",
     "interp gen_count\ntext ' '\ninterp x.gen\ntext ' '\ninterp notes\ntext ' '\n"
     "interp in_stock\ntext ' '\ninterp selection"),
    ("{% if a %}x{% elif b %}y{% else %}z{% endif %}", "if a\n  text 'x'\nif b\n  text 'y'\n"
     "else\n  text 'z'"),
    ("{% for x in xs %}{{ x }}{% endfor %}", "for x in xs\n  interp x"),
    ("{% for k, v in d.items() %}{% break %}{% continue %}{% endfor %}",
     "for k, v in d.items()\n  break\n  continue"),
    ('{% include "parts/a.tmpl" %}', 'include "parts/a.tmpl"'),
    ("{{ a ~ b ~ 1 + c * d }}", "interp (((a ~ b) ~ 1) + (c * d))"),
    ("{{ a + b is number }}", "interp (a + (b is number))"),
    ("{{ not x is defined and y is not none }}",
     "interp ((not (x is defined)) and (y is not none))"),
    ("{{ x is true or x is false }}", "interp ((x is true) or (x is false))"),
    ("{{ xs | length is integer }}", "interp ((xs | length) is integer)"),
    ("{{ x is divisibleby(3) }}", "interp (x is divisibleby(3))"),
    ("{{ d.keys() }}{{ d.items()[0] }}", "interp d.keys()\ninterp d.items()[0]"),
    ("{{ break }}{{ include }}{{ continue }}", "interp break\ninterp include\n"
     "interp continue"),
    ("{% set y = x + 1 %}", "set y = (x + 1)"),
    ("{% user %}hi{% enduser %}", "role user\n  text 'hi'"),
    ("{% system %}s{% endsystem %}{% assistant %}a{% endassistant %}",
     "role system\n  text 's'\nrole assistant\n  text 'a'"),
    ("a{# comment {{ x }} #}b", "text 'a'\ntext 'b'"),
    ("{% raw %}{{ gen x }}{% if %}{% endraw %}", "raw '{{ gen x }}{% if %}'"),
    ("{%raw%}x{%endraw%}", "raw 'x'"),
    ("a  {{- x -}}  b", "text 'a'\ninterp x\ntext 'b'"),
    ("a \n {%- if c -%} \n b \n {%- endif -%} \n c",
     "text 'a'\nif c\n  text 'b'\ntext 'c'"),
    ("a \n {#- c -#} \n b", "text 'a'\ntext 'b'"),
    ("x {%- raw -%}  {{ y }}  {%- endraw -%}  z", "text 'x'\nraw '{{ y }}'\ntext 'z'"),
    ("{{ -x }}", "interp (-x)"),
    ("{{- x }}", "interp x"),
    ("{{ a - b -}}", "interp (a - b)"),
    ("{{ a + b * c - d }}", "interp ((a + (b * c)) - d)"),
    ("{{ -a ** 2 }}", "interp (-(a ** 2))"),
    ("{{ a ** -b }}", "interp (a ** (-b))"),
    ("{{ a // b % c / d }}", "interp (((a // b) % c) / d)"),
    ("{{ 1 < x <= 3 }}", "interp (1 < x <= 3)"),
    ("{{ a == b != c }}", "interp (a == b != c)"),
    ("{{ a in b }}{{ a not in b }}{{ a is b }}{{ a is not b }}",
     "interp (a in b)\ninterp (a not in b)\ninterp (a is b)\ninterp (a is not b)"),
    ("{{ not a and b or c }}", "interp (((not a) and b) or c)"),
    ("{{ a or b or c }}", "interp (a or b or c)"),
    ("{{ a if b else c if d else e }}", "interp (a if b else (c if d else e))"),
    ("{{ x | upper }}", "interp (x | upper)"),
    ('{{ x | join(", ") | upper }}', 'interp ((x | join(", ")) | upper)'),
    ('{{ "a" + x | upper }}', 'interp ("a" + (x | upper))'),
    ("{{ len(x) }}{{ round(x, precision=2) }}{{ f() }}",
     "interp len(x)\ninterp round(x, precision=2)\ninterp f()"),
    ("{{ x[0] }}{{ x[1:] }}{{ x[:2] }}{{ x[::2] }}{{ x[a:b:c] }}{{ x[:] }}",
     "interp x[0]\ninterp x[1:]\ninterp x[:2]\ninterp x[::2]\ninterp x[a:b:c]\ninterp x[:]"),
    ("{{ a.b.c[0].d }}", "interp a.b.c[0].d"),
    ("{{ [] }}{{ [1, 2,] }}{{ {} }}{{ {'a': 1,} }}",
     'interp []\ninterp [1, 2]\ninterp {}\ninterp {"a": 1}'),
    ("{{ True }}{{ false }}{{ None }}{{ none }}",
     "interp True\ninterp False\ninterp None\ninterp None"),
    ("{{ 1 }}{{ 2.5 }}{{ 1e3 }}{{ .5 }}", "interp 1\ninterp 2.5\ninterp 1000.0\ninterp 0.5"),
    ("{{ (a + b) * c }}", "interp ((a + b) * c)"),
    ('{{ gen x stop="}}" }}{{ "{%" }}{{ \'{#\' }}', 'gen x stop="}}"\ninterp "{%"\ninterp "{#"'),
    ("a -}} b %} c #}", "text 'a -}} b %} c #}'"),
    ("{{\n  gen\n  x\n  max_tokens=1\n}}", "gen x max_tokens=1"),
    ("{% if a\r\n %}x{% endif %}", "if a\n  text 'x'"),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_parse(text: str, expected: str) -> None:
    assert dump(text) == expected


def test_string_escapes() -> None:
    template = build(r"""{{ "a\nb\t\"q\"\\ \x41\u00e9\U0001F600 \d" }}{{ 'it\'s' }}""")
    first, second = template.body
    assert isinstance(first, ast.Interp) and isinstance(first.expr, ex.Const)
    assert first.expr.value == 'a\nb\t"q"\\ A\u00e9\U0001F600 \\d'
    assert isinstance(second, ast.Interp) and isinstance(second.expr, ex.Const)
    assert second.expr.value == "it's"


def test_non_ascii_text_and_strings() -> None:
    template = build("héllo {{ 'wörld' }} ✓")
    assert [type(n).__name__ for n in template.body] == ["Text", "Interp", "Text"]
    last = template.body[2]
    assert isinstance(last, ast.Text) and last.text == " ✓"
    assert last.span.column == 20


def test_spans_are_exact() -> None:
    template = build('ab\n  {{ gen answer stop="x" }}\n{% if c %}{% endif %}')
    text, gen, newline, branch = template.body
    assert isinstance(gen, ast.Gen) and isinstance(branch, ast.If)
    assert (gen.span.line, gen.span.column, gen.span.end_column) == (2, 3, 28)
    assert (gen.name_span.line, gen.name_span.column) == (2, 10)
    assert (gen.args[0].span.column, gen.args[0].expr.span.column) == (17, 22)
    assert (branch.span.line, branch.span.column, branch.span.end_column) == (3, 1, 11)
    assert isinstance(text, ast.Text) and text.span.start == 0 and text.span.end == 5
    assert isinstance(newline, ast.Text) and newline.text == "\n"


def test_stripped_text_span_points_at_kept_text() -> None:
    template = build("x  \n  {%- if a -%}  \n  y  {% endif %}")
    branch = template.body[1]
    assert isinstance(branch, ast.If)
    body_text = branch.arms[0].body[0]
    assert isinstance(body_text, ast.Text) and body_text.text == "y  "
    assert (body_text.span.line, body_text.span.column) == (3, 3)


def test_front_matter() -> None:
    template = build("---\nmodel: smollm2\n# comment\n\ninputs: [a, b]\n---\nbody {{ a }}")
    assert template.front_matter is not None
    entries = template.front_matter.entries
    assert [(e.key, e.value) for e in entries] == [("model", "smollm2"), ("inputs", "[a, b]")]
    assert (entries[1].span.line, entries[1].value_span.column) == (5, 9)
    body = template.body[0]
    assert isinstance(body, ast.Text) and body.text == "body "
    assert (body.span.line, body.span.column) == (7, 1)


def test_front_matter_only_at_start() -> None:
    template = build("x\n---\nmodel: m\n---\n")
    assert template.front_matter is None
    assert dump("x\n---\nmodel: m\n---\n") == "text 'x\\n---\\nmodel: m\\n---\\n'"


def test_empty_front_matter_and_empty_template() -> None:
    assert build("---\n---\n").front_matter is not None
    assert build("").body == ()


def test_nested_blocks() -> None:
    text = ("{% for a in xs %}{% if a %}{% for b in a %}{{ gen c }}{% endfor %}"
            "{% else %}{% user %}u{% enduser %}{% endif %}{% endfor %}")
    assert dump(text) == ("for a in xs\n  if a\n    for b in a\n      gen c\n  else\n"
                          "    role user\n      text 'u'")
