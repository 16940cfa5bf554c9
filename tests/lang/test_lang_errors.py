"""One test per error kind: the error class, its exact line and column, and a message (and note)
substring. Errors come out of compile_source as TemplateErrors, in source order."""

from __future__ import annotations

import pytest

from qrun.errors import (
    BackendError,
    ConstraintError,
    EvaluationError,
    GenerationError,
    InputError,
    ModelLoadError,
    PositionedError,
    QrunError,
    TemplateCompileError,
    TemplateError,
    TemplateErrors,
    TemplateSyntaxError,
    UsageError,
)
from qrun.lang import compile_file, compile_source
from qrun.lang.surface import GEN_ARG_HINTS, SELECT_ARG_HINTS
from qrun.source import Source


def errors_of(text: str) -> tuple[TemplateError, ...]:
    with pytest.raises(TemplateErrors) as info:
        compile_source(text, "t.tmpl")
    return info.value.errors


Syntax, Compile, Constraint = TemplateSyntaxError, TemplateCompileError, ConstraintError

# (id, source, class, line, column, message substring, note substring or "")
CASES = [
    # ---- syntax: the parser ---------------------------------------------------------------
    ("unexpected-char", "ok\n{{ x ? }}", Syntax, 2, 6, "unexpected '?'", "expected '}}'"),
    ("missing-close", "{{ x y }}", Syntax, 1, 6, "unexpected 'y'", "expected '}}'"),
    ("eof-in-tag", "a\n  {{ gen x max_tokens=3", Syntax, 2, 3, "tag '{{' is never closed",
     "ends inside this tag"),
    ("eof-in-block-tag", "{% if x ", Syntax, 1, 1, "tag '{%' is never closed", "'%}'"),
    ("tag-runs-into-text", "{{ gen a\nmore text", Syntax, 2, 6, "unexpected 'text'",
     "opened at 1:1"),
    ("unknown-tag", "\n{% endfro %}", Syntax, 2, 1, "unknown tag 'endfro'",
     "did you mean 'endfor'?"),
    ("empty-block-tag", "{% %}", Syntax, 1, 1, "unexpected '%}'", "expected one of"),
    ("unclosed-raw", "x {% raw %} {{ y }}", Syntax, 1, 3, "'{% raw %}' is never closed",
     "endraw"),
    ("stray-endraw", "{% endraw %}", Syntax, 1, 1, "without a matching '{% raw %}'", ""),
    ("unclosed-comment", "a\nb {# note", Syntax, 2, 3, "comment is never closed", "'#}'"),
    ("unterminated-string", '{{ "abc }}', Syntax, 1, 4, "unterminated string", ""),
    ("unterminated-after-a-value", "{{ x 'abc }}", Syntax, 1, 6, "unterminated string", ""),
    # A closed string where none is expected is not "unterminated" (issue #23).
    ("quoted-hole-name", "{{ gen 'name' }}", Syntax, 1, 8, "a hole's name is a bare name",
     "write {{ gen name }}"),
    ("quoted-select-name", 'x\n{{ select "c" options=["a"] }}', Syntax, 2, 11,
     "a hole's name is a bare name", "write {{ select c }}"),
    ("raw-string", 'x\n{{ gen a stop=r"\\n" }}', Syntax, 2, 15, "raw strings are not supported",
     '"\\n" is a newline'),
    ("byte-string", "{{ b'x' }}", Syntax, 1, 4, "byte strings are not supported", "drop the b"),
    ("string-after-a-value", '{{ x "a" }}', Syntax, 1, 6, "unexpected string", "expected '}}'"),
    ("string-as-a-hole-argument", '{{ gen x "a" }}', Syntax, 1, 10, "unexpected string",
     'NAME=VALUE, e.g. stop="a"'),
    ("string-as-a-set-name", "{% set 'x' = 1 %}", Syntax, 1, 8, "unexpected string",
     "expected a name"),
    ("two-strings-in-a-loop", '{% for x in "ab" "cd" %}', Syntax, 1, 18, "unexpected string",
     "expected '%}'"),
    ("gen-without-name", "{{ gen }}", Syntax, 1, 8, "unexpected '}}'", "expected a name"),
    ("arg-without-value", "{{ gen x stop }}", Syntax, 1, 15, "unexpected '}}'",
     "expected '='"),
    ("arg-with-empty-value", "Hi {{ gen x stop= }}", Syntax, 1, 19, "unexpected '}}'",
     "expected an expression"),
    ("unclosed-dict", '{{ {"a": 1 }}', Syntax, 1, 1, "never closed", "expected '}'"),
    ("spaced-close", "{{ x } }}", Syntax, 1, 6, "expected '}}' to close the tag", "space"),
    ("unclosed-front-matter", "---\nmodel: x\n", Syntax, 1, 1, "front matter is never closed",
     ""),
    ("bad-front-matter-line", "---\nnot a pair\n---\n", Syntax, 2, 1, "'key: value'", ""),
    ("front-matter-particles-with-exact", "---\nparticles: 8\nsampler: exact\n---\n", Compile,
     3, 1, "front matter: particles applies to sampler 'smc' only, not 'exact'", ""),
    ("front-matter-smc-with-top-p", "---\ntop_p: 0.9\nsampler: smc\n---\n", Compile, 3, 1,
     "front matter: sampler 'smc' cannot be used with top_p", ""),
    ("kwarg-then-positional", "{{ round(x=1, 2) }}", Syntax, 1, 4, "positional argument", ""),
    ("bad-unicode-escape", '{{ "\\U11111111" }}', Syntax, 1, 4, "invalid escape", ""),
    ("huge-int-literal", "{{ " + "9" * 5000 + " }}", Syntax, 1, 4, "integer literal too long",
     ""),
    ("lone-surrogate", '{{ "a\\ud800" }}', Syntax, 1, 4, "lone surrogate U+D800", "pairs"),
    ("lone-surrogate-stop", 'x\n{{ gen a stop="\\ud800" }}', Syntax, 2, 15, "U+D800", ""),
    ("lone-surrogate-options", '{{ select a options=["ok", "\\udc00"] }}', Syntax, 1, 28,
     "U+DC00", ""),
    ("reversed-surrogates", '{{ "\\ude00\\ud83d" }}', Syntax, 1, 4, "U+DE00", ""),
    ("raw-surrogate-in-text", "ok\n  \ud800 {{ x }}", Syntax, 2, 3, "lone surrogate U+D800",
     ""),
    ("unknown-keyword", "{{ max(xs, key=f) }}", Compile, 1, 4,
     "max() has no keyword argument 'key' (it takes no keyword arguments)", ""),
    ("unknown-keyword-filter", "{{ xs | join(glue=',') }}", Compile, 1, 4,
     "join() has no keyword argument 'glue' (it takes sep)", ""),
    # ---- the Jinja surface qrun refuses (docs/language.md §20) ---------------------------------
    ("unknown-test", "{{ x is divisibleby(3) }}", Compile, 1, 4, "unknown test 'divisibleby'",
     "use `x % n == 0`"),
    ("test-argument-without-parentheses", "{{ x is divisibleby 3 }}", Syntax, 1, 21,
     "unexpected '3'", "'divisibleby' is not a qrun test"),
    ("test-with-arguments", "{{ x is string(1) }}", Compile, 1, 4,
     "the test 'string' takes no arguments", ""),
    ("is-a-variable", "{{ x is y }}", Compile, 1, 4, "unknown test 'y'", "tests: defined"),
    ("method-call", "x\n{{ s.upper() }}", Compile, 2, 4,
     "method calls are not supported: '.upper()'", "use a filter: `s | upper`"),
    ("method-get", "{{ d.get('k', 1) }}", Compile, 1, 4, "'.get()'",
     "`d[key] | default(value)`"),
    ("dict-method-arguments", "{{ d.items(1) }}", Compile, 1, 4, "items() takes no arguments",
     ""),
    ("string-format", '{{ "%s!" % x }}', Compile, 1, 4, "'%' does not format strings",
     "join text with `~`"),
    ("f-string", '{{ f"hi {x}" }}', Syntax, 1, 4, "f-strings are not supported", "`~`"),
    ("jinja-filter", "{{ x | d('y') }}", Compile, 1, 4, "unknown function 'd'",
     "use `default`"),
    ("jinja-global", "{% set ns = namespace(a=1) %}", Compile, 1, 13,
     "unknown function 'namespace'", "not supported"),
    ("round-ndigits", "{{ round(x, ndigits=2) }}", Compile, 1, 4,
     "round() has no keyword argument 'ndigits' (it takes precision, method)", ""),
    ("sort-key", "{{ xs | sort(key=f) }}", Compile, 1, 4,
     "sort() has no keyword argument 'key' (it takes reverse, case_sensitive, attribute)", ""),
    ("tag-extends", '{% extends "base.tmpl" %}', Syntax, 1, 1, "unknown tag 'extends'",
     "template inheritance is not supported"),
    ("tag-block", "x {% block body %}{% endblock %}", Syntax, 1, 3, "unknown tag 'block'",
     "use {% include"),
    ("tag-call", "{% call f() %}{% endcall %}", Syntax, 1, 1, "unknown tag 'call'",
     "{{ name(args) }}"),
    ("tag-with", "{% with x = 1 %}", Syntax, 1, 1, "unknown tag 'with'", "{% set name"),
    # ---- what people write coming from other systems (issue #23) ------------------------------
    ("lmql-where", "{{ gen x where len(x) < 10 }}", Syntax, 1, 10,
     "'where' clauses are not supported: constraints are the hole's arguments", "regex="),
    ("lmql-where-on-its-line", "{{ select x\n   where x in ['a'] }}", Syntax, 2, 4,
     "'where' clauses are not supported", "options="),
    ("where-argument", "{{ gen x where=3 }}", Compile, 1, 10, "unknown argument 'where' for gen",
     "constraints are the hole's arguments"),
    ("select-choices", '{{ select c choices=["a", "b"] }}', Compile, 1, 13,
     "unknown argument 'choices' for select", "the candidates are options="),
    ("gen-choices", '{{ gen c choices=["a", "b"] }}', Compile, 1, 10,
     "unknown argument 'choices' for gen", "{{ select x options="),
    ("gen-n", "{{ gen x n=0 }}", Compile, 1, 12, "n must be a positive integer, got 0", ""),
    ("gen-n-bool", "{{ gen x n=true }}", Compile, 1, 12, "n must be a positive integer", ""),
    ("fork-unclosed", "{% fork x in xs %}{{ gen a }}", Syntax, 1, 1,
     "'{% fork %}' at 1:1 is never closed (expected '{% endfork %}')", ""),
    ("fork-break", "{% fork x in xs %}{% break %}{% endfork %}", Compile, 1, 19,
     "'{% break %}' cannot leave a '{% fork %}' branch", "the fork starts at 1:1"),
    ("hidden-stray-end", "x{% endhidden %}", Syntax, 1, 2,
     "'{% endhidden %}' without a matching '{% hidden %}'", ""),
    ("fresh-unclosed", "{% fresh %}x", Syntax, 1, 1,
     "'{% fresh %}' at 1:1 is never closed (expected '{% endfresh %}')", ""),
    ("gen-hidden", "{{ gen x hidden=true }}", Compile, 1, 10,
     "unknown argument 'hidden' for gen", "put it in a {% hidden %}"),
    ("select-hidden", '{{ select x options=["a"] hidden=true }}', Compile, 1, 27,
     "unknown argument 'hidden' for select", "put it in a {% hidden %}"),
    ("for-else", "{% for x in xs %}{% else %}{% endfor %}", Syntax, 1, 18,
     "'{% else %}' outside of an '{% if %}' block", "a loop has no '{% else %}'"),
    ("break-outside-loop", "\n{% break %}", Compile, 2, 1, "'{% break %}' outside a loop", ""),
    ("continue-outside-loop", "{% if a %}{% continue %}{% endif %}", Compile, 1, 11,
     "'{% continue %}' outside a loop", ""),
    ("loop-variable-twice", "{% for a, a in xs %}{% endfor %}", Compile, 1, 11,
     "loop variable 'a' appears twice", ""),
    ("loop-unpacks-into-loop", "{% for k, loop in xs %}{% endfor %}", Compile, 1, 11,
     "'loop' is reserved", ""),
    ("include-in-a-string-template", 'x\n{% include "x.tmpl" %}', Compile, 2, 1,
     "needs a folder to include from", "include_dir"),
    # ---- blocks -------------------------------------------------------------------------------
    ("unclosed-for", "a\n{% for x in xs %}\n{{ x }}", Syntax, 2, 1,
     "'{% for %}' at 2:1 is never closed (expected '{% endfor %}')", ""),
    ("unclosed-if", "{% if a %}", Syntax, 1, 1, "expected '{% endif %}'", ""),
    ("unclosed-role", "{% user %}hi", Syntax, 1, 1, "expected '{% enduser %}'", ""),
    ("mismatched-end", "{% if a %}\n  {% for x in y %}\n{% endif %}", Syntax, 2, 3,
     "'{% for %}' at 2:3 is never closed (expected '{% endfor %}' before '{% endif %}' at 3:1)",
     ""),
    ("stray-end", "x {% endfor %}", Syntax, 1, 3, "'{% endfor %}' without a matching", ""),
    ("stray-end-in-block", "{% for x in y %}{% endif %}{% endfor %}", Syntax, 1, 17,
     "'{% endif %}' without a matching '{% if %}'", "innermost open block is '{% for %}'"),
    ("else-outside-if", "{% else %}", Syntax, 1, 1, "outside of an '{% if %}'", ""),
    ("elif-after-else", "{% if a %}{% else %}{% elif b %}{% endif %}", Syntax, 1, 21,
     "'{% elif %}' after '{% else %}'", "1:11"),
    ("two-elses", "{% if a %}{% else %}{% else %}{% endif %}", Syntax, 1, 21,
     "'{% else %}' after '{% else %}'", ""),
    ("end-role-mismatch", "{% user %}x{% endassistant %}{% enduser %}", Syntax, 1, 12,
     "'{% endassistant %}' without a matching '{% assistant %}'", "'{% enduser %}'"),
    ("nested-roles", "{% user %}\n{% system %}x{% endsystem %}{% enduser %}", Compile, 2, 1,
     "roles cannot nest", "starts at 1:1"),
    ("nested-roles-via-if", "{% user %}{% if a %}{% user %}{% enduser %}{% endif %}{% enduser %}",
     Compile, 1, 21, "'{% user %}' inside '{% user %}'", ""),
    # ---- names --------------------------------------------------------------------------------
    ("unknown-variable", "---\ninputs: [question]\n---\n{{ questoin }}", Compile, 4, 4,
     "unknown variable 'questoin'", "did you mean 'question'?"),
    ("used-before-capture", "{{ x }}\n{{ gen x }}", Compile, 1, 4,
     "'x' is used before it is captured", "captured at 2:8"),
    ("used-before-set", "{{ y }}{% set y = 1 %}", Compile, 1, 4, "used before it is set", ""),
    ("captured-on-some-paths", "{% if c %}{{ gen a }}{% endif %}\n{{ a }}", Compile, 2, 4,
     "'a' is not captured on every path", "captured at 1:18"),
    ("set-on-some-paths", "{% if c %}{% set a = 1 %}{% endif %}{{ a }}", Compile, 1, 40,
     "'a' is not set on every path", ""),
    ("undeclared-with-inputs-some-path",
     "---\ninputs: [c]\n---\n{% if c %}{{ gen a }}{% endif %}{{ a }}", Compile, 4, 36,
     "not captured on every path", ""),
    ("loop-var-outside-loop", "---\ninputs: [xs]\n---\n{% for x in xs %}{% endfor %}{{ x }}",
     Compile, 4, 33, "unknown variable 'x'", ""),
    ("underscore-name", "{{ _secret }}", Compile, 1, 4, "names starting with '_'", ""),
    ("dunder-inside-name", "{{ a__b }}", Compile, 1, 4, "containing '__' are not allowed", ""),
    ("dunder-attr", "{{ x.__class__ }}", Compile, 1, 4, "attributes starting with '_'", ""),
    ("dunder-chain", "{{ x.a.__globals__ }}", Compile, 1, 4, "'__globals__'", ""),
    ("unknown-function", "{{ __import__('os') }}", Compile, 1, 4,
     "unknown function '__import__'", "functions: len"),
    ("open-function", "\n  {{ open('f') }}", Compile, 2, 6, "unknown function 'open'", ""),
    ("unknown-filter", "{{ x | uper }}", Compile, 1, 4, "unknown function 'uper'",
     "did you mean 'upper'?"),
    ("unknown-loop-attr", "{% for x in xs %}{{ loop.idx }}{% endfor %}", Compile, 1, 21,
     "'loop' has no attribute 'idx'", "did you mean 'index'?"),
    # ---- captures -----------------------------------------------------------------------------
    ("capture-twice", "{{ gen a }}\n{{ gen a }}", Compile, 2, 8, "'a' is captured twice",
     "first captured at 1:8"),
    ("capture-twice-in-loop", "{% for x in xs %}{{ gen a }}{{ gen a }}{% endfor %}", Compile,
     1, 36, "captured twice", ""),
    ("capture-after-loop", "{% for x in xs %}{{ gen a }}{% endfor %}{{ gen a }}", Compile,
     1, 48, "captured twice", ""),
    ("capture-is-input", "---\ninputs: [a]\n---\n{{ gen a }}", Compile, 4, 8,
     "same name as an input", ""),
    ("capture-is-set", "{% set a = 1 %}{{ gen a }}", Compile, 1, 23,
     "same name as a 'set' variable", ""),
    ("capture-is-loop-var", "{% for a in xs %}{{ gen a }}{% endfor %}", Compile, 1, 25,
     "same name as a loop variable", ""),
    ("set-is-capture", "{{ gen a }}{% set a = 1 %}", Compile, 1, 8,
     "same name as a 'set' variable", "set at 1:19"),
    ("set-is-input", "---\ninputs: [a]\n---\n{% set a = 1 %}", Compile, 4, 8,
     "'set a' uses the name of an input", ""),
    ("capture-underscore", "{{ gen _x }}", Compile, 1, 8, "names may not start with '_'", ""),
    ("capture-double-underscore", "{{ gen a__logprobs }}", Compile, 1, 8, "contain '__'", ""),
    ("capture-loop", "{{ gen loop }}", Compile, 1, 8, "'loop' is reserved", ""),
    # ---- hole arguments -----------------------------------------------------------------------
    ("unknown-arg", "{{ gen a maxtokens=3 }}", Compile, 1, 10,
     "unknown argument 'maxtokens' for gen", "did you mean 'max_tokens'?"),
    ("unknown-select-arg", '{{ select a options=["x"] temperatur=0 }}', Compile, 1, 27,
     "unknown argument 'temperatur' for select", "did you mean 'temperature'?"),
    ("gen-arg-on-select", '{{ select a options=["x"] max_tokens=3 }}', Compile, 1, 27,
     "unknown argument 'max_tokens' for select", "select accepts: options"),
    ("arg-twice", "{{ gen a seed=1 seed=2 }}", Compile, 1, 17, "'seed' given twice",
     "first given at 1:10"),
    ("max-tokens-str", '{{ gen a max_tokens="x" }}', Compile, 1, 21,
     'max_tokens must be a positive integer, got "x"', ""),
    ("max-tokens-zero", "{{ gen a max_tokens=0 }}", Compile, 1, 21, "positive integer", ""),
    ("max-tokens-bool", "{{ gen a max_tokens=true }}", Compile, 1, 21, "positive integer", ""),
    ("temperature-negative", "{{ gen a temperature=-1 }}", Compile, 1, 22,
     "temperature must be a number >= 0, got -1", ""),
    ("top-p-large", "{{ gen a top_p=1.5 }}", Compile, 1, 16, "top_p must be a number in (0, 1]",
     ""),
    ("top-p-zero", "{{ gen a top_p=0 }}", Compile, 1, 16, "(0, 1]", ""),
    ("top-k-float", "{{ gen a top_k=2.5 }}", Compile, 1, 16, "top_k must be an integer >= 0",
     ""),
    ("seed-negative", "{{ gen a seed=-3 }}", Compile, 1, 15, "seed must be an integer >= 0",
     ""),
    ("stop-int", "{{ gen a stop=3 }}", Compile, 1, 15, "stop must be a non-empty string", ""),
    ("stop-empty", '{{ gen a stop="" }}', Compile, 1, 15, "non-empty string", ""),
    ("stop-list-bad", '{{ gen a stop=["a", 1] }}', Compile, 1, 15, "non-empty string", ""),
    ("heal-str", '{{ gen a heal="yes" }}', Compile, 1, 15, 'heal must be true or false', ""),
    ("normalize-bad", '{{ select a options=["x"] normalize="max" }}', Compile, 1, 37,
     'normalize must be "sum" or "mean"', ""),
    ("options-empty", "{{ select a options=[] }}", Compile, 1, 21, "non-empty list", ""),
    ("options-not-str", '{{ select a options=["x", 1] }}', Compile, 1, 21,
     "non-empty list of non-empty strings", ""),
    ("options-duplicate", '{{ select a options=["x", "y", "x"] }}', Compile, 1, 21,
     'distinct strings ("x" repeats)', ""),
    ("options-missing", "{{ select a }}", Compile, 1, 1, "needs options=", ""),
    ("options-scalar", '{{ select a options="x" }}', Compile, 1, 21, "non-empty list", ""),
    # ---- constraints --------------------------------------------------------------------------
    ("regex-and-json", '{{ gen a regex="x" json={} }}', Constraint, 1, 20,
     "regex= and json= cannot both", ""),
    ("unknown-pattern", "\n{{ gen a regex=EMIAL }}", Constraint, 2, 16,
     "unknown pattern 'EMIAL'", "did you mean 'EMAIL'?"),
    ("bad-regex", '{{ gen a regex="ab(c" }}', Constraint, 1, 19, "invalid regex: missing )",
     ""),
    ("bad-regex-escaped", '{{ gen a regex="\\\\d(" }}', Constraint, 1, 16, "invalid regex",
     ""),
    ("regex-not-str", "{{ gen a regex=3 }}", Constraint, 1, 16, "regex must be a string", ""),
    ("regex-backreference", '{{ gen a regex="(a)\\1" }}', Constraint, 1, 16,
     "backreferences (\\1, (?P=name)) cannot be expressed as a token mask", ""),
    ("regex-lookahead", '\n  {{ gen a regex="a(?=b)" }}', Constraint, 2, 18,
     "lookahead (?=...) cannot be expressed", ""),
    ("regex-word-boundary", '{{ gen a regex="\\\\bx" }}', Constraint, 1, 16,
     "word boundaries (\\b)", ""),
    ("regex-empty-language", '{{ gen a regex="a^b" }}', Constraint, 1, 16, "matches nothing", ""),
    ("regex-unicode-property", '{{ gen a regex="\\p{L}+" }}', Constraint, 1, 16,
     "Unicode properties", ""),
    ("regex-too-many-states", '{{ gen a regex="x{20001}" }}', Constraint, 1, 16,
     "more than 20000 DFA states", ""),
    ("json-bad-type", '{{ gen a json={"type": "strnig"} }}', Constraint, 1, 15,
     "JSON Schema: Invalid type: strnig (at /type)", ""),
    ("json-unsupported-keyword", '{{ gen a json={"type": "array", "uniqueItems": true} }}',
     Constraint, 1, 15, 'Unimplemented keys: ["uniqueItems"] (at /uniqueItems)', ""),
    ("json-bad-pattern", '{{ gen a json={"type": "string", "pattern": "a(?!b)"} }}', Constraint,
     1, 15, "look-around", ""),
    ("json-unsatisfiable", '{{ gen a json={"type": "integer", "const": "x"} }}', Constraint,
     1, 15, "Unsatisfiable schema: incompatible types", ""),
    ("json-empty-type", '{{ gen a json={"type": []} }}', Constraint, 1, 15, "Unsatisfiable", ""),
    ("json-infinity", '{{ gen a json={"type": "number", "maximum": 1e999} }}', Constraint, 1, 15,
     "JSON has no Infinity or NaN: use a finite number (at /maximum)", ""),
    ("json-one-of", '{{ gen a json={"oneOf": [{"type": "string"}, {"pattern": "ab"}]} }}',
     Constraint, 1, 15, "oneOf is supported only where its branches cannot overlap", ""),
    ("json-not-dict", '{{ gen a json="x" }}', Constraint, 1, 15, "json must be a JSON Schema",
     ""),
    ("json-and-grammar", '{{ gen a json={} grammar="start: \'a\'" }}', Constraint, 1, 18,
     "json= and grammar= cannot both", ""),
    ("closed-without-json", '{{ gen a regex="a" closed=true }}', Compile, 1, 20,
     "closed= applies to json= and tools= holes only", ""),
    ("closed-not-bool", '{{ gen a json={} closed="yes" }}', Compile, 1, 25,
     "closed must be true or false", ""),
    ("grammar-not-str", "{{ gen a grammar=3 }}", Constraint, 1, 18,
     "grammar must be a Lark grammar", ""),
    ("grammar-unknown-rule", '{{ gen a grammar="start: x\\nx: \\"a\\" foo" }}', Constraint,
     1, 32, 'grammar: unknown name: "foo" (line 2, column 4 of the grammar)', ""),
    ("grammar-bad-regex", "\n{{ gen a grammar='start: /[a-/' }}", Constraint, 2, 26,
     'invalid regex "[a-": unclosed character class', ""),
    ("grammar-options", "{{ gen a grammar='%llguidance {}\\nstart: \"a\"' }}", Constraint, 1, 18,
     "cannot set %llguidance options", ""),
    # ---- front matter -------------------------------------------------------------------------
    ("fm-unknown-key", "---\nmodle: x\n---\n", Compile, 2, 1, "unknown front matter key 'modle'",
     "did you mean 'model'?"),
    ("fm-duplicate-key", "---\nseed: 1\nseed: 2\n---\n", Compile, 3, 1, "given twice", "2:1"),
    ("fm-temperature", "---\ntemperature: hot\n---\n", Compile, 2, 14,
     "'temperature' must be a number >= 0", ""),
    ("fm-max-tokens", "---\nmax_tokens: 0\n---\n", Compile, 2, 13, "positive integer", ""),
    ("fm-top-p", "---\ntop_p: 2\n---\n", Compile, 2, 8, "(0, 1]", ""),
    ("fm-seed", "---\nseed: 1.5\n---\n", Compile, 2, 7, "integer >= 0", ""),
    ("fm-device", "---\ndevice: gpu\n---\n", Compile, 2, 9, "cpu, cuda", ""),
    ("fm-dtype", "---\ndtype: fp8\n---\n", Compile, 2, 8, "float32", ""),
    ("fm-model-empty", "---\nmodel:\n---\n", Compile, 2, 7, "model name", ""),
    ("fm-inputs-not-list", "---\ninputs: a, b\n---\n", Compile, 2, 9, "must be a list", ""),
    ("fm-inputs-bad-name", "---\ninputs: [a-b]\n---\n", Compile, 2, 10, "not a valid name", ""),
    ("fm-inputs-underscore", "---\ninputs: [_a]\n---\n", Compile, 2, 10, "may not start", ""),
    ("fm-inputs-twice", "---\ninputs: [a, a]\n---\n", Compile, 2, 13, "declared twice", ""),
]


