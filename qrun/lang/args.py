"""Part of stage 3 (compile_template): hole arguments and front matter. Which keys exist, the type
checks of literal values, the lowering of literal constraints (qrun/constraint/spec.py lower,
which the runtime and qrun.Matcher use too: the engine of each hole is chosen there, every
error shows at --check, and the spec is kept in the IR), and typed front-matter defaults."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from qrun.constraint import ConstraintSpec, JsonFormat, JsonFormatError, LoweringError, lower
from qrun.constraint.grammar import FIXED
from qrun.constraint.grammar.formats import MODES as FORMAT_MODES
from qrun.constraint.tools import ToolsError, read_tools
from qrun.errors import (
    ConstraintError,
    TemplateCompileError,
    TemplateError,
    UsageError,
    suggest,
)
from qrun.lang import ast, ir
from qrun.lang import expr as ex
from qrun.lang.build import literal_offsets
from qrun.lang.builtins import type_name
from qrun.lang.declared import InputType, read_input_type, read_output
from qrun.lang.surface import GEN_ARG_HINTS, SELECT_ARG_HINTS
from qrun.options import (
    CHECKS,
    MODEL_CHECKS,
    RESHAPING_OPTIONS,
    SAMPLERS,
    SAMPLING_OPTIONS,
    SMC_OPTIONS,
    ModelOptions,
    RunOptions,
    is_number,
)
from qrun.source import Source, Span

GEN_ARGS = ("max_tokens", "stop", "keep_stop", "regex", "json", "closed", "formats", "grammar",
            "tools", *SAMPLING_OPTIONS, "seed", "heal", "ends_at_text", "sampler", "particles",
            "ess_threshold", "n")
# The arguments that constrain a hole; at most one per hole.
CONSTRAINT_ARGS = ("regex", "json", "grammar", "tools")
# The arguments whose constraint is read as a JSON Schema (closed= and formats= apply).
SCHEMA_ARGS = ("json", "tools")
SELECT_ARGS = ("options", "temperature", "normalize")
FRONT_MATTER_KEYS = ("model", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                     "frequency_penalty", "repetition_penalty", "sampler", "particles",
                     "ess_threshold", "seed", "max_tokens", "device", "dtype", "inputs", "output",
                     "tests")

NameCheck = Callable[[str, Span, str], bool]
"""The compiler's check of a new name (`name`, `span`, what it is): False when it reported one."""


# What the two samplers that aim at the model's conditional cannot mean: a value scored whole
# has no stop string, and reshaped or filtered logits would change the target.
CONDITIONAL_REFUSES = ("stop", "keep_stop", *RESHAPING_OPTIONS)
SAMPLER_HINT = ('sampler="exact" and sampler="smc" draw a regex=, json=, grammar= or tools= '
                "value from the model's own distribution over the constraint's language "
                "(docs/language.md §14.8)")


SMC_ARGS = SMC_OPTIONS
"""The arguments of sampler="smc" alone; either without a sampler asks for it (the run options
of the same names likewise)."""


def sampler_conflict(sampler: str, given: Iterable[str]) -> str | None:
    """Why a hole with these arguments cannot take `sampler`, or None: the compiler's check
    of a literal sampler and the runtime's of a computed one."""
    fault = sampler_fault(sampler, given)
    return None if fault is None else fault[1]


def sampler_fault(sampler: str, given: Iterable[str]) -> tuple[str | None, str] | None:
    """sampler_conflict's answer with the argument at fault (None: the sampler itself), which
    the compiler's caret points at."""
    names = set(given)
    smc_only = next(((name, f'{name}= applies to sampler="smc" only') for name in SMC_ARGS
                     if name in names), None)
    if sampler == "mask":
        return smc_only
    if not names & set(CONSTRAINT_ARGS):
        return None, (f'sampler="{sampler}" needs a constraint (regex=, json=, grammar= or '
                      "tools=): an unconstrained hole already samples the model's own "
                      "distribution")
    wrong = [name for name in CONDITIONAL_REFUSES if name in names]
    if wrong:
        return wrong[0], f'sampler="{sampler}" cannot be used with {wrong[0]}='
    return smc_only if sampler == "exact" else None


