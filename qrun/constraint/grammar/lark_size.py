"""How large a user's Lark grammar may be (docs/language.md §7.5, the limits in limits.py),
checked before llguidance
sees it: llguidance compiles rules recursively, and a chain of some 3,000 rules (`r0: r1`,
`r1: r2`, ...) overflowed its stack and killed the process with SIGSEGV; a megabyte of
alternatives compiled for seconds and then stopped mid-sampling on its parser's row limit.
The scan reads rule and terminal definitions line by line (strings, regexes and comments left
out), so it costs a few milliseconds for a grammar at the limit."""

from __future__ import annotations

import re

from qrun.constraint.grammar.limits import DEFAULT, ConstraintLimits

MAX_GRAMMAR_CHARS = DEFAULT.grammar_chars
"""The default limits (ConstraintLimits.grammar_chars and grammar_depth)."""
MAX_RULE_DEPTH = DEFAULT.grammar_depth

_DEFINITION = re.compile(r"^[ \t]*[?!]?([A-Za-z_][A-Za-z0-9_]*)(?:\{[^}]*\})?(?:\.-?\d+)?"
                         r"[ \t]*:(?!:)")
_LITERALS = re.compile(r'"(?:[^"\\\n]|\\.)*"i?|/(?:[^/\\\n]|\\.)+/[imslux]*|//[^\n]*')
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def grammar_size_error(text: str, limits: ConstraintLimits = DEFAULT
                       ) -> tuple[str, int | None, str] | None:
    """Why `text` is too large for qrun to hand to llguidance, with the 1-based line it
    concerns (None: the whole text) and the limit's name, or None when it is within the
    limits."""
    if len(text) > limits.grammar_chars:
        return (f"the grammar has {len(text):,} characters, more than the "
                f"{limits.grammar_chars:,} qrun accepts", None, "grammar_chars")
    refs, lines = _references(text)
    depth, top = _deepest(refs)
    if depth > limits.grammar_depth:
        return (f"rule '{top}' begins a chain of {depth:,} rules that each use the next, more "
                f"than the {limits.grammar_depth:,} qrun accepts (a deeper chain can crash "
                "llguidance's compiler)", lines[top], "grammar_depth")
    return None


def _references(text: str) -> tuple[dict[str, set[str]], dict[str, int]]:
    """Each defined name's referenced names, and the line where it is defined."""
    refs: dict[str, set[str]] = {}
    lines: dict[str, int] = {}
    current: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        found = _DEFINITION.match(line)
        body = line
        if found is not None:
            current = found.group(1)
            refs.setdefault(current, set())
            lines.setdefault(current, number)
            body = line[found.end():]
        elif not line[:1].isspace() and not line.lstrip().startswith("|"):
            current = None  # a directive (%import, %ignore) or a blank line
        if current is not None:
            refs[current].update(_NAME.findall(_LITERALS.sub(" ", body)))
    return {name: {r for r in used if r in refs and r != name}
            for name, used in refs.items()}, lines


def _deepest(refs: dict[str, set[str]]) -> tuple[int, str]:
    """The longest chain of references (in names, a cycle cut where it closes) and the name it
    starts at; iterative, so a chain of any length needs no Python recursion."""
    depth: dict[str, int] = {}
    for root in refs:
        if root in depth:
            continue
        on_path = {root}
        stack = [(root, iter(sorted(refs[root])))]
        while stack:
            name, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.discard(name)
                depth[name] = 1 + max((depth.get(c, 0) for c in refs[name]
                                       if c not in on_path), default=0)
            elif child not in depth and child not in on_path:
                on_path.add(child)
                stack.append((child, iter(sorted(refs[child]))))
    if not depth:
        return 0, ""
    top = max(depth, key=lambda n: depth[n])
    return depth[top], top
