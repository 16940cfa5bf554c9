"""Part of stage 3 (compile_template): what the compiler knows at one point of a template. Flow
is what holds along every path that reaches it (bound, captured and set names, whether any path
does); Context is lexical (loop variables, the role, the names a test guarantees, where a
loop's break/continue tags lead); guards() reads those guarantees off a test (`x is
defined`, docs/language.md §5)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from qrun.lang import ast
from qrun.lang import expr as ex
from qrun.source import Span


@dataclass
class Flow:
    """What is known at one point of the template, along every path that reaches it."""

    bound: set[str] = field(default_factory=set)  # captured or set on every path
    captured: dict[str, Span] = field(default_factory=dict)  # captured on some path
    sets: dict[str, Span] = field(default_factory=dict)  # set on some path
    dead: bool = False  # after a break or continue: no path reaches here

    def copy(self) -> Flow:
        return Flow(set(self.bound), dict(self.captured), dict(self.sets), self.dead)

    def merge(self, branches: list[Flow]) -> None:
        """Join point after if/elif/else: bound on every branch that reaches it, captured/set
        on any."""
        live = [b for b in branches if not b.dead]
        if live:
            self.bound = set.intersection(*(b.bound for b in live))
        self.dead = not live
        for branch in branches:
            self.captured.update(branch.captured)
            self.sets.update(branch.sets)


@dataclass(frozen=True)
class Context:
    """The lexical context: loop variables, whether inside a loop, the enclosing role, the
    names a test such as `x is defined` guarantees here (`defined`), the flows at the
    innermost loop's break/continue tags (`exits`: None where neither is allowed), and the
    macro being defined (`macro`); the fork tag whose branch this is, when no loop inside the
    branch is nearer (`fork`), and whatever is nearer (`branch`); the particles block around
    (`particles`)."""

    locals: frozenset[str] = frozenset()
    in_loop: bool = False
    role: ast.Role | None = None
    defined: frozenset[str] = frozenset()
    exits: list[Flow] | None = None
    macro: str | None = None  # the macro whose body this is (where `return` is allowed)
    fork: Span | None = None  # the innermost `{% fork %}` whose body this is (not a loop's)
    branch: Span | None = None  # the innermost `{% fork %}` around, loops inside it included
    particles: Span | None = None  # the `{% particles %}` block around, loops inside included

    def knowing(self, names: frozenset[str]) -> Context:
        return replace(self, defined=self.defined | names) if names - self.defined else self


def guards(test: ex.Expr) -> tuple[frozenset[str], frozenset[str]]:
    """The names `test` guarantees defined when it is true, and when it is false: `x is
    defined` (and `is undefined`, `not`, `and`, `or` over such tests)."""
    none = frozenset[str]()
    match test:
        case ex.Test(value=ex.Name(name=name) | ex.Attr(obj=ex.Name(name="holes"), attr=name),
                     name="defined" | "undefined" as which, negated=negated):
            # `holes.x is defined` holds where `x is defined` does (docs/language.md §7.6)
            defined = frozenset({name})
            return (defined, none) if (which == "defined") != negated else (none, defined)
        case ex.Unary(op="not", operand=operand):
            when_true, when_false = guards(operand)
            return when_false, when_true
        case ex.BoolOp(op=op, values=values):
            pairs = [guards(value) for value in values]
            trues, falses = [p[0] for p in pairs], [p[1] for p in pairs]
            if op == "and":
                return frozenset().union(*trues), frozenset.intersection(*falses)
            return frozenset.intersection(*trues), frozenset().union(*falses)
    return none, none