def weighing_conflict(kind: str, given: Iterable[str], sampler: str | None
                      ) -> tuple[str, str] | None:
    """Why a hole (`kind` "gen" or "select") with these arguments and this sampler (None:
    none chosen) cannot run in a `{% particles %}` block, as (the argument at fault, the
    message), or None. A particle is weighed by the model's probability of its holes' values
    against the chance it had of drawing them (runtime/particle_block.py): a constrained gen
    must be drawn by a sampler that knows that chance ("exact" or "smc"; where the hole names
    none, the block takes exact for a small language and one particle for a large one), and
    every hole from the model's own distribution at temperature 1 (the block's temperature
    chooses the particle). The compiler's check of the arguments written, and the runtime's of
    a macro's hole called in a block."""
    names = set(given)
    block = "'{% particles %}' block"
    if "temperature" in names:
        return "temperature", (f"a {kind} hole in a {block} samples at temperature 1: the "
                               "run's temperature chooses among the particles (0: the "
                               "values they weigh most)")
    if "seed" in names:  # a fork's branches may share one; a block's particles must differ
        return "seed", (f"seed= cannot be used on a hole in a {block}: every particle "
                        "would draw the same value from it; the particles draw from the "
                        "run's seed (give the run one to replay them)")
    if kind == "select":
        return None if "normalize" not in names else (
            "normalize", f"normalize= cannot be used in a {block}: a select there weighs "
            "each option by its whole probability")
    if names & set(CONSTRAINT_ARGS):
        if sampler == "mask":
            return "sampler", (f'sampler="mask" cannot be used in a {block}: its holes are '
                               'weighed, which needs sampler="exact" or "smc" (leave it out '
                               "and the block chooses)")
        refused = [name for name in CONDITIONAL_REFUSES if name in names]
        return None if not refused else (
            refused[0], f"{refused[0]}= cannot be used in a {block}: its constrained holes "
            "draw from the model's own distribution over the constraint's language "
            '(sampler="smc" or "exact")')
    reshaped = [name for name in RESHAPING_OPTIONS if name in names]
    return None if not reshaped else (
        reshaped[0], f"{reshaped[0]}= cannot be used in a {block}: a free hole there is "
        "drawn from the model's own distribution")


