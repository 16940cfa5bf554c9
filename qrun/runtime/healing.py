"""Token healing's policy (docs/language.md §14.3): when fixed text before a hole ends where the
model would not end a token (a trailing space, `http:`, a partial word), the last token is taken
back and the hole's first token(s) must start with its bytes (the masks that enforce it are
qrun/constraint/healing.py), so the model continues from canonical tokens. Measured on
SmolLM2: log P("Paris" | "The capital of France is ") is -7.23 without healing and -0.26 with
it (docs/internals.md §4.1)."""

from __future__ import annotations

from qrun.constraint import Vocabulary


def healable_tail(vocab: Vocabulary, token_ids: list[int], fixed_tail: int) -> int:
    """How many trailing tokens to take back before a hole: 1 when the last token is fixed
    text, valid UTF-8, not the whole context (the model needs something to condition on), and
    some vocabulary token properly extends its bytes; else 0."""
    if fixed_tail < 1 or len(token_ids) < 2:
        return 0
    data = vocab.token_bytes[token_ids[-1]]
    if not data:
        return 0
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return 0
    return 1 if vocab.has_extension(data) else 0
