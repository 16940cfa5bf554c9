"""Differential check of one JSON Schema through `qrun.Matcher` (llguidance, qrun/matcher.py)
against the `jsonschema` validator, token by token with a model's vocabulary. Used by
tests/constraint/test_llg_corpus.py (a fixed sample) and bench/llg_corpus.py (the whole corpus,
timings; bench/llg_check.py adds the old engine through the `also_*` hooks).

Per schema: time to build the Matcher (compile) and to its first mask; valid instances
(hypothesis-jsonschema, json_instances.py) in llguidance's key order, walked with the
tokenizer's own tokens and with a random tokenization: every token must be in `allowed()`, `consume`
must agree, and the end must be `accepting()`; invalid mutants must be refused somewhere; random
generations (uniform over the budget-aware mask of qrun/constraint/grammar_index.py) must end
complete and validate."""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qrun.constraint.grammar import FIXED, JsonFormat, json_grammar
from qrun.constraint.grammar_index import LlgCache, LlgCursor, LlgIndex
from qrun.errors import ConstraintError
from qrun.matcher import Matcher

from .json_instances import (
    RegexTimeout,
    dumps,
    invalid_instances,
    random_tokenization,
    schema_key_order,
    valid_instances,
    validators,
)

__all__ = ["Checker", "SchemaReport", "Timeout", "counts", "limited", "search_order"]

Encode = Callable[[str], list[int]]


@dataclass
class SchemaReport:
    """What checking one schema found. `status`: "ok" (compiled) or "compile_error"."""

    name: str
    status: str = "ok"
    reason: str = ""
    compile_s: float = 0.0
    first_mask_s: float = 0.0
    valid: int = 0
    invalid: int = 0
    no_instances: str = ""
    untokenizable: int = 0
    valid_rejected: list[str] = field(default_factory=list)
    reordered: int = 0
    invalid_accepted: list[str] = field(default_factory=list)
    walks: int = 0
    walks_bad: list[str] = field(default_factory=list)
    mask_s: list[float] = field(default_factory=list)


def counts(reports: list[SchemaReport]) -> dict[str, int]:
    """What a set of reports checked: schemas compiled, valid instances walked, invalid ones,
    random generations, masks computed."""
    ok = [r for r in reports if r.status == "ok"]
    return {"compiled": len(ok), "valid": sum(r.valid for r in ok),
            "invalid": sum(r.invalid for r in ok), "walks": sum(r.walks for r in ok),
            "masks": sum(len(r.mask_s) for r in ok)}


class Timeout(Exception):
    """`limited` ran out of time."""


def _alarm(signum: int, frame: Any) -> None:
    raise Timeout


