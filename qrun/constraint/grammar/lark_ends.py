"""Rules of a user's Lark grammar that can never end, found before llguidance runs them. A rule
whose every alternative needs itself again (`a: "x" a`, no base case) matches no finite text,
yet llguidance compiles it: its masks then allow "x" forever, and with `start: a` the parser
gave up at the first token ("Too many items (limit 50000; ff_tokens)"), after `--check` had
passed. So a rule the start rule can reach, and that derives no finite text, is a `--check`
error naming it and its line.

The reading follows llguidance's own Lark lexer and parser (parser/src/lark/lexer.rs and
parser.rs in guidance-ai/llguidance): the same tokens, `|` continuing a rule on the next line,
`%json`/`%regex` followed by a JSON value. It runs only on grammars llguidance accepted, and
it is conservative: what it does not read (a nested `%lark { }`, templates, parameters,
`%if`, negation) counts as able to end, and a grammar it cannot read at all is not judged.
Terminals (UPPERCASE) count as able to end: llguidance refuses recursive ones itself."""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import dataclass, field
from typing import TypeAlias

__all__ = ["never_ending_rule"]

# llguidance's token set (lexer.rs Token::LITERAL_TOKENS and REGEX_TOKENS); Python's `re`
# takes the first alternative that matches, so each is placed before any that would match
# a prefix of it (`..` before `.`, `->` before nothing shorter, a comment before `/regex/`).
_TOKEN = re.compile(r"""
    (?P<skip>(?:\#|//)[^\n]*|[ \t]+)
  | (?P<newline>(?:\r?\n)+[ \t]*)
  | (?P<keyword>%(?:json|regex|llguidance|lark|if|ignore|import|override|declare)\b)
  | (?P<string>"(?:\\(?:["\\/bfnrt]|u[a-fA-F0-9]{4}|x[a-fA-F0-9]{2})|[^"\\\x00-\x1f\x7f])*"i?)
  | (?P<regexp>/(?:\\.|[^/\\])+/[imslux]*)
  | (?P<hex>0[xX][0-9a-fA-F]+)
  | (?P<number>[+-]?[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)
  | (?P<rule>!?[_?]?[a-z][_a-z0-9\-]*)
  | (?P<token>_?[A-Z][_A-Z0-9\-]*)
  | (?P<special><[^<>\s]+>)
  | (?P<ref>@[a-zA-Z0-9_\-]+)
  | (?P<punct>->|\.\.|::|[:=,.()\[\]{}~|&_])
  | (?P<op>[+*?])
""", re.VERBOSE)


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str
    text: str
    line: int


class _Unread(Exception):
    """A construct this reader does not follow: the rule (or grammar) is not judged."""


class _Ends:
    """The atom that always matches some finite text: a literal, a terminal, `%json`."""


_ENDS = _Ends()
_Atom: TypeAlias = "str | _Ends | _Alternatives"
# A body: alternatives (`|`) of conjunctions (`&`) of sequences of (atom, required); an
# atom under `?`, `*`, `[ ]`, `~0..n` or `{0,n}` is not required.
_Alternatives: TypeAlias = "list[list[list[tuple[_Atom, bool]]]]"


@dataclass(slots=True)
class _Rule:
    line: int
    alternatives: _Alternatives = field(default_factory=list)
    opaque: bool = False  # not read: counts as able to end


def never_ending_rule(text: str) -> tuple[str, int] | None:
    """Why a rule that `start` reaches can never end, with its 1-based line, or None (also
    when the grammar cannot be read here: llguidance's check is the one that counts)."""
    try:
        tokens = _tokens(text)
        if tokens is None:
            return None
        rules = _rules(tokens)
        if "start" not in rules:
            return None
        ending = _ending(rules)
        stuck = [name for name in _reached(rules, "start") if name not in ending]
        if not stuck:
            return None
        culprit, cycle = _culprit(rules, ending, stuck[0])
    except RecursionError:  # brackets nested thousands deep: llguidance's to judge
        return None
    others = [repr(n) for n in cycle if n != culprit]
    if len(others) > 3:
        others = [*others[:3], f"{len(others) - 3:,} more"]
    via = f" (through {', '.join(others)})" if others else ""
    return (f"rule '{culprit}' can never end: each of its alternatives needs '{culprit}' "
            f"again{via}, so no finite text matches it; give it an alternative that ends "
            f"(a base case, as in `{culprit}: \"x\" {culprit} | \"x\"`)", rules[culprit].line)


