"""Stage 2: lark.Tree -> ast.Template. Shape only: pairs block tags with a stack (reporting
unclosed and mismatched blocks at their opening tag), applies the whitespace rules (trim and
lstrip around block tags and comments, `-` control) and raw, and
turns expression subtrees into lang/expr.py nodes. Lark types stop here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lark import Token, Tree

from qrun.errors import TemplateError, TemplateErrors, TemplateSyntaxError
from qrun.lang import ast
from qrun.lang import expr as ex
from qrun.lang.front_matter import read_front_matter
from qrun.lang.text import surrogate_in
from qrun.source import Source, Span

Item = Token | Tree[Token]

_RAW = re.compile(
    r"\{%(-?)[ \t\r\n]*raw[ \t\r\n]*(-?)%\}([\s\S]*?)\{%(-?)[ \t\r\n]*endraw[ \t\r\n]*(-?)%\}")
_CLOSERS = {"if": "endif", "for": "endfor", "while": "endwhile", "try": "endtry",
            "macro": "endmacro", "fork": "endfork", "hidden": "endhidden",
            "fresh": "endfresh", "particles": "endparticles", "system": "endsystem",
            "user": "enduser", "assistant": "endassistant"}
# The block tags that open a block, and the kind of block each opens (a role's is its name).
_OPENERS = {"if_tag": "if", "for_tag": "for", "while_tag": "while", "try_tag": "try",
            "macro_tag": "macro", "fork_tag": "fork", "hidden_tag": "hidden",
            "fresh_tag": "fresh", "particles_tag": "particles"}
_ENDERS = {"endif_tag": "if", "endfor_tag": "for", "endwhile_tag": "while", "endtry_tag": "try",
           "endmacro_tag": "macro", "endfork_tag": "fork", "endhidden_tag": "hidden",
           "endfresh_tag": "fresh", "endparticles_tag": "particles"}
MAX_BLOCK_DEPTH = 100
"""Blocks nest at most this deep: the compiler and runtime walk the tree recursively."""
MAX_ERRORS = 50
"""Stop after this many errors (each renders a source excerpt; a hostile template could
otherwise ask for millions)."""


def build_ast(tree: Tree[Token], source: Source) -> ast.Template:
    """Turn the parse tree of `source` into an ast.Template.

    Raises:
        TemplateErrors: every shape error found (unclosed/mismatched blocks, stray else/elif,
            bad escapes, malformed front matter), in source order.
    """
    builder = _Builder(source)
    try:
        template = builder.template(tree)
    except TemplateSyntaxError as err:  # nesting too deep: stop at once
        raise TemplateErrors([*builder.errors, err]) from None
    if builder.errors:
        raise TemplateErrors(builder.errors[:MAX_ERRORS])
    return template


@dataclass
class _Frame:
    """An open block while its end tag is being looked for."""

    kind: str  # "if", "for", "while", "try", "macro", "fork", "particles", "hidden", "fresh",
    # or a role
    span: Span
    targets: tuple[tuple[str, Span], ...] = ()  # a for loop's (or fork's) variables
    # a for loop's (or fork's) iterable, a while loop's test, a particles block's count
    iterable: ex.Expr | None = None
    args: tuple[ast.HoleArg, ...] = ()  # a role's arguments
    name: str | None = None  # a macro's name, the name `{% except NAME %}` binds
    name_span: Span | None = None
    params: tuple[ast.MacroParam, ...] = ()
    body: list[ast.Node] = field(default_factory=list)
    arms: list[ast.IfArm] = field(default_factory=list)
    orelse: list[ast.Node] | None = None
    else_span: Span | None = None

    @property
    def opener(self) -> str:
        return f"'{{% {self.kind} %}}'"

    @property
    def closer(self) -> str:
        return f"'{{% {_CLOSERS[self.kind]} %}}'"


class _Builder:
    """One use per template: collects errors instead of stopping at the first."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.errors: list[TemplateError] = []
        self.exprs = ExprBuilder(source, self.errors)
        self.stack: list[_Frame] = [_Frame("top", self.span(0, 0))]

    def span(self, start: int, end: int) -> Span:
        return self.source.span_at(start, end - start)

    def fail(self, message: str, span: Span, notes: tuple[str, ...] = ()) -> None:
        self.errors.append(TemplateSyntaxError(message, span, self.source, notes))

    # ---- top level ---------------------------------------------------------------------------

    def template(self, tree: Tree[Token]) -> ast.Template:
        items: list[Item] = list(tree.children)
        front = None
        first = items[0] if items else None
        if isinstance(first, Token) and first.type == "FRONT_MATTER":
            front = self.front_matter(first)
            items.pop(0)
        for index, item in enumerate(items):
            if len(self.errors) >= MAX_ERRORS:
                return ast.Template(front, (), self.span(0, len(self.source.text)))
            before = items[index - 1] if index > 0 else None
            after = items[index + 1] if index + 1 < len(items) else None
            self.item(item, before, after)
        while len(self.stack) > 1:
            frame = self.stack[-1]
            line, column = frame.span.line, frame.span.column
            self.fail(f"{frame.opener} at {line}:{column} is never closed "
                      f"(expected {frame.closer})", frame.span)
            self.close(frame)
        return ast.Template(front, tuple(self.stack[0].body),
                            self.span(0, len(self.source.text)))

    def item(self, item: Item, before: Item | None, after: Item | None) -> None:
        """One top-level item; its neighbours decide how much of a text item's whitespace goes."""
        if isinstance(item, Token):
            if item.type == "TEXT":
                start = item.start_pos or 0
                self.text(*self.trim(start, start + len(item.value), before, after))
            elif item.type == "RAW":
                self.raw(item)
            return  # COMMENT: produces nothing
        if item.data == "var_tag":
            self.var_tag(item)
        else:
            self.block_tag(item)

    def trim(self, start: int, end: int, before: Item | None, after: Item | None
             ) -> tuple[int, int]:
        """The part of text [start, end) that whitespace control keeps (Jinja's rules with
        `trim_blocks` and `lstrip_blocks` on):
        - after a tag closed with `-` (`-}}`, `-%}`, `-#}`): all leading whitespace goes;
        - else after a block tag, comment or raw block: its first newline ("\n" or "\r\n");
        - before a tag opened with `-` (`{{-`, `{%-`, `{#-`): all trailing whitespace goes;
        - else before a block tag, comment or raw block that only spaces and tabs precede on its
          line: those spaces and tabs (the indentation of the tag).
        `{{ ... }}` tags without `-` never remove whitespace."""
        text = self.source.text
        value = text[start:end]
        kept_start, kept_end = start, end
        if before is not None and _strips_right(before):
            kept_start = end - len(value.lstrip())
        elif before is not None and _is_block(before):
            kept_start += 2 if value.startswith("\r\n") else 1 if value.startswith("\n") else 0
        if after is not None and _strips_left(after):
            kept_end = kept_start + len(text[kept_start:end].rstrip())
        elif after is not None and _is_block(after):
            line_start = value.rfind("\n") + 1
            at_line_start = line_start > 0 or start == 0 or text[start - 1] == "\n"
            if at_line_start and not value[line_start:].strip(" \t"):
                kept_end = max(kept_start, start + line_start)
        return kept_start, kept_end

    def text(self, start: int, end: int, raw: bool = False) -> None:
        if start < end:
            text = self.source.text[start:end]
            self.stack[-1].body.append(ast.Text(text, self.span(start, end), raw))

    def raw(self, token: Token) -> None:
        """A raw block's contents, verbatim: only `-` inside its own tags strips them."""
        start = token.start_pos or 0
        match = _RAW.fullmatch(token.value)
        if match is None:  # the RAW terminal guarantees the shape; keep the text regardless
            self.text(start, start + len(token.value), raw=True)
            return
        begin, end = start + match.start(3), start + match.end(3)
        contents = match.group(3)
        if match.group(2):  # {% raw -%}
            begin = end - len(contents.lstrip())
        if match.group(4):  # {%- endraw %}
            end = begin + len(self.source.text[begin:end].rstrip())
        self.text(begin, end, raw=True)

    # ---- {{ ... }} ---------------------------------------------------------------------------

    def var_tag(self, tree: Tree[Token]) -> None:
        body, close = tree.children[1], tree.children[2]
        assert isinstance(body, Tree) and isinstance(close, Tree)
        self.check_close(close)
        span = self.tree_span(tree)
        if body.data == "interp":
            self.add(ast.Interp(self.exprs.expr(body.children[0]), span))
            return
        name = body.children[0]
        assert isinstance(name, Token)
        args = tuple(self.hole_arg(arg) for arg in body.children[1:] if isinstance(arg, Tree))
        hole = ast.Gen if body.data == "gen_hole" else ast.Select
        self.add(hole(str(name), args, span, self.token_span(name)))

    def hole_arg(self, tree: Tree[Token]) -> ast.HoleArg:
        name, value = tree.children
        assert isinstance(name, Token)
        return ast.HoleArg(str(name), self.exprs.expr(value), self.tree_span(tree))

    def check_close(self, close: Tree[Token]) -> None:
        """A tag ends with two adjacent `}`: the grammar lexes them singly (see grammar.lark)."""
        tokens = [t for t in close.children if isinstance(t, Token)]
        if len(tokens) == 2 and tokens[0].end_pos != tokens[1].start_pos:
            self.fail("expected '}}' to close the tag", self.token_span(tokens[0]),
                      ("'} }' with a space in between does not close a tag",))

    # ---- {% ... %} ---------------------------------------------------------------------------

    def block_tag(self, tree: Tree[Token]) -> None:
        body = tree.children[1]
        assert isinstance(body, Tree)
        span = self.tree_span(tree)
        kind = body.data
        if kind == "set_tag":
            name, value = body.children
            assert isinstance(name, Token)
            self.add(ast.Set(str(name), self.exprs.expr(value), span, self.token_span(name)))
        elif kind in _OPENERS or kind == "role_tag":
            self.open(body, span)
        elif kind in ("elif_tag", "else_tag"):
            self.branch(body, span)
        elif kind == "except_tag":
            self.except_(body, span)
        elif kind == "return_tag":
            self.add(ast.Return(self.exprs.expr(body.children[0]), span))
        elif kind == "break_tag":
            self.add(ast.Break(span))
        elif kind == "continue_tag":
            self.add(ast.Continue(span))
        elif kind == "include_tag":
            self.add(ast.Include(self.exprs.expr(body.children[0]), span))
        else:
            self.end(_end_kind(body), span)

    def open(self, body: Tree[Token], span: Span) -> None:
        kind = _OPENERS.get(str(body.data))
        if kind is None:
            kind = str(body.children[0])
        if len(self.stack) == MAX_BLOCK_DEPTH + 1:  # the first block too deep, not each after it
            self.fail(f"blocks are nested too deeply (more than {MAX_BLOCK_DEPTH})", span)
        frame = _Frame(kind, span)
        if kind == "if":
            frame.arms.append(ast.IfArm(self.exprs.expr(body.children[0]), (), span))
        elif kind in ("for", "fork"):
            *targets, iterable = body.children
            frame.targets = tuple((str(t), self.token_span(t)) for t in targets
                                  if isinstance(t, Token))
            frame.iterable = self.exprs.expr(iterable)
        elif kind in ("while", "particles"):
            frame.iterable = self.exprs.expr(body.children[0])
        elif kind == "macro":
            name, *params = body.children
            assert isinstance(name, Token)
            frame.name, frame.name_span = str(name), self.token_span(name)
            frame.params = tuple(self.macro_param(p) for p in params if isinstance(p, Tree))
        else:
            frame.args = tuple(self.hole_arg(arg) for arg in body.children[1:]
                               if isinstance(arg, Tree))
        self.stack.append(frame)

    def macro_param(self, tree: Tree[Token]) -> ast.MacroParam:
        name, default = tree.children
        assert isinstance(name, Token)
        value = self.exprs.expr(default) if default is not None else None
        return ast.MacroParam(str(name), value, self.tree_span(tree))

    def except_(self, body: Tree[Token], span: Span) -> None:
        """`{% except %}` or `{% except NAME %}`: the handler of the innermost `try`."""
        frame = self.stack[-1]
        if frame.kind != "try":
            notes: tuple[str, ...] = () if len(self.stack) == 1 else (
                f"the innermost open block is {frame.opener} at {frame.span}",)
            self.fail("'{% except %}' outside of a '{% try %}' block", span, notes)
            return
        if frame.orelse is not None:
            self.fail("a '{% try %}' block has one '{% except %}'", span,
                      (f"the first is at {frame.else_span}",))
            return
        name = body.children[0] if body.children else None
        if isinstance(name, Token):
            frame.name, frame.name_span = str(name), self.token_span(name)
        frame.orelse, frame.else_span = frame.body, span
        frame.body = []

    def branch(self, body: Tree[Token], span: Span) -> None:
        frame = self.stack[-1]
        word = "elif" if body.data == "elif_tag" else "else"
        if frame.kind != "if":
            notes: tuple[str, ...] = () if len(self.stack) == 1 else (
                f"the innermost open block is {frame.opener} at {frame.span}",)
            if frame.kind == "for" and word == "else":
                notes += ("a loop has no '{% else %}' in qrun: test `{% if not items %}` "
                          "before or after it",)
            self.fail(f"'{{% {word} %}}' outside of an '{{% if %}}' block", span, notes)
            return
        if frame.orelse is not None:
            self.fail(f"'{{% {word} %}}' after '{{% else %}}'", span,
                      (f"the '{{% else %}}' is at {frame.else_span}",))
            return
        self.finish_arm(frame)
        if word == "elif":
            frame.arms.append(ast.IfArm(self.exprs.expr(body.children[0]), (), span))
        else:
            frame.orelse, frame.else_span = [], span

    def end(self, kind: str, span: Span) -> None:
        tag = f"'{{% {_CLOSERS[kind]} %}}'"
        if not any(frame.kind == kind for frame in self.stack[1:]):
            notes = () if len(self.stack) == 1 else (
                f"the innermost open block is {self.stack[-1].opener} at "
                f"{self.stack[-1].span} (expected {self.stack[-1].closer})",)
            self.fail(f"{tag} without a matching '{{% {kind} %}}'", span, notes)
            return
        while self.stack[-1].kind != kind:
            frame = self.stack[-1]
            self.fail(f"{frame.opener} at {frame.span} is never closed (expected "
                      f"{frame.closer} before {tag} at {span})", frame.span)
            self.close(frame)
        self.close(self.stack[-1])

    def finish_arm(self, frame: _Frame) -> None:
        if frame.orelse is None:
            arm = frame.arms[-1]
            frame.arms[-1] = ast.IfArm(arm.test, tuple(frame.body), arm.span)
            frame.body = []
        else:
            frame.orelse = frame.body
            frame.body = []

    def close(self, frame: _Frame) -> None:
        """Pop `frame` and add its finished node to the enclosing body."""
        self.stack.pop()
        node: ast.Node
        if frame.kind == "if":
            self.finish_arm(frame)
            orelse = tuple(frame.orelse) if frame.orelse is not None else None
            node = ast.If(tuple(frame.arms), orelse, frame.span, frame.else_span)
        elif frame.kind in ("for", "fork"):
            assert frame.targets and frame.iterable is not None
            loop = ast.For if frame.kind == "for" else ast.Fork
            node = loop(tuple(n for n, _ in frame.targets), frame.iterable,
                        tuple(frame.body), frame.span, tuple(s for _, s in frame.targets))
        elif frame.kind == "while":
            assert frame.iterable is not None
            node = ast.While(frame.iterable, tuple(frame.body), frame.span)
        elif frame.kind == "try":
            # `orelse` holds the body before `{% except %}`, `body` the handler after it.
            if frame.orelse is None:
                node = ast.Try(tuple(frame.body), None, None, frame.span)
            else:
                node = ast.Try(tuple(frame.orelse), frame.name, tuple(frame.body), frame.span,
                               frame.else_span)
        elif frame.kind == "macro":
            assert frame.name is not None and frame.name_span is not None
            node = ast.Macro(frame.name, frame.params, tuple(frame.body), frame.span,
                             frame.name_span)
        elif frame.kind == "particles":
            assert frame.iterable is not None
            node = ast.Particles(frame.iterable, tuple(frame.body), frame.span)
        elif frame.kind == "hidden":
            node = ast.Hidden(tuple(frame.body), frame.span)
        elif frame.kind == "fresh":
            node = ast.Fresh(tuple(frame.body), frame.span)
        else:
            node = ast.Role(frame.kind, tuple(frame.body), frame.span, frame.args)
        self.add(node)

    def add(self, node: ast.Node) -> None:
        self.stack[-1].body.append(node)

    # ---- front matter and spans --------------------------------------------------------------

    def front_matter(self, token: Token) -> ast.FrontMatter:
        return read_front_matter(token.value, token.start_pos or 0, self.source,
                                 lambda message, span, notes: self.fail(message, span, notes))

    def tree_span(self, tree: Tree[Token]) -> Span:
        meta = tree.meta
        if meta.empty:
            return self.span(0, 0)
        return self.span(meta.start_pos, meta.end_pos)

    def token_span(self, token: Token) -> Span:
        start = token.start_pos or 0
        return self.span(start, start + len(token.value))