class ArgChecker:
    """Checks the arguments of every hole and the front matter of one compile. Errors go to the
    shared `errors` list; compiled patterns are cached for the duration of the compile."""

    def __init__(self, source: Source, errors: list[TemplateError]) -> None:
        self.source = source
        self.errors = errors
        self.declared_at: dict[str, Span] = {}  # input -> its `inputs:` front matter line
        # Typed `inputs:` (a mapping) and `output:` (lang/declared.py), when the front matter
        # declares them.
        self.input_types: dict[str, InputType] = {}
        self.output_schema: dict[str, Any] | None = None
        self.output_span: Span | None = None
        # `tests:` (docs/testing.md §1): kept as written for `qrun test`, which reads it.
        self.tests: ast.FrontMatterEntry | None = None

    def fail(self, message: str, span: Span, *notes: str) -> None:
        self.errors.append(TemplateCompileError(message, span, self.source, notes))

    def constraint_error(self, message: str, span: Span, *notes: str) -> None:
        self.errors.append(ConstraintError(message, span, self.source, notes))

    # ---- hole arguments ----------------------------------------------------------------------

    def hole_args(self, node: ast.Gen | ast.Select) -> dict[str, ast.HoleArg]:
        """The hole's arguments by name, after reporting unknown, repeated and ill-typed ones
        (only the first of a repeated argument is kept)."""
        kind, allowed, hints = (("gen", GEN_ARGS, GEN_ARG_HINTS) if isinstance(node, ast.Gen)
                                else ("select", SELECT_ARGS, SELECT_ARG_HINTS))
        args: dict[str, ast.HoleArg] = {}
        for arg in node.args:
            if arg.name not in allowed:
                hint = hints.get(arg.name)
                self.fail(f"unknown argument '{arg.name}' for {kind}",
                          prefix(arg.span, len(arg.name)),
                          *([hint] if hint else suggest(arg.name, allowed)),
                          f"{kind} accepts: " + ", ".join(allowed))
            elif arg.name in args:
                self.fail(f"argument '{arg.name}' given twice", prefix(arg.span, len(arg.name)),
                          f"first given at {args[arg.name].span}")
            else:
                args[arg.name] = arg
                self.check_literal(arg)
        keep = args.get("keep_stop")
        if keep is not None:
            self.check_keep_stop(keep, args)
        sampler = args.get("sampler")
        # particles= or ess_threshold= alone asks for particles (runtime/hole_args.py too)
        smc = [args[name] for name in SMC_ARGS if name in args]
        chosen = ("smc" if smc else None) if sampler is None else literal(sampler.expr)
        if chosen in SAMPLERS:
            fault = sampler_fault(chosen, args)
            if fault is not None:
                name, wrong = fault
                where = args[name] if name is not None else sampler or smc[0]
                self.fail(wrong, prefix(where.span, len(where.name)), SAMPLER_HINT)
        return args

    def check_weighed(self, node: ast.Gen | ast.Select, args: dict[str, ast.HoleArg],
                      block: Span) -> None:
        """A hole in a `{% particles %}` block (starting at `block`) takes only what weighing
        allows (weighing_conflict)."""
        kind = "gen" if isinstance(node, ast.Gen) else "select"
        sampler = args.get("sampler")
        chosen = literal(sampler.expr) if sampler is not None else None
        wrong = weighing_conflict(kind, args, chosen if isinstance(chosen, str) else None)
        if wrong is not None:
            arg = args[wrong[0]]
            self.fail(wrong[1], prefix(arg.span, len(arg.name)),
                      f"the particles block starts at {block}")

    def check_keep_stop(self, keep: ast.HoleArg, args: dict[str, ast.HoleArg]) -> None:
        """keep_stop needs a stop string, and a value that need not match a constraint."""
        where = prefix(keep.span, len(keep.name))
        constraint = next((a for a in CONSTRAINT_ARGS if a in args), None)
        if "stop" not in args:
            self.fail("keep_stop without stop=: there is no stop string to keep", where,
                      'give the stop strings: `stop="\\n" keep_stop=true`')
        elif constraint is not None:
            self.fail(f"keep_stop cannot be used with {constraint}=: the value must match the "
                      "constraint, and the stop string would be part of it", where,
                      "write the stop text into the constraint instead (`regex=\"[0-9]+\\n\"`), "
                      "or write it as fixed text after the hole")

    def check_literal(self, arg: ast.HoleArg) -> None:
        """Literal arguments are type-checked now; others when the runtime evaluates them."""
        value = literal(arg.expr)
        check = HOLE_ARG_CHECKS.get(arg.name)
        wanted = None if value is MISSING or check is None else check(value)
        if wanted is not None:
            error = ConstraintError if arg.name in CONSTRAINT_ARGS else TemplateCompileError
            self.errors.append(error(f"{arg.name} must be {wanted}, got {show_value(value)}",
                                     arg.expr.span, self.source))

    def constraint(self, args: dict[str, ast.HoleArg]) -> ir.Constraint | None:
        """The constraint of a gen hole and its engine. A literal pattern, schema or grammar
        is lowered now (qrun/constraint/spec.py, as the runtime would), so its every error
        shows at --check, and its spec is kept in the IR for the runs."""
        given = [args[name] for name in CONSTRAINT_ARGS if name in args]
        closed = args.get("closed")
        schema_hole = any(name in args for name in SCHEMA_ARGS)
        if closed is not None and not schema_hole:
            self.fail("closed= applies to json= and tools= holes only", prefix(closed.span, 6))
        formats = args.get("formats")
        if formats is not None and not schema_hole:
            self.fail("formats= applies to json= and tools= holes only",
                      prefix(formats.span, 7))
        if len(given) > 1:
            later = max(given[:2], key=lambda a: a.span.start)
            self.constraint_error(f"{given[0].name}= and {given[1].name}= cannot both "
                                  "constrain one hole", later.span)
            return None
        if "json" in args:
            schema = args["json"].expr
            flag = literal(closed.expr) if closed is not None else False
            mode = literal(formats.expr) if formats is not None else "assert"
            value = literal(schema)
            spec = None
            if isinstance(flag, bool) and mode in FORMAT_MODES and isinstance(value, dict):
                spec = self.lowered("json", value, schema, JsonFormat(closed=flag, formats=mode))
            return ir.JsonSchema(schema, closed.expr if closed is not None else None,
                                 formats.expr if formats is not None else None, lowered=spec)
        if "tools" in args:
            return self.tool_call(args["tools"].expr, closed, formats)
        if "grammar" in args:
            grammar = args["grammar"].expr
            spec = None
            if isinstance(grammar, ex.Const) and isinstance(grammar.value, str) and \
                    grammar.value.strip():
                spec = self.lowered("grammar", grammar.value, grammar)
            return ir.Grammar(grammar, lowered=spec)
        arg = args.get("regex")
        if arg is None:
            return None
        name = pattern_name(arg)
        if name is not None:
            spec = self.lowered("pattern", name, arg.expr)
            if spec is not None:
                return ir.Regex(ex.Const(spec.pattern, arg.expr.span), name, lowered=spec)
        elif isinstance(arg.expr, ex.Const) and isinstance(arg.expr.value, str):
            return ir.Regex(arg.expr, lowered=self.lowered("regex", arg.expr.value, arg.expr))
        return ir.Regex(arg.expr)

    def tool_call(self, tools: ex.Expr, closed: ast.HoleArg | None,
                  formats: ast.HoleArg | None) -> ir.ToolCall:
        """A tools= hole: a literal list is read and its call schema lowered now
        (qrun/constraint/tools.py), errors pointing at the item at fault."""
        flag = literal(closed.expr) if closed is not None else False
        mode = literal(formats.expr) if formats is not None else "assert"
        value = literal(tools)
        spec = None
        if isinstance(flag, bool) and mode in FORMAT_MODES and isinstance(value, list):
            spec = self.lowered("tools", value, tools, JsonFormat(closed=flag, formats=mode))
        return ir.ToolCall(tools, closed.expr if closed is not None else None,
                           formats.expr if formats is not None else None, lowered=spec)

    def role_tools(self, tools: ex.Expr) -> None:
        """A literal `{% system tools=[...] %}` list is read now (qrun/constraint/tools.py):
        an error points at the item at fault."""
        value = literal(tools)
        if value is MISSING:
            return
        try:
            read_tools(value)
        except ToolsError as error:
            self.constraint_error(str(error), pointed_span(tools, str(error)))

    def lowered(self, kind: str, value: Any, where: ex.Expr,
                fmt: JsonFormat = FIXED) -> ConstraintSpec | None:
        """The spec of a literal constraint, or None after reporting why it has none: at the
        offending character of a regex written without escapes, at the line and column of a
        grammar, else at the whole literal."""
        try:
            return lower(kind, value, fmt)
        except LoweringError as error:
            notes = list(error.notes)
            if error.limit is not None:
                notes.append(f"a literal constraint is checked under the default limits; a run "
                             f"takes a larger one as a value (an input) with run(..., "
                             f"limits=qrun.Limits({error.limit}=...)) (docs/language.md §14.9)")
            self.constraint_error(error.message, self._error_span(error, where), *notes)
            return None

    def _error_span(self, error: LoweringError, where: ex.Expr) -> Span:
        if isinstance(where, ex.ListExpr):  # a tools list: the item the pointer names
            return pointed_span(where, error.message)
        span = where.span
        if not isinstance(where, ex.Const) or not isinstance(where.value, str):
            return span
        if error.offset is not None and self.source.text[
                span.start + 1:span.end - 1] == where.value:  # no escapes: point at the character
            return _shift(span, 1 + error.offset)
        if error.line is not None and error.column is not None:
            return self._grammar_span(where, error.line, error.column)
        return span

    def _grammar_span(self, grammar: ex.Const, line: int, column: int) -> Span:
        """Where character `column` of line `line` of a grammar literal's value is written
        in the template (escapes such as `\\n` decoded as the literal's are)."""
        text = str(grammar.value)
        lines = text.split("\n")
        index = sum(len(ln) + 1 for ln in lines[: line - 1]) + column - 1
        offsets = literal_offsets(self.source.text[grammar.span.start:grammar.span.end])
        if not 0 <= index < len(offsets) or len(offsets) != len(text):
            return grammar.span
        return self.source.span_at(grammar.span.start + offsets[index], 1)

    # ---- front matter ------------------------------------------------------------------------

    def front_matter(self, front: ast.FrontMatter | None, check_name: NameCheck
                     ) -> tuple[RunOptions, ModelOptions, tuple[str, ...] | None]:
        """The run options, the model and the declared inputs (None without an `inputs:`
        line) of the front matter."""
        if front is None:
            return RunOptions(), ModelOptions(), None
        values: dict[str, Any] = {}
        declared: tuple[str, ...] | None = None
        seen: dict[str, Span] = {}
        for entry in front.entries:
            key_span = prefix(entry.span, len(entry.key))
            if entry.key not in FRONT_MATTER_KEYS:
                self.fail(f"unknown front matter key '{entry.key}'", key_span,
                          *suggest(entry.key, FRONT_MATTER_KEYS),
                          "keys: " + ", ".join(FRONT_MATTER_KEYS))
            elif entry.key in seen:
                self.fail(f"front matter key '{entry.key}' given twice", key_span,
                          f"first given at {seen[entry.key]}")
            elif entry.key == "inputs":
                seen[entry.key] = key_span
                declared = self.inputs(entry, check_name)
            elif entry.key == "output":
                seen[entry.key] = key_span
                self.output_schema = read_output(entry, self.report)
                self.output_span = key_span
            elif entry.key == "tests":
                seen[entry.key] = key_span
                self.tests = entry if self.tests_are_cases(entry) else None
            else:
                seen[entry.key] = key_span
                value = self.front_value(entry)
                if value is not MISSING:
                    values[entry.key] = value
        model = {k: values.pop(k) for k in ("model", "device", "dtype") if k in values}
        try:  # each value is checked above; here, those that do not go together
            options = RunOptions(**values)
        except UsageError as exc:  # at the sampler the others contradict, if one is given
            self.fail(f"front matter: {exc}", seen.get("sampler", front.span))
            options = RunOptions()
        return options, ModelOptions(**model), declared

    def tests_are_cases(self, entry: ast.FrontMatterEntry) -> bool:
        """Whether `tests:` is a list of mappings, after reporting where it is not. Only its
        shape: each case's keys and expectations are qrun/testing/cases.py's to check (lang
        sits below it), when `qrun test` reads them."""
        if not isinstance(entry.data, list):
            self.fail("front matter 'tests' must be a list of cases (name, inputs, expect...)",
                      entry.value_span, "docs/testing.md §1")
            return False
        for index, case in enumerate(entry.data):
            if not isinstance(case, dict):
                self.fail("a case in front matter 'tests' is a mapping (name, inputs, "
                          "expect...)", entry.span_of((index,)), "docs/testing.md §1")
                return False
        return True

    def front_value(self, entry: ast.FrontMatterEntry) -> Any:
        # A scalar is typed from its text as the `key: value` lines before YAML were (so
        # `1e-3` is a number and `"0.7"` one too); a list or a mapping is never a setting.
        raw = entry.scalar if entry.scalar is not None else entry.value
        value: Any = raw
        if entry.key in CHECKS:
            value = _scalar(raw) if entry.scalar is not None else entry.data
            wanted = CHECKS[entry.key](value)
        else:
            wanted = MODEL_CHECKS[entry.key](raw) if entry.scalar is not None else "a name"
        if wanted is not None:
            self.fail(f"front matter '{entry.key}' must be {wanted}, got {show_value(value)}",
                      entry.value_span)
            return MISSING
        return value

    def report(self, message: str, span: Span, notes: tuple[str, ...]) -> None:
        self.fail(message, span, *notes)

    def inputs(self, entry: ast.FrontMatterEntry, check_name: NameCheck) -> tuple[str, ...]:
        """`inputs: [a, b]` (names) or `inputs: {name: type}` (lang/declared.py)."""
        data = entry.data
        if isinstance(data, dict):
            items: list[tuple[Any, tuple[str | int, ...]]] = [(k, (k,)) for k in data]
        elif isinstance(data, list):
            items = [(item, (index,)) for index, item in enumerate(data)]
        else:
            self.fail("front matter 'inputs' must be a list such as [question, context], or "
                      "a mapping of names to types such as {question: string}",
                      entry.value_span)
            return ()
        names: list[str] = []
        for name, path in items:
            span = entry.span_of(path, key=isinstance(data, dict))
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                self.fail(f"input '{name}' is not a valid name", span)
            elif name in names:
                self.fail(f"input '{name}' is declared twice", span)
            elif check_name(name, span, "input"):
                if isinstance(data, dict):
                    declared = read_input_type(name, data[name], entry, self.report)
                    if declared is None:
                        continue
                    self.input_types[name] = declared
                names.append(name)
                self.declared_at[name] = span
        return tuple(names)