def limited(seconds: float, run: Callable[[], Any]) -> Any:
    """run() with SIGALRM after `seconds` (re-fired every second: an alarm raised inside a gc
    callback is swallowed); raises Timeout."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        return run()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


class Checker:
    """Checks schemas with one model (anything qrun.Matcher takes) and its tokenizer's
    `encode` (for canonical tokens). `layout` is the Matcher's ("flexible" or "fixed");
    instances are serialized as `json.dumps` does by default, non-ASCII kept raw. A subclass
    compares another engine on the same instances through `also_compile` and `also_walk`
    (bench/llg_check.py), and makes its own reports with `new_report`."""

    def __init__(self, model: Any, encode: Encode, layout: str = "flexible", valid: int = 4,
                 invalid: int = 4, walks: int = 2, seed: int = 0) -> None:
        self.model, self.encode, self.layout = model, encode, layout
        self.vocab = Matcher(model, regex="a").vocab
        self.fmt = JsonFormat(whitespace_flexible=layout == "flexible")
        self.counts = (valid, invalid, walks)
        self.seed = seed
        self._indexes = LlgCache(8)

    def new_report(self, name: str) -> SchemaReport:
        return SchemaReport(name)

    def also_compile(self, schema: Any, report: SchemaReport) -> Any:
        """Another engine's compiled form of `schema` (None: none to compare)."""
        return None

    def also_walk(self, other: Any, tokens: list[int], valid: bool,
                  report: SchemaReport) -> None:
        """Feed the tokens of an instance (`valid` or not) to the other engine."""

    def check(self, name: str, schema: Any, timeout_s: float = 20.0) -> SchemaReport:
        """Compile and time `schema`, then check instances for at most `timeout_s` seconds
        (hypothesis-jsonschema alone takes minutes on some big schemas: the report then says
        "timeout" in `no_instances`)."""
        report = self.new_report(name)
        matcher = self._compile(schema, report)
        other = self.also_compile(schema, report)
        if matcher is None:
            return report
        try:
            limited(timeout_s, lambda: self._instances(matcher, other, schema, report))
        except Timeout:
            report.no_instances = report.no_instances or "timeout"
        return report

    def _compile(self, schema: Any, report: SchemaReport) -> Matcher | None:
        started = time.perf_counter()
        try:
            matcher = Matcher(self.model, json=schema, layout=self.layout)
        except ConstraintError as exc:
            report.status, report.reason = "compile_error", exc.message
            return None
        report.compile_s = time.perf_counter() - started
        matcher.allowed()
        report.first_mask_s = time.perf_counter() - started
        return matcher

    def index(self, schema: Any, fmt: JsonFormat | None = None) -> LlgIndex:
        """The schema's LlgIndex in the Matcher's layout, or in `fmt`."""
        return self._indexes.get(json_grammar(schema, fmt or self.fmt), self.vocab)

    def _instances(self, matcher: Matcher, other: Any, schema: Any,
                   report: SchemaReport) -> None:
        rng = random.Random(self.seed)
        n_valid, n_invalid, n_walks = self.counts
        try:
            valid = valid_instances(schema, n_valid, self.seed, self._tokenizable)
        except Timeout:
            raise
        except Exception as exc:  # hypothesis-jsonschema refuses many real schemas
            report.no_instances = f"{type(exc).__name__}: {str(exc)[:200]}"
            valid = []
        kept = []
        for value in valid:
            walked = self._valid(matcher, schema, value, report, rng)
            if walked is not None:
                kept.append(walked[0])
                if other is not None:
                    self.also_walk(other, walked[1], True, report)
        for value in invalid_instances(schema, kept, n_invalid, rng):
            text = dumps(value)
            tokens = self._tokens(text, report)
            if tokens is None:
                continue
            report.invalid += 1
            if self._walk(matcher, tokens, report) is None:
                report.invalid_accepted.append(text)
            if other is not None:
                self.also_walk(other, tokens, False, report)
        for _ in range(n_walks):
            self._generate(schema, report, rng)

    def _valid(self, matcher: Matcher, schema: Any, value: Any, report: SchemaReport,
               rng: random.Random) -> tuple[Any, list[int]] | None:
        """Walk a valid instance (schema key order, else a searched order): the instance as
        walked and its tokens, or None when refused in every order tried."""
        text = dumps(schema_key_order(value, schema))
        tokens = self._tokens(text, report)
        if tokens is None:
            return None
        report.valid += 1
        ordered = value
        if self._walk(matcher, tokens, report) is not None:
            found = search_order(self.index(schema), value)
            if found is None:
                report.valid_rejected.append(text)
                return None
            report.reordered += 1
            ordered, text = found
            tokens = self.encode(text)
        shuffled = random_tokenization(self.vocab, text.encode(), rng)
        if self._walk(matcher, shuffled, report) is not None:
            report.valid_rejected.append("random tokenization: " + text)
            return None
        return ordered, tokens

    def _tokenizable(self, value: Any) -> bool:
        data = dumps(value).encode()
        return self._spelled(self.encode(data.decode())) == data

    def _spelled(self, tokens: list[int]) -> bytes:
        return b"".join(self.vocab.token_bytes[t] or b"" for t in tokens)

    def _tokens(self, text: str, report: SchemaReport) -> list[int] | None:
        """The tokenizer's tokens for `text`, or None (counted) when they do not spell it
        exactly: SmolLM2's tokenizer drops bytes it has no token for (0xF1...)."""
        tokens = self.encode(text)
        if self._spelled(tokens) != text.encode():
            report.untokenizable += 1
            return None
        return tokens

    @staticmethod
    def _walk(matcher: Matcher, tokens: list[int], report: SchemaReport) -> int | None:
        """Feed `tokens` through the Matcher checking each against `allowed()`; None when all
        pass and the end accepts, else where it stopped (len(tokens): not complete)."""
        matcher.reset()
        for position, token in enumerate(tokens):
            started = time.perf_counter()
            mask = matcher.allowed()
            report.mask_s.append(time.perf_counter() - started)
            if not mask[token] or not matcher.consume(token):
                return position
        return None if matcher.accepting() else len(tokens)

    def _generate(self, schema: Any, report: SchemaReport, rng: random.Random) -> None:
        """One random generation under the budget-aware mask; it must end complete and
        valid. The budget is 64 tokens, or twice what the shortest value needs plus 16. In
        a json= hole's layout (FIXED), as holes generate."""
        index = self.index(schema, FIXED)
        cursor: LlgCursor = index.start()
        shortest = cursor.completion()
        if shortest is None:
            return
        max_tokens = max(64, 2 * len(index.tokens_for(shortest) or shortest) + 16)
        report.walks += 1
        out = bytearray()
        eos = set(self.vocab.eos_token_ids)
        for step in range(max_tokens):
            allowed = np.flatnonzero(cursor.allowed(max_tokens - step))
            if len(allowed) == 0:
                report.walks_bad.append(f"empty mask after {bytes(out)!r}")
                return
            token = int(rng.choice(allowed.tolist()))
            if token in eos:
                break
            cursor.advance(token)
            out += self.vocab.token_bytes[token] or b""
            if not cursor.can_continue():
                break
        text = out.decode("utf-8", errors="replace")
        if not cursor.can_end():
            report.walks_bad.append(f"unfinished: {text[:300]}")
            return
        import json

        _, is_valid = validators(schema)
        try:
            if not is_valid(json.loads(text)):
                report.walks_bad.append(f"invalid: {text[:300]}")
        except RegexTimeout:
            return


