"""qrun.Matcher: a hole's constraint engine without a model run (docs/language.md §16.4), for users
who validate or test their constraints and for benchmarks. The same engines as holes: llguidance for
JSON Schemas and Lark grammars (qrun/constraint/grammar_index.py), qrun's DFA for regexes, named
patterns and option lists (qrun/constraint/regex_index.py), over a model's own token bytes."""

from __future__ import annotations

import json as json_module
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from qrun.backends.base import Backend
from qrun.constraint import (
    ConstraintLimits,
    Cursor,
    IndexCache,
    JsonFormat,
    JsonFormatError,
    LlgCache,
    LoweringError,
    Vocabulary,
    lower,
)
from qrun.constraint.grammar_index import greedy_tokens
from qrun.constraint.spec import LLGUIDANCE
from qrun.errors import ConstraintError, UsageError
from qrun.limits import Limits
from qrun.source import Source

__all__ = ["Matcher"]

# Compiled constraints and tokenizers are shared by every Matcher of the process: a checker
# that builds one Matcher per instance compiles each schema once. Module-level on purpose:
# they are per vocabulary (a cache key holds it), and Matcher is a face that runs nothing, so
# it has no loaded backend to hang them on (tests hand it a bare vocabulary). A run's state
# per backend (its constraint compiler, its forward scheduler) is qrun/runtime/runner.py's.
_GRAMMARS = LlgCache(64)
_INDEXES = IndexCache(64)
_MODELS: dict[str, Backend] = {}
_MODELS_LOCK = threading.Lock()


class Matcher:
    """The constraint of a hole over a model's vocabulary, checked token by token.

    `model` is a loaded model (`qrun.load_model`) or anything `load_model` takes (then only
    its tokenizer is loaded, once per process). Exactly one constraint: `json=` a JSON Schema
    (a dict, a bool, or its JSON text), `regex=` a pattern, `grammar=` a Lark grammar,
    `pattern=` a named pattern ("EMAIL"), or `options=` a list of strings. `closed=True`
    closes the schema's objects; `layout` is "flexible" (any JSON whitespace: what any
    serializer writes) or "fixed" (a json= hole's `{"a": 1, "b": [1, 2]}`). `formats` is
    "assert" (every `format` asserted, an unknown one is an error), "known" (unknown formats
    ignored) or "annotation" (formats ignored): docs/language.md §7.4. `limits` (a
    `qrun.Limits`) raises the size limits of a grammar or schema, as a run's does.

    It moves a hole's own cursor (qrun/constraint/spec.py Cursor). Compiled constraints and
    loaded tokenizers are kept per process, for every Matcher (module-level, per vocabulary:
    a Matcher runs no model); a run's per-backend state is qrun/runtime/runner.py's.

    Raises:
        ConstraintError: the constraint is invalid or unsupported (the message says why and,
            for a schema, where: its JSON pointer).
        UsageError: not exactly one constraint, or a bad option.
        ModelLoadError: the model cannot be loaded.
    """

    def __init__(self, model: Any = "smollm2", *, json: Any = None, regex: str | None = None,
                 grammar: str | None = None, pattern: str | None = None,
                 options: Sequence[str] | None = None, closed: bool = False,
                 layout: str = "flexible", formats: str = "assert",
                 limits: Limits | None = None) -> None:
        given = {name: value for name, value in (("json", json), ("regex", regex),
                                                 ("grammar", grammar), ("pattern", pattern),
                                                 ("options", options)) if value is not None}
        if len(given) != 1:
            raise UsageError("a Matcher takes exactly one of json=, regex=, grammar=, pattern= "
                             f"and options= (got {', '.join(given) or 'none'})")
        try:
            fmt = JsonFormat.checked(closed, formats, layout)
        except JsonFormatError as error:
            raise UsageError(str(error)) from None
        if limits is not None and not isinstance(limits, Limits):
            raise UsageError(f"limits must be a qrun.Limits, got {type(limits).__name__}")
        self.vocab: Vocabulary = _vocabulary(model)
        self.eos_token_ids = frozenset(self.vocab.eos_token_ids)
        (kind, value), = given.items()
        # The cursor at the constraint's start, kept for reset, and the one that moves.
        self._start = self._build(kind, value, fmt, (limits or Limits()).constraints())
        self._cursor = self._start.copy()
        self._consumed = 0
        self._ended = False

    @property
    def vocab_size(self) -> int:
        """The length of `allowed()`: the model's vocabulary size."""
        return self.vocab.size

    def allowed(self) -> npt.NDArray[np.bool_]:
        """A fresh bool array over the vocabulary: the tokens that keep the text a prefix of
        a valid value, EOS where the text so far is complete; all False after EOS."""
        if self._ended:
            return np.zeros(self.vocab.size, dtype=np.bool_)
        return self._cursor.allowed().copy()

    def consume(self, token_id: int) -> bool:
        """Take `token_id` if `allowed()` has it; False and no change if not."""
        if self._ended or not 0 <= token_id < self.vocab.size:
            return False
        if token_id in self.eos_token_ids:
            if not self._cursor.can_end():
                return False
            self._ended = True
        elif not self._cursor.consume(token_id):
            return False
        self._consumed += 1
        return True

    def consume_text(self, text: str | bytes) -> bool:
        """Take `text` as tokens (any tokenization of it gives the same answer: masks are
        byte-level); False and no change when some of it is not allowed."""
        data = text.encode("utf-8") if isinstance(text, str) else text
        tokens = greedy_tokens(self.vocab, data)
        if tokens is None:
            return False
        for done, token in enumerate(tokens):
            if not self.consume(token):
                self.rollback(done)
                return False
        return True

    def accepting(self) -> bool:
        """Whether the text so far is a complete value."""
        return self._ended or self._cursor.can_end()

    def rollback(self, tokens: int) -> None:
        """Take back the last `tokens` tokens consumed (EOS counts as one).

        Raises:
            ValueError: more tokens than were consumed, or a negative count.
        """
        if not 0 <= tokens <= self._consumed:
            raise ValueError(f"cannot roll back {tokens} tokens: {self._consumed} consumed")
        if tokens and self._ended:
            self._ended = False
            self._consumed -= 1
            tokens -= 1
        self._cursor.rollback(tokens)
        self._consumed -= tokens

    def reset(self) -> None:
        """Back to the start of the constraint."""
        self._cursor = self._start.copy()
        self._consumed = 0
        self._ended = False

    def _build(self, kind: str, value: Any, fmt: JsonFormat,
               limits: ConstraintLimits) -> Cursor:
        """A cursor at the start of the constraint, lowered as a hole's is
        (qrun/constraint/spec.py)."""
        if kind == "json" and isinstance(value, dict | bool | str | bytes):
            # One llguidance compile, which is also the check (LlgCache.schema); lower()
            # checks without the tokenizer, so it and then a build would compile twice. A
            # refused schema goes on to lower(), which raises the located error.
            try:
                schema = json_module.loads(value) if isinstance(value, str | bytes) else value
                return _GRAMMARS.schema(schema, self.vocab, fmt, limits, locate=False).start()
            except (ValueError, RecursionError):  # GrammarError is a ValueError
                pass
        try:
            spec = lower(kind, value, fmt, limits)
        except LoweringError as error:
            if error.wrong_type:
                raise UsageError(f"{kind}= takes {_TAKES[kind]}") from None
            raise _positioned(error, kind, value) from None
        if spec.engine == LLGUIDANCE:
            return _GRAMMARS.get(spec.pattern, self.vocab, spec.limits).start()
        return _INDEXES.get(spec.pattern, self.vocab).start()