@pytest.mark.parametrize(("text", "cls", "line", "column", "message", "note"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_error(text: str, cls: type[TemplateError], line: int, column: int, message: str,
               note: str) -> None:
    errors = errors_of(text)
    assert len(errors) == 1, "\n".join(e.render() for e in errors)
    err = errors[0]
    assert type(err) is cls, err.render()
    assert (err.span.line, err.span.column) == (line, column), err.render()
    assert message in err.message, err.render()
    if note:
        assert any(note in n for n in err.notes), err.render()


@pytest.mark.parametrize(("kind", "name"), [
    *(("gen", name) for name in sorted(GEN_ARG_HINTS)),
    *(("select", name) for name in sorted(SELECT_ARG_HINTS))])
def test_every_hinted_argument_has_its_hint(kind: str, name: str) -> None:
    options = ' options=["a"]' if kind == "select" else ""
    err, = errors_of(f"{{{{ {kind} x{options} {name}=1 }}}}")
    assert err.message == f"unknown argument '{name}' for {kind}"
    hints = GEN_ARG_HINTS if kind == "gen" else SELECT_ARG_HINTS
    assert err.notes[0] == hints[name]


def test_case_ids_are_unique() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))


def test_errors_render_with_file_line_column_and_caret() -> None:
    err = errors_of("Q: {{ q }}\nA: {{ gen a max_tokens=0 }}")[0]
    assert err.render() == (
        "t.tmpl:2:24: error: max_tokens must be a positive integer, got 0\n"
        "  A: {{ gen a max_tokens=0 }}\n"
        "                         ^")