def _tokens(text: str) -> list[_Tok] | None:
    out: list[_Tok] = []
    pos, line = 0, 1
    decoder = json.JSONDecoder()
    text += "\n"
    while pos < len(text):
        found = _TOKEN.match(text, pos)
        if found is None:
            return None
        kind = found.lastgroup or ""
        value = found.group()
        end = found.end()
        if kind == "keyword" and value in ("%json", "%regex", "%llguidance"):
            # llguidance reads a JSON value after these (lexer.rs parse_json_prefix).
            start = end
            while start < len(text) and text[start] in " \t\r\n":
                start += 1
            try:
                _, end = decoder.raw_decode(text, start)
            except ValueError:
                return None
            value = text[pos:end]
        if kind != "skip":
            out.append(_Tok(kind, value, line))
        line += value.count("\n")
        pos = end
    return out


def _rules(tokens: list[_Tok]) -> dict[str, _Rule]:
    """Each rule's body, read from the grammar's items (definitions and statements)."""
    rules: dict[str, _Rule] = {}
    for item in _items(tokens):
        head = item[0]
        if head.kind == "keyword" and head.text == "%override":
            item = item[1:]
            head = item[0] if item else head
        if head.kind != "rule":
            continue  # terminals end; statements define nothing a rule needs
        name = head.text.lstrip("!?")
        rule = _Rule(head.line)
        rules[name] = rule
        try:
            body = _body(item)
            rule.alternatives = _Reader(body).alternatives(end=None)
        except _Unread:
            rule.opaque = True
    return rules


def _items(tokens: list[_Tok]) -> list[list[_Tok]]:
    """The grammar's items: a newline ends one unless `|` follows it or it is inside
    brackets (a nested `%lark { }`)."""
    items: list[list[_Tok]] = []
    current: list[_Tok] = []
    depth = 0
    for i, tok in enumerate(tokens):
        if tok.kind == "newline" and depth == 0:
            following = tokens[i + 1] if i + 1 < len(tokens) else None
            if following is not None and following.text == "|":
                continue
            if current:
                items.append(current)
            current = []
            continue
        if tok.kind == "newline":
            continue
        if tok.text in ("(", "[", "{"):
            depth += 1
        elif tok.text in (")", "]", "}"):
            depth = max(depth - 1, 0)
        current.append(tok)
    if current:
        items.append(current)
    return items


def _body(item: list[_Tok]) -> list[_Tok]:
    """The tokens after a rule's `:` (its name, priority and `[attributes]` skipped)."""
    pos = 1
    if pos < len(item) and item[pos].text in ("::", "{"):
        raise _Unread  # a parametric rule or a template
    if pos < len(item) and item[pos].text == ".":
        pos += 2
    if pos < len(item) and item[pos].text == "[":
        depth = 0
        while pos < len(item):
            depth += {"[": 1, "]": -1}.get(item[pos].text, 0)
            pos += 1
            if depth == 0:
                break
    if pos >= len(item) or item[pos].text != ":":
        raise _Unread
    return item[pos + 1:]


