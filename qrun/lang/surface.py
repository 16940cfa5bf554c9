"""What qrun refuses of the surface people type, coming from Jinja or from other generation
languages (guidance, LMQL, SGLang), and the hint each refusal carries (docs/language.md §13,
§20): tags (reported by lang/parser.py), filters and functions, tests and methods (reported by
lang/compiler.py), hole arguments (lang/args.py). One table per kind, so the refusals and the
docs' table stay in step (tests/lang/test_lang_jinja.py checks both)."""

from __future__ import annotations

_NO_INHERITANCE = ("template inheritance is not supported: put shared text in a file and "
                   "use {% include \"file.tmpl\" %}")
_CALL_MACRO = "a macro is called in an expression: {{ name(args) }} (docs/language.md §21)"
_NO_ESCAPING = "qrun never escapes text (a prompt is not HTML): drop the filter"
_LOOP = "use a loop: {% for x in xs %}{% if ... %}...{% endif %}{% endfor %}"
_HIDDEN = ("a hole has no hidden= argument: put it in a {% hidden %}...{% endhidden %} block, "
           "whose text leaves the context and the result afterwards (its captures stay)")
_SELECT = 'a choice among fixed strings is a select hole: {{ select x options=["a", "b"] }}'

TAG_HINTS: dict[str, str] = {
    "extends": _NO_INHERITANCE,
    "block": _NO_INHERITANCE,
    "endblock": _NO_INHERITANCE,
    "call": _CALL_MACRO,
    "endcall": _CALL_MACRO,
    "import": "imports are not supported: use {% include \"file.tmpl\" %}",
    "from": "imports are not supported: use {% include \"file.tmpl\" %}",
    "with": "use {% set name = value %}",
    "endwith": "use {% set name = value %}",
    "filter": "apply the filter to a value: {{ x | upper }}",
    "endfilter": "apply the filter to a value: {{ x | upper }}",
    "do": "values cannot be changed in place: build a new one with {% set %}",
    "autoescape": _NO_ESCAPING,
    "endautoescape": _NO_ESCAPING,
    "trans": "translation blocks are not supported",
    "endtrans": "translation blocks are not supported",
    "endset": "block assignments are not supported: use {% set name = value %}",
}
"""Tags qrun does not have: Jinja's, and those of other template languages."""

FILTER_HINTS: dict[str, str] = {
    "d": "use `default`",
    "count": "use `length`",
    "e": _NO_ESCAPING,
    "escape": _NO_ESCAPING,
    "forceescape": _NO_ESCAPING,
    "safe": _NO_ESCAPING,
    "dictsort": "loop over `d.items() | sort`",
    "items": "use `d.items()`",
    "list": "lists come from literals, inputs, `split`, `range` and a dict's `keys()`, "
            "`values()` and `items()`",
    "string": "use `str(x)`",
    "reverse": "use a slice: `xs[::-1]`",
    "batch": "use slices: `xs[0:3]`",
    "slice": "use slices: `xs[0:3]`",
    "truncate": "use a slice: `s[:80]`",
    "wordcount": "use `s | split | length`",
    "format": "join text with `~`: `'Hello, ' ~ name`",
    "attr": "use `x[name]` or `x.name` (dict keys)",
    "map": _LOOP,
    "select": _LOOP,
    "reject": _LOOP,
    "selectattr": _LOOP,
    "rejectattr": _LOOP,
    "groupby": _LOOP,
    "sum": _LOOP,
    "random": "a template is deterministic: let the model choose with a `select` hole",
    "striptags": "not supported",
    "center": "not supported",
    "indent": "not supported",
    "wordwrap": "not supported",
    "filesizeformat": "not supported",
    "urlencode": "not supported",
    "urlize": "not supported",
    "xmlattr": "not supported",
    "pprint": "use `tojson(indent=2)`",
    "dict": "write a dict literal: {'a': 1}",
    "namespace": "not supported (a `set` in a loop body stays in the body)",
    "cycler": "use `['a', 'b'][loop.index0 % 2]`",
    "joiner": "use `xs | join(', ')`",
    "lipsum": "not supported",
    "caller": _CALL_MACRO,
    "super": _NO_INHERITANCE,
    "self": _NO_INHERITANCE,
}
"""Jinja filters and globals qrun does not have (`x | NAME` and `NAME(...)` share one table)."""

TEST_HINTS: dict[str, str] = {
    "divisibleby": "use `x % n == 0`",
    "even": "use `x % 2 == 0`",
    "odd": "use `x % 2 == 1`",
    "in": "use `x in y`",
    "eq": "use `==`",
    "equalto": "use `==`",
    "ne": "use `!=`",
    "lt": "use `<`",
    "lessthan": "use `<`",
    "le": "use `<=`",
    "gt": "use `>`",
    "greaterthan": "use `>`",
    "ge": "use `>=`",
    "sameas": "use `==` (or `is none`, `is true`, `is false`)",
    "lower": "use `s == s | lower`",
    "upper": "use `s == s | upper`",
    "callable": "no value in a template can be called",
    "escaped": _NO_ESCAPING,
    "filter": "not supported",
    "test": "not supported",
}
"""Jinja tests qrun does not have."""

_AS_FILTER = ("upper", "lower", "strip", "split", "replace", "title", "capitalize")
METHOD_HINTS: dict[str, str] = {
    **{name: f"use a filter: `s | {name}`" for name in _AS_FILTER},
    "lstrip": "use a filter: `s | trim`",
    "rstrip": "use a filter: `s | trim`",
    "join": "use a filter: `items | join(', ')`",
    "format": "join text with `~`: `'Hello, ' ~ name`",
    "startswith": "compare a slice: `s[:3] == 'abc'`",
    "endswith": "compare a slice: `s[-3:] == 'xyz'`",
    "get": "use `d[key] | default(value)`",
    "count": "use `x in s`, or `s | split(x) | length`",
    "find": "use `x in s`",
    "index": "use `x in xs`",
    "sort": "use a filter: `xs | sort` (a sorted copy)",
    "append": "values cannot be changed in place: `{% set xs = xs + [x] %}`",
    "extend": "values cannot be changed in place: `{% set xs = xs + ys %}`",
    "insert": "values cannot be changed in place: build a new list with `+`",
    "pop": "values cannot be changed in place: use slices, `xs[:-1]`",
    "remove": "values cannot be changed in place",
    "update": "values cannot be changed in place",
    "clear": "values cannot be changed in place",
    "setdefault": "use `d[key] | default(value)`",
    "cycle": "use `['a', 'b'][loop.index0 % 2]`",
    "changed": "compare with the previous item: `loop.first or xs[loop.index0 - 1] != x`",
}
"""Methods people call (Python's str/list/dict methods, Jinja's loop.cycle)."""

GEN_ARG_HINTS: dict[str, str] = {
    "hidden": _HIDDEN,
    "where": "constraints are the hole's arguments: regex=, json=, grammar=, max_tokens=, "
             "stop=",
    "choices": _SELECT,
    "options": _SELECT,
    "list_append": "a hole inside a loop captures the list of its values",
}
"""gen arguments of other systems (SGLang's n and choices, guidance's hidden and list_append,
LMQL's where)."""

SELECT_ARG_HINTS: dict[str, str] = {
    "choices": 'the candidates are options=: {{ select x options=["a", "b"] }}',
    "hidden": _HIDDEN,
}
"""select arguments of other systems (SGLang's choices, guidance's hidden)."""

STRING_FORMAT_HINT = "join text with `~`: `'Hello, ' ~ name`"
"""`'%s' % x` is refused (`%` is the remainder of numbers)."""
