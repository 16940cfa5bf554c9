"""Token healing (LANGUAGE.md §4.3): when fixed text before a hole ends where the model would
not end a token (a trailing space, `http:`, a partial word), the last token is taken back and
the hole's first token(s) must start with its bytes, so the model continues from canonical
tokens. Measured on SmolLM2: log P("Paris" | "The capital of France is ") is -7.23 without
healing and -0.26 with it (shared/research/masking.md §4.1)."""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from qrun.runtime.vocab import Vocabulary

# Prefix masks kept per vocabulary: the healed text is nearly always one of a few strings
# (" ", ":", "\n", a word stem), so a small LRU serves almost every hole.
_PREFIX_MASKS = 256


class PrefixMasks:
    """Masks of tokens compatible with a byte prefix that must be produced first, cached."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self._lock = threading.Lock()
        self._cache: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._everything: torch.Tensor | None = None

    def compatible(self, prefix: bytes) -> torch.Tensor:
        """Bool [V]: tokens whose bytes start with `prefix`, or are a non-empty proper prefix of
        it (the rest of `prefix` then comes from later tokens)."""
        with self._lock:
            mask = self._cache.get(prefix)
            if mask is not None:
                self._cache.move_to_end(prefix)
                return mask
        mask = torch.zeros(self.vocab.size, dtype=torch.bool)
        for token_id, data in enumerate(self.vocab.token_bytes):
            if data and (data.startswith(prefix) or prefix.startswith(data)):
                mask[token_id] = True
        with self._lock:
            self._cache[prefix] = mask
            if len(self._cache) > _PREFIX_MASKS:
                self._cache.popitem(last=False)
        return mask

    def everything(self) -> torch.Tensor:
        """Bool [V]: every ordinary token and EOS (other special tokens stay out of holes)."""
        if self._everything is None:
            mask = torch.tensor([bool(b) for b in self.vocab.token_bytes])
            mask[list(self.vocab.eos_token_ids)] = True
            self._everything = mask
        return self._everything


class HealCursor:
    """The cursor of an unconstrained hole whose first bytes must be `prefix` (the healed
    text): masks tokens until the prefix is produced, then allows every ordinary token."""

    def __init__(self, masks: PrefixMasks, prefix: bytes) -> None:
        self.masks = masks
        self.remaining = prefix

    def allowed(self, tokens_left: int) -> torch.Tensor:
        if self.remaining:
            return self.masks.compatible(self.remaining)
        return self.masks.everything()

    def can_end(self) -> bool:
        return not self.remaining

    def can_continue(self) -> bool:
        return True

    def advance(self, token_id: int) -> None:
        data = self.masks.vocab.token_bytes[token_id] or b""
        if self.remaining.startswith(data):
            self.remaining = self.remaining[len(data) :]
        elif data.startswith(self.remaining):
            self.remaining = b""
        else:
            raise ValueError(f"token {token_id} does not continue the healed prefix")


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