class _Reader:
    """Recursive descent over a rule body (parser.rs parse_expansions and below)."""

    def __init__(self, tokens: list[_Tok]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self, offset: int = 0) -> _Tok | None:
        at = self.pos + offset
        return self.tokens[at] if at < len(self.tokens) else None

    def take(self) -> _Tok:
        tok = self.peek()
        if tok is None:
            raise _Unread
        self.pos += 1
        return tok

    def alternatives(self, end: str | None) -> _Alternatives:
        out = [self.conjunction()]
        while (tok := self.peek()) is not None and tok.text == "|":
            self.pos += 1
            out.append(self.conjunction())
        tok = self.peek()
        if (tok.text if tok is not None else None) != end:
            raise _Unread
        if end is not None:
            self.pos += 1
        return out

    def conjunction(self) -> list[list[tuple[_Atom, bool]]]:
        parts = [self.sequence()]
        while (tok := self.peek()) is not None and tok.text == "&":
            self.pos += 1
            parts.append(self.sequence())
        if (tok := self.peek()) is not None and tok.text == "->":
            self.pos += 1
            if self.take().kind != "rule":
                raise _Unread
        return parts

    def sequence(self) -> list[tuple[_Atom, bool]]:
        items: list[tuple[_Atom, bool]] = []
        while (tok := self.peek()) is not None and tok.text not in ("|", ")", "]", "&", "->"):
            atom, optional = self.atom()
            items.append((atom, not optional and not self.repeat_may_be_empty()))
        return items

    def atom(self) -> tuple[_Atom, bool]:
        tok = self.take()
        if tok.text == "(":
            return self.alternatives(")"), False
        if tok.text == "[":
            return self.alternatives("]"), True
        if tok.kind == "string":
            if (nxt := self.peek()) is not None and nxt.text == "..":
                self.pos += 1
                if self.take().kind != "string":
                    raise _Unread
            return _ENDS, False
        if tok.kind in ("regexp", "special", "ref") or (
                tok.kind == "keyword" and tok.text.startswith(("%json", "%regex"))):
            return _ENDS, False
        if tok.kind == "token":
            self.no_template()
            return _ENDS, False
        if tok.kind == "rule":
            self.no_template()
            return tok.text.lstrip("!?"), False
        raise _Unread  # `~` negation, %lark, %if, `_`, parameters

    def no_template(self) -> None:
        nxt, after = self.peek(), self.peek(1)
        if nxt is not None and nxt.text == "::":
            raise _Unread
        if nxt is not None and nxt.text == "{" and (after is None or after.text != ","
                                                     and after.kind != "number"):
            raise _Unread

    def repeat_may_be_empty(self) -> bool:
        """Read an operator after an atom; whether it allows zero repetitions."""
        tok = self.peek()
        if tok is None:
            return False
        if tok.kind == "op":
            self.pos += 1
            return tok.text in ("?", "*")
        if tok.text == "~" and (nxt := self.peek(1)) is not None and nxt.kind == "number":
            self.pos += 2
            low = nxt.text
            if (dots := self.peek()) is not None and dots.text in ("..", "."):
                self.pos += 1
                if self.take().kind != "number":
                    raise _Unread
            return float(low) <= 0
        if tok.text == "{":
            self.pos += 1
            low = "0"
            if (nxt := self.peek()) is not None and nxt.kind == "number":
                low = self.take().text
            while (nxt := self.peek()) is not None and nxt.text != "}":
                self.pos += 1
            self.take()
            return float(low) <= 0
        return False


def _ending(rules: dict[str, _Rule]) -> set[str]:
    """The rules that derive some finite text: the least fixed point, by a worklist (a rule is
    looked at again only when one it uses is found to end). A name no rule defines (a
    terminal, an import) ends."""
    ending = {name for name, rule in rules.items() if rule.opaque}
    users: dict[str, set[str]] = {name: set() for name in rules}
    for name, rule in rules.items():
        for used in _names(rule.alternatives):
            if used in users:
                users[used].add(name)

    def ends(atom: _Atom) -> bool:
        if isinstance(atom, _Ends):
            return True
        if isinstance(atom, str):
            return atom in ending or atom not in rules
        return any(all(all(ends(a) or not needed for a, needed in seq) for seq in conj)
                   for conj in atom)

    todo = deque(name for name in rules if name not in ending)
    while todo:
        name = todo.popleft()
        if name not in ending and ends(rules[name].alternatives):
            ending.add(name)
            todo.extend(u for u in users[name] if u not in ending)
    return ending


def _names(atom: _Atom) -> set[str]:
    """The rule names an atom (or a body) uses."""
    if isinstance(atom, str):
        return {atom}
    if isinstance(atom, _Ends):
        return set()
    return {name for conj in atom for seq in conj for part, _ in seq for name in _names(part)}


def _reached(rules: dict[str, _Rule], start: str) -> list[str]:
    """The rules `start` reaches, in breadth-first order."""
    seen = [start]
    known = {start}
    for name in seen:
        for used in sorted(_names(rules[name].alternatives)):
            if used in rules and used not in known:
                known.add(used)
                seen.append(used)
    return seen


def _culprit(rules: dict[str, _Rule], ending: set[str], first: str) -> tuple[str, list[str]]:
    """The never-ending rule to blame, and the cycle it closes: from `first`, follow uses of
    rules that never end until one comes back (a rule that never ends uses one that never
    ends, so the walk closes a cycle)."""
    path = [first]
    while True:
        stuck = sorted(n for n in _names(rules[path[-1]].alternatives)
                       if n in rules and n not in ending)
        back = [n for n in stuck if n in path]
        if back or not stuck:
            cycle = path[path.index(back[0]):] if back else path[-1:]
            return cycle[0], cycle
        path.append(stuck[0])