def pattern_name(arg: ast.HoleArg) -> str | None:
    """`regex=INT`: an UPPERCASE name is a stdlib pattern, never a variable."""
    if arg.name == "regex" and isinstance(arg.expr, ex.Name) and re.fullmatch(
            r"[A-Z][A-Z0-9_]*", arg.expr.name):
        return arg.expr.name
    return None


def pointed_span(node: ex.Expr, message: str) -> Span:
    """The span of the part of a list or dict literal that the JSON pointer at the end of
    `message` (`... (at /1/function/name)`) names, as deep as the literal spells it."""
    found = re.search(r"\(at (/[^)]*)\)$", message)
    for part in (found.group(1).split("/")[1:] if found else []):
        key = part.replace("~1", "/").replace("~0", "~")
        match node:
            case ex.ListExpr(items=items) if key.isdigit() and int(key) < len(items):
                node = items[int(key)]
            case ex.DictExpr(items=pairs):
                inner = next((v for k, v in pairs if literal(k) == key), None)
                if inner is None:
                    break
                node = inner
            case _:
                break
    return node.span


def prefix(span: Span, length: int) -> Span:
    """The first `length` characters of a one-line span."""
    end = min(span.end, span.start + length)
    return Span(span.start, end, span.line, span.column, span.line,
                span.column + end - span.start)