def test_all_errors_are_reported_at_once_in_source_order() -> None:
    errors = errors_of("{{ gen a max_tokens=0 }}\n{{ x.__y }}\n{{ open(1) }}\n{{ gen a }}")
    assert [(e.span.line, type(e)) for e in errors] == [
        (1, TemplateCompileError), (2, TemplateCompileError), (3, TemplateCompileError),
        (4, TemplateCompileError)]


def test_block_errors_are_reported_together() -> None:
    errors = errors_of("{% for x in y %}\n{% else %}\n{% if a %}\n")
    assert [(e.span.line, e.span.column) for e in errors] == [(1, 1), (2, 1), (3, 1)]


def test_exit_code_is_2() -> None:
    with pytest.raises(TemplateErrors) as info:
        compile_source("{{ x")
    assert info.value.exit_code == 2
    assert info.value.first.source.name == "<string>"


def test_compile_file_errors_use_the_path(tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    path = tmp_path / "bad.tmpl"
    path.write_text("line 1\n{{ gen a max_tokens=0 }}\n", encoding="utf-8")
    with pytest.raises(TemplateErrors) as info:
        compile_file(path)
    assert str(info.value).startswith(f"{path}:2:21: error: max_tokens")


def test_compile_file_missing_or_not_utf8(tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    with pytest.raises(UsageError, match="cannot read template"):
        compile_file(tmp_path / "missing.tmpl")
    bad = tmp_path / "latin1.tmpl"
    bad.write_bytes(b"caf\xe9 {{ x }}")
    with pytest.raises(UsageError, match="cannot read template"):
        compile_file(bad)


# ---- the hierarchy users catch ----------------------------------------------------------------


def test_every_compile_error_is_a_template_error_and_no_run_time_failure_is() -> None:
    compile_errors: list[type[QrunError]] = [TemplateSyntaxError, TemplateCompileError,
                                             ConstraintError, TemplateErrors]
    assert all(issubclass(cls, TemplateError) for cls in compile_errors)
    run_time: list[type[QrunError]] = [GenerationError, EvaluationError, BackendError]
    assert not any(issubclass(cls, TemplateError) for cls in run_time)
    assert not issubclass(InputError, TemplateError) and issubclass(InputError, UsageError)
    for cls in [*compile_errors, *run_time, InputError, UsageError, ModelLoadError]:
        assert issubclass(cls, QrunError)
    # Exit codes: 2 for template and usage errors, 1 for run-time failures.
    exit_2: list[type[QrunError]] = [*compile_errors, InputError, UsageError, ModelLoadError]
    assert {cls.exit_code for cls in exit_2} == {2}
    assert {cls.exit_code for cls in run_time} == {1}


def test_template_errors_group_is_caught_as_a_template_error() -> None:
    with pytest.raises(TemplateError) as info:
        compile_source("{{ gen a max_tokens=0 }}\n{{ x.__y }}", "t.tmpl")
    group = info.value
    assert isinstance(group, TemplateErrors) and len(group.errors) == 2
    # The group reads as its first error, and renders all of them.
    assert (group.span.line, group.message) == (1, group.errors[0].message)
    assert str(group) == group.render() == "\n".join(e.render() for e in group.errors)
    assert group.exit_code == 2


def test_a_nested_group_is_flattened() -> None:
    source = Source("t.tmpl", "ab")
    one = TemplateSyntaxError("one", source.span_at(1, 1), source)
    two = TemplateCompileError("two", source.span_at(0, 1), source)
    group = TemplateErrors([one, TemplateErrors([two])])
    assert [e.message for e in group.errors] == ["two", "one"]


def test_run_time_errors_render_positions_like_template_errors() -> None:
    source = Source("t.tmpl", "x\n{{ y }}")
    for cls in (GenerationError, EvaluationError, InputError):
        err = cls("bad", source.span_at(5, 1), source, ["a note"])
        assert isinstance(err, PositionedError)
        assert str(err) == "t.tmpl:2:4: error: bad\n  {{ y }}\n     ^\n  note: a note"
    assert EvaluationError("e", source.span_at(0), source).exit_code == 1
    assert InputError("e", source.span_at(0), source).exit_code == 2


def test_an_unprintable_character_is_shown_as_a_replacement() -> None:
    # A Python str may hold a lone surrogate; printing one would raise UnicodeEncodeError.
    with pytest.raises(TemplateErrors) as info:
        compile_source("ok \udc80 {{ x }}")
    str(info.value).encode("utf-8")
    assert "ok \ufffd {{ x }}" in str(info.value)
