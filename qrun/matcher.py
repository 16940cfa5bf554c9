"""qrun.Matcher: a hole's constraint engine without a model run (docs/language.md §16.4), for users
who validate or test their constraints and for benchmarks. The same engines as holes: llguidance for
JSON Schemas and Lark grammars (qrun/constraint/grammar_index.py), qrun's DFA for regexes, named
patterns and option lists (qrun/constraint/regex_index.py), over a model's own token bytes."""

from __future__ import annotations

import json as json_module
import os
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from qrun.backends.base import Backend
from qrun.constraint.grammar import ConstraintLimits, JsonFormat
from qrun.constraint.grammar.formats import MODES as FORMAT_MODES
from qrun.constraint.grammar_index import LlgCache, LlgCursor, greedy_tokens
from qrun.constraint.regex_index import DEAD, IndexCache, TokenIndex
from qrun.constraint.spec import LLGUIDANCE, LoweringError, lower
from qrun.constraint.vocab import Vocabulary
from qrun.errors import ConstraintError, UsageError
from qrun.limits import Limits
from qrun.source import Source

__all__ = ["Matcher"]

# Compiled constraints and tokenizers are shared by every Matcher of the process: a checker
# that builds one Matcher per instance compiles each schema once.
_GRAMMARS = LlgCache(64)
_INDEXES = IndexCache(64)
_MODELS: dict[str, Backend] = {}
_MODELS_LOCK = threading.Lock()
LAYOUTS = ("flexible", "fixed")


class _Engine(Protocol):
    def mask(self) -> npt.NDArray[np.bool_]: ...
    def consume(self, token_id: int) -> bool: ...
    def accepting(self) -> bool: ...
    def rollback(self, tokens: int) -> None: ...
    def reset(self) -> None: ...


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
        if layout not in LAYOUTS:
            raise UsageError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if formats not in FORMAT_MODES:
            raise UsageError(f"formats must be one of {', '.join(FORMAT_MODES)}, got "
                             f"{formats!r}")
        self.vocab: Vocabulary = _vocabulary(model)
        self.eos_token_ids = frozenset(self.vocab.eos_token_ids)
        (kind, value), = given.items()
        if not isinstance(closed, bool):
            raise UsageError(f"closed must be True or False, got {closed!r}")
        if limits is not None and not isinstance(limits, Limits):
            raise UsageError(f"limits must be a qrun.Limits, got {type(limits).__name__}")
        fmt = JsonFormat(whitespace_flexible=layout == "flexible", closed=closed,
                         formats=formats)
        self._engine = self._build(kind, value, fmt, (limits or Limits()).constraints())
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
        return self._engine.mask().copy()

    def consume(self, token_id: int) -> bool:
        """Take `token_id` if `allowed()` has it; False and no change if not."""
        if self._ended or not 0 <= token_id < self.vocab.size:
            return False
        if token_id in self.eos_token_ids:
            if not self._engine.accepting():
                return False
            self._ended = True
        elif not self._engine.consume(token_id):
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
        return self._ended or self._engine.accepting()

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
        self._engine.rollback(tokens)
        self._consumed -= tokens

    def reset(self) -> None:
        """Back to the start of the constraint."""
        self._engine.reset()
        self._consumed = 0
        self._ended = False

    def _build(self, kind: str, value: Any, fmt: JsonFormat,
               limits: ConstraintLimits) -> _Engine:
        """The engine of the constraint lowered as a hole's is (qrun/constraint/spec.py)."""
        if kind == "json" and isinstance(value, dict | bool | str | bytes):
            # One llguidance compile, which is also the check (LlgCache.schema); lower()
            # checks without the tokenizer, so it and then a build would compile twice. A
            # refused schema goes on to lower(), which raises the located error.
            try:
                schema = json_module.loads(value) if isinstance(value, str | bytes) else value
                index = _GRAMMARS.schema(schema, self.vocab, fmt, limits, locate=False)
                return _LlgEngine(index.start())
            except (ValueError, RecursionError):  # GrammarError is a ValueError
                pass
        try:
            spec = lower(kind, value, fmt, limits)
        except LoweringError as error:
            if error.wrong_type:
                raise UsageError(f"{kind}= takes {_TAKES[kind]}") from None
            raise _positioned(error, kind, value) from None
        if spec.engine == LLGUIDANCE:
            return _LlgEngine(_GRAMMARS.get(spec.pattern, self.vocab, spec.limits).start())
        return _DfaEngine(_INDEXES.get(spec.pattern, self.vocab))


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


class _LlgEngine:
    """llguidance's matcher behind a cursor (rollback is its own)."""

    def __init__(self, cursor: LlgCursor) -> None:
        self.cursor = cursor

    def mask(self) -> npt.NDArray[np.bool_]:
        return self.cursor.mask()

    def consume(self, token_id: int) -> bool:
        return self.cursor.consume(token_id)

    def accepting(self) -> bool:
        return self.cursor.can_end()

    def rollback(self, tokens: int) -> None:
        self.cursor.rollback(tokens)

    def reset(self) -> None:
        self.cursor.reset()


class _DfaEngine:
    """A DFA state with the states before it (a DFA cannot go back by itself)."""

    def __init__(self, index: TokenIndex) -> None:
        self.index = index
        self.states = [index.start_state]

    def mask(self) -> npt.NDArray[np.bool_]:
        return self.index.allowed(self.states[-1])

    def consume(self, token_id: int) -> bool:
        state = self.index.advance(self.states[-1], token_id)
        if state == DEAD:
            return False
        self.states.append(state)
        return True

    def accepting(self) -> bool:
        return self.index.is_accepting(self.states[-1])

    def rollback(self, tokens: int) -> None:
        if tokens:
            del self.states[-tokens:]

    def reset(self) -> None:
        del self.states[1:]


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