def _shift(span: Span, offset: int) -> Span:
    """One character `offset` characters into a one-line span."""
    offset = min(offset, max(0, span.end - span.start - 1))
    return Span(span.start + offset, span.start + offset + 1, span.line, span.column + offset,
                span.line, span.column + offset + 1)


# ---- literal argument checks: each returns what the value must be, or None when it is fine ----

MISSING: Any = object()
"""What `literal` returns for an expression that needs the runtime."""


def literal(node: ex.Expr) -> Any:
    """The value of a literal expression (constants, signed numbers, lists and dicts of them),
    or MISSING when `node` needs the runtime."""
    match node:
        case ex.Const(value=value):
            return value
        case ex.Unary(op="-" | "+", operand=ex.Const(value=value)) if is_number(value):
            return -value if node.op == "-" else value
        case ex.ListExpr(items=items):
            values = [literal(item) for item in items]
            return MISSING if any(v is MISSING for v in values) else values
        case ex.DictExpr(items=pairs):
            keys = [literal(k) for k, _ in pairs]
            if not all(isinstance(k, (str, int, float, bool)) for k in keys):
                return MISSING
            values = [literal(v) for _, v in pairs]
            if any(v is MISSING for v in values):
                return MISSING
            return dict(zip(keys, values, strict=True))
    return MISSING