def _end_kind(body: Tree[Token]) -> str:
    kind = _ENDERS.get(str(body.data))
    if kind is not None:
        return kind
    return str(body.children[0])[3:]  # "enduser" -> "user"


def _is_block(item: Item) -> bool:
    """Whether `item` is a `{% ... %}` tag, a comment or a raw block (whose tags are block
    tags): the items whose neighbouring whitespace the trim rules remove."""
    if isinstance(item, Token):
        return item.type in ("COMMENT", "RAW")
    return item.data == "block_tag"


def _strips_left(item: Item) -> bool:
    """Whether `item` opens with `-` (`{{-`, `{%-`, `{#-`): strip the text before it."""
    if isinstance(item, Token):
        return item.type in ("COMMENT", "RAW") and item.value[2:3] == "-"
    opener = item.children[0]
    return isinstance(opener, Token) and opener.value.endswith("-")


def _strips_right(item: Item) -> bool:
    """Whether `item` closes with `-` (`-}}`, `-%}`, `-#}`): strip the text after it."""
    if isinstance(item, Token):
        return item.type in ("COMMENT", "RAW") and item.value[-3:-2] == "-"
    closer = item.children[-1]
    if isinstance(closer, Tree):  # var_close
        closer = closer.children[0]
    return isinstance(closer, Token) and closer.value.startswith("-")