# What each keyword takes, for a value of the wrong type.
_TAKES = {"json": "a JSON Schema (a dict, a bool or its JSON text)",
          "regex": "a pattern string", "grammar": "a Lark grammar (a non-empty string)",
          "pattern": "a pattern name such as \"EMAIL\"",
          "options": "a non-empty list of non-empty strings"}


def _positioned(error: LoweringError, kind: str, value: Any) -> ConstraintError:
    """The error located in the constraint's own text, which is its source: the character of
    a regex, the line and column of a grammar, else the whole value."""
    text = value if isinstance(value, str) else repr(value)[:2000]
    source = Source(f"<{kind}>", text)
    where = source.span_at(0, len(text))
    if error.offset is not None and isinstance(value, str):
        where = source.span_at(min(error.offset, max(0, len(text) - 1)), 1)
    elif error.line is not None and error.column is not None:
        starts = source.line_starts()
        line = min(error.line, len(starts))
        where = source.span_at(starts[line - 1] + error.column - 1, 1)
    notes = list(error.notes)
    if error.limit is not None:
        notes.append(f"raise the limit with Matcher(..., limits=qrun.Limits({error.limit}=...))")
    return ConstraintError(error.message, where, source, notes)


def _vocabulary(model: Any) -> Vocabulary:
    """The vocabulary of a loaded model, or of the tokenizer of a model name or path (loaded
    once per process)."""
    if isinstance(model, str | os.PathLike):
        name = os.fspath(model)
        with _MODELS_LOCK:
            backend = _MODELS.get(name)
            if backend is None:
                from qrun.backends import load_model

                backend = _MODELS[name] = load_model(name, weights=False)
        return backend.vocabulary
    vocab = getattr(model, "vocabulary", None)
    if not isinstance(vocab, Vocabulary):
        raise UsageError(f"model must be a loaded model or a model name, got "
                         f"{type(model).__name__}")
    return vocab