def _want_stop(value: Any) -> str | None:
    items = value if isinstance(value, list | tuple) else [value]
    if items and all(isinstance(s, str) and s for s in items):
        return None
    return "a non-empty string or a non-empty list of them"


def _want_options(value: Any) -> str | None:
    if not (isinstance(value, list | tuple) and value
            and all(isinstance(s, str) and s for s in value)):
        return "a non-empty list of non-empty strings"
    return want_distinct(value)


def want_distinct(options: Iterable[str]) -> str | None:
    """What a select's options must be when one repeats (the first in sorted order), or None:
    the compile-time check of a literal list and the runtime's of any other."""
    counts = Counter(options)  # one pass: 50,000 options compile in milliseconds
    duplicates = sorted(s for s, n in counts.items() if n > 1)
    return None if not duplicates else f"distinct strings ({show_value(duplicates[0])} repeats)"


HOLE_ARG_CHECKS: Mapping[str, Callable[[Any], str | None]] = {
    **CHECKS,
    "stop": _want_stop,
    "heal": lambda v: None if isinstance(v, bool) else "true or false",
    "keep_stop": lambda v: None if isinstance(v, bool) else "true or false",
    "ends_at_text": lambda v: None if isinstance(v, bool) else "true or false",
    "normalize": lambda v: None if v in ("sum", "mean") else '"sum" or "mean"',
    "options": _want_options,
    "json": lambda v: None if isinstance(v, dict) else "a JSON Schema (a dict or a variable)",
    "closed": lambda v: _format_wants(closed=v),
    "formats": lambda v: _format_wants(formats=v),
    "tools": lambda v: None if isinstance(v, list) else
    "a list of tools (a list or a variable)",
    "grammar": lambda v: None if isinstance(v, str) and v.strip() else
    "a Lark grammar (a non-empty string or a variable)",
    "regex": lambda v: None if isinstance(v, str) else "a string or a pattern name such as INT",
    "n": lambda v: None if is_count(v) else "a positive integer",
}
"""Per hole argument: what its value must be (for the message), or None when it is fine. The
compiler checks literal arguments with it (ArgChecker.check_literal), the runtime every value it
evaluates (runtime/hole_args.py), so both say the same; the run options' own checks
(qrun/options.py CHECKS) are among them."""


def count_problem(value: Any) -> str | None:
    """Why `value` cannot be a `{% particles %}` block's count, or None: it is held to what a
    hole's particles= is held to (the compiler checks a literal count, runtime/particle_block.py
    a computed one)."""
    wanted = HOLE_ARG_CHECKS["particles"](value)
    if wanted is None:
        return None
    got = "" if isinstance(value, list | tuple | dict) else f", got {value!r}"
    return f"the number of particles must be {wanted}{got} ({type_name(value)})"


def _format_wants(**option: Any) -> str | None:
    """What a JSON format option must be, from its one check (JsonFormat.checked, which the
    runtime and qrun.Matcher use too), or None when it is fine."""
    try:
        JsonFormat.checked(**option)
    except JsonFormatError as error:
        return error.wanted
    return None


def is_count(value: Any) -> bool:
    """Whether `value` is a positive int (not a bool): a number of branches (`gen n=`)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _scalar(text: str) -> Any:
    """A front matter number (or the text itself when it is not one)."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def show_value(value: Any) -> str:
    """A value as an error message shows it: strings quoted, anything long cut short."""
    text = f'"{value}"' if isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