# ---- expressions ---------------------------------------------------------------------------------

MAX_EXPR_DEPTH = 100
"""Expressions nest at most this deep: checking and evaluating them is recursive."""
_ESCAPE = re.compile(r"\\(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|([\s\S]))")
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "0": "\0",
                   "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
_MAX_INT_DIGITS = 4000  # below Python's int/str conversion limit (4300)


def literal_offsets(text: str) -> list[int]:
    """For a quoted string literal as written (quotes included), the offset in `text` of each
    character of its value, escapes decoded as ExprBuilder.string decodes them (an unknown
    escape such as `\\d` stays two characters). Used to point into a literal's value."""
    body = text[1:-1]
    out: list[int] = []
    pos = 0
    for match in _ESCAPE.finditer(body):
        out.extend(range(pos + 1, match.start() + 1))
        kept = match.group(4) is not None and match.group(4) not in _SIMPLE_ESCAPES
        out.extend([match.start() + 1, match.start() + 2] if kept else [match.start() + 1])
        pos = match.end()
    out.extend(range(pos + 1, len(body) + 1))
    return out


class ExprBuilder:
    """Turns expression subtrees into lang/expr.py nodes; shape errors go to `errors`."""

    def __init__(self, source: Source, errors: list[TemplateError]) -> None:
        self.source = source
        self.errors = errors

    def span(self, start: int, end: int) -> Span:
        return self.source.span_at(start, end - start)

    def expr(self, node: Item | None, depth: int = 0) -> ex.Expr:
        """Raises TemplateSyntaxError (at once) when the expression nests too deeply."""
        if not isinstance(node, Tree):
            raise TemplateSyntaxError("expected an expression", self.span(0, 0),
                                      self.source)
        span = self.span(node.meta.start_pos, node.meta.end_pos)
        if depth > MAX_EXPR_DEPTH:
            raise TemplateSyntaxError(
                f"expression nested too deeply (more than {MAX_EXPR_DEPTH} levels)", span,
                self.source)
        data, kids = str(node.data), node.children
        if data in _LEAVES:
            return self.leaf(data, kids, span)
        if data in ("sum", "term", "concat"):
            return self.fold(kids, depth + 1)
        if data in ("call", "filter", "slice", "dict", "attr", "method", "test", "test_not"):
            return self.special(data, kids, span, depth + 1)
        sub = [self.expr(k, depth + 1) for k in kids if isinstance(k, Tree) and k.data
               not in ("comp_op", "unary_op")]
        return self.compound(data, kids, sub, span)

    def leaf(self, data: str, kids: list[Item], span: Span) -> ex.Expr:
        if data in _CONSTANTS:
            return ex.Const(_CONSTANTS[data], span)
        token = kids[0]
        assert isinstance(token, Token)
        if data == "name":
            return ex.Name(str(token), span)
        if data == "number":
            return ex.Const(self.number(token.value, span), span)
        if data == "string_list":
            start = token.start_pos or 0
            items = []
            for match in _STRING_ITEM.finditer(token.value):
                item_span = self.span(start + match.start(), start + match.end())
                items.append(ex.Const(self.string(match.group(0), item_span), item_span))
            return ex.ListExpr(tuple(items), span)
        return ex.Const(self.string(token.value, span), span)

    def compound(self, data: str, kids: list[Item], sub: list[ex.Expr], span: Span) -> ex.Expr:
        if data == "cond":
            return ex.Cond(sub[0], sub[1], sub[2], span)
        if data == "cond_no_else":  # Jinja renders the missing branch as the empty string
            return ex.Cond(sub[0], sub[1], ex.Const("", span), span)
        if data in ("or_test", "and_test"):
            return ex.BoolOp("or" if data == "or_test" else "and", tuple(sub), span)
        if data == "not_op":
            return ex.Unary("not", sub[0], span)
        if data == "comparison":
            ops = tuple(_op_text(k) for k in kids[1::2])
            return ex.Compare(sub[0], ops, tuple(sub[1:]), span)
        if data == "unary":
            return ex.Unary(_op_text(kids[0]), sub[0], span)
        if data == "pow":
            return ex.Binary("**", sub[0], sub[1], span)
        if data == "list":
            return ex.ListExpr(tuple(sub), span)
        if data == "index":
            return ex.Index(sub[0], sub[1], span)
        raise TemplateSyntaxError(f"unsupported expression ({data})", span, self.source)

    def special(self, data: str, kids: list[Item], span: Span, depth: int) -> ex.Expr:
        """Nodes with non-expression children: names, argument lists, slice parts, pairs."""
        if data == "call":
            args, kwargs = self.call_args(kids[1], span, depth)
            return ex.Call(str(kids[0]), args, kwargs, span)
        if data == "dict":
            pairs = [k for k in kids if isinstance(k, Tree)]
            items = tuple((self.expr(p.children[0], depth), self.expr(p.children[1], depth))
                          for p in pairs)
            return ex.DictExpr(items, span)
        obj = self.expr(kids[0], depth)
        if data == "attr":
            return ex.Attr(obj, str(kids[1]), span)
        if data == "filter":
            args, kwargs = self.call_args(kids[2], span, depth)
            return ex.Filter(obj, str(kids[1]), args, kwargs, span)
        if data == "method":
            args, kwargs = self.call_args(kids[2], span, depth)
            return ex.Method(obj, str(kids[1]), args, kwargs, span)
        if data in ("test", "test_not"):
            args, kwargs = self.call_args(kids[2], span, depth)
            args += tuple(value for _, value in kwargs)  # refused with the test's name
            return ex.Test(obj, _test_name(kids[1]), args, data == "test_not", span)
        parts = [self.slice_part(k, depth) for k in kids[1:]]
        return ex.Slice(obj, parts[0], parts[1], parts[2] if len(parts) > 2 else None, span)

    def slice_part(self, part: Item | None, depth: int) -> ex.Expr | None:
        if isinstance(part, Tree) and part.children:
            return self.expr(part.children[0], depth)
        return None

    def call_args(self, node: Item | None, span: Span, depth: int
                  ) -> tuple[tuple[ex.Expr, ...], tuple[tuple[str, ex.Expr], ...]]:
        args: list[ex.Expr] = []
        kwargs: list[tuple[str, ex.Expr]] = []
        children = node.children if isinstance(node, Tree) else []
        for arg in children:
            if isinstance(arg, Tree) and arg.data == "kwarg":
                kwargs.append((str(arg.children[0]), self.expr(arg.children[1], depth)))
            elif arg is not None:
                if kwargs:
                    self.errors.append(TemplateSyntaxError(
                        "positional argument after keyword argument", span, self.source))
                args.append(self.expr(arg, depth))
        return tuple(args), tuple(kwargs)

    def fold(self, kids: list[Item], depth: int) -> ex.Expr:
        """`a + b - c` -> Binary(-, Binary(+, a, b), c): left-associative, as in Python."""
        left = self.expr(kids[0], depth)
        for level, (op, operand) in enumerate(zip(kids[1::2], kids[2::2], strict=True)):
            right = self.expr(operand, depth)
            if depth + level > MAX_EXPR_DEPTH:  # each operator nests the chain one level
                raise TemplateSyntaxError(
                    f"expression nested too deeply (more than {MAX_EXPR_DEPTH} levels)",
                    self.span(left.span.start, right.span.end), self.source)
            span = self.span(left.span.start, right.span.end)
            left = ex.Binary(_op_text(op), left, right, span)
        return left

    def number(self, text: str, span: Span) -> int | float:
        if text.isdigit():
            if len(text) > _MAX_INT_DIGITS:
                self.errors.append(TemplateSyntaxError(
                    f"integer literal too long ({len(text)} digits)", span, self.source))
                return 0
            return int(text)
        return float(text)

    def string(self, text: str, span: Span) -> str:
        """Decode a quoted literal: Python escapes; unknown ones (`\\d`) are kept as written.
        A lone surrogate (`\\ud800`) is an error here, so `--check` finds it."""

        def replace(match: re.Match[str]) -> str:
            code = match.group(1) or match.group(2) or match.group(3)
            if code is not None:
                if int(code, 16) > 0x10FFFF:
                    self.errors.append(TemplateSyntaxError(
                        f"invalid escape '{match.group(0)}' in string", span, self.source))
                    return ""
                return chr(int(code, 16))
            return _SIMPLE_ESCAPES.get(match.group(4), match.group(0))

        value = _ESCAPE.sub(replace, text[1:-1])
        if surrogate_in(value) is None:
            return value
        # A pair written as two escapes ("\ud83d\ude00", as JSON writes it) is one character.
        value = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
        lone = surrogate_in(value)
        if lone is not None:
            self.errors.append(TemplateSyntaxError(
                f"the string contains a lone surrogate {lone}, which is not valid Unicode "
                "text", span, self.source,
                ("surrogates exist only in pairs (\\ud83d\\ude00); write the character "
                 "itself or its \\U escape",)))
        return value


_LEAVES = frozenset({"name", "number", "string", "string_list", "true", "false", "none"})
# One string literal inside a STRING_LIST token (grammar.lark).
_STRING_ITEM = re.compile(r'"(?:[^"\\\n]|\\[^\n])*"|' + r"'(?:[^'\\\n]|\\[^\n])*'")
_CONSTANTS: dict[str, bool | None] = {"true": True, "false": False, "none": None}


def _test_name(node: Item | None) -> str:
    """`is none`, `is true` and `is false` come as keyword trees, other tests as names."""
    if isinstance(node, Tree):
        return str(node.data).removesuffix("_test")
    return str(node)


def _op_text(node: Item) -> str:
    if isinstance(node, Token):
        return str(node)
    return " ".join(str(t) for t in node.children)