def search_order(index: LlgIndex, value: Any) -> tuple[Any, str] | None:
    """An order of `value`'s object keys that the grammar accepts, with its text; None when
    none is found. JSON objects are unordered and llguidance fixes an order (listed
    properties first), so a valid instance refused in one key order is only a real refusal
    in every order. Depth-first, in two passes of at most _SEARCH_BUDGET tries each: first
    a key is taken only when its value fits and every other key that may come here may
    still come right after it (quick, but it misses an order where a required key must
    come between two others); then every key whose value fits is tried, those after which
    more of the others may come first."""
    for strict in (True, False):
        found = _emit(index.start(), value, [_SEARCH_BUDGET], strict)
        if found is not None and found[0].can_end():
            return found[1], found[2]
    return None


_SEARCH_BUDGET = 3000
_ITEM, _KEY = ", ", ": "


def _emit(cursor: LlgCursor, value: Any, budget: list[int], strict: bool) \
        -> tuple[LlgCursor, Any, str] | None:
    if isinstance(value, dict):
        found = _emit_members(cursor, value, list(value), budget, strict) \
            if cursor.advance_bytes(b"{") else None
        if found is None or not found[0].advance_bytes(b"}"):
            return None
        members = found[1]
        text = _ITEM.join(dumps(key) + _KEY + t for key, _, t in members)
        return found[0], {key: member for key, member, _ in members}, "{" + text + "}"
    if isinstance(value, list):
        if not cursor.advance_bytes(b"["):
            return None
        items, texts = [], []
        for i, item in enumerate(value):
            if i and not cursor.advance_bytes(_ITEM.encode()):
                return None
            got = _emit(cursor, item, budget, strict)
            if got is None:
                return None
            cursor = got[0]
            items.append(got[1])
            texts.append(got[2])
        if not cursor.advance_bytes(b"]"):
            return None
        return cursor, items, "[" + _ITEM.join(texts) + "]"
    text = dumps(value)
    return (cursor, value, text) if cursor.advance_bytes(text.encode()) else None


def _emit_members(cursor: LlgCursor, value: dict[str, Any], left: list[str],
                  budget: list[int], strict: bool, first: bool = True) \
        -> tuple[LlgCursor, list[tuple[str, Any, str]]] | None:
    """The members `left` in an order the grammar accepts, trying keys depth-first (see
    search_order for `strict`)."""
    if not left:
        return cursor, []

    def head(key: str, after: bool) -> bytes:
        return ((_ITEM if after else "") + dumps(key) + _KEY).encode()

    def rest(found: tuple[LlgCursor, Any, str], key: str) \
            -> tuple[LlgCursor, list[tuple[str, Any, str]]] | None:
        tail = _emit_members(found[0], value, [k for k in left if k != key], budget, strict,
                             False)
        return None if tail is None else (tail[0], [(key, found[1], found[2]), *tail[1]])

    possible = [k for k in left if cursor.copy().advance_bytes(head(k, not first))]
    tries = []
    for key in possible:
        budget[0] -= 1
        if budget[0] < 0:
            return None
        trial = cursor.copy()
        trial.advance_bytes(head(key, not first))
        found = _emit(trial, value[key], budget, strict)
        if found is None:
            continue
        if strict:
            # The others that may come here must still come right after this key.
            if all(found[0].copy().advance_bytes(head(k, True)) for k in possible if k != key):
                done = rest(found, key)
                if done is not None:
                    return done
            continue
        # A key may come later though not right after this one (a required key between
        # them): the count of those that may orders the tries (llguidance keeps the
        # schema's order, where the earliest key has the most); a key after which none of
        # the others may come cannot be the one here.
        follow = sum(found[0].copy().advance_bytes(head(k, True)) for k in left if k != key)
        if follow or len(left) == 1:
            tries.append((-follow, len(tries), key, found))
    for _, _, key, found in sorted(tries):
        done = rest(found, key)
        if done is not None:
            return done
    return None
