"""The masks of token healing (docs/language.md §14.3): the tokens compatible with a healed
byte prefix that a hole must produce first, and the cursor of an unconstrained hole that starts
with one. Which token to take back is the runtime's policy (qrun/runtime/healing.py)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from qrun.constraint.lru import Lru
from qrun.constraint.past import Past, rolled_back
from qrun.constraint.vocab import Vocabulary

# Prefix masks kept per vocabulary: the healed text is nearly always one of a few strings
# (" ", ":", "\n", a word stem), so a small LRU serves almost every hole.
_PREFIX_MASKS = 256


class PrefixMasks:
    """Masks of tokens compatible with a byte prefix that must be produced first, cached."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self._compatible: Lru[bytes, npt.NDArray[np.bool_]] = Lru(_PREFIX_MASKS)
        self._holding: Lru[bytes, npt.NDArray[np.bool_]] = Lru(_PREFIX_MASKS)
        self._everything: npt.NDArray[np.bool_] | None = None
        # Every token's bytes, zero-padded to the longest (49,152 x 81 bytes for SmolLM2,
        # 4 MB): a prefix test over the whole vocabulary is then one numpy comparison.
        width = max((len(b) for b in vocab.token_bytes if b), default=1)
        self._lengths = np.array([len(b) if b else 0 for b in vocab.token_bytes], dtype=np.int32)
        self._bytes = np.zeros((vocab.size, width), dtype=np.uint8)
        for token_id, data in enumerate(vocab.token_bytes):
            if data:
                self._bytes[token_id, : len(data)] = np.frombuffer(data, dtype=np.uint8)

    def compatible(self, prefix: bytes) -> npt.NDArray[np.bool_]:
        """Bool [V]: tokens whose bytes start with `prefix`, or are a non-empty proper prefix of
        it (the rest of `prefix` then comes from later tokens)."""
        mask = self._compatible.get(prefix)
        if mask is not None:
            return mask
        starts = self.holding(prefix).copy()
        for cut in range(1, len(prefix)):
            starts[list(self.vocab.ids_of(prefix[:cut]))] = True  # duplicated tokens too
        starts.flags.writeable = False  # cached and shared
        self._compatible.put(prefix, starts)
        return starts

    def holding(self, prefix: bytes) -> npt.NDArray[np.bool_]:
        """Bool [V]: tokens whose bytes start with all of `prefix` (a healed hole's first
        token, runtime/generate.py: ` is` or ` island` after a healed ` is`, not ` `)."""
        mask = self._holding.get(prefix)
        if mask is not None:
            return mask
        n = len(prefix)
        holding: npt.NDArray[np.bool_]
        if n <= self._bytes.shape[1]:
            wanted = np.frombuffer(prefix, dtype=np.uint8)
            holding = (self._lengths >= max(n, 1)) & (self._bytes[:, :n] == wanted).all(axis=1)
        else:
            holding = np.zeros(self.vocab.size, dtype=np.bool_)
        holding.flags.writeable = False  # cached and shared
        self._holding.put(prefix, holding)
        return holding

    def everything(self) -> npt.NDArray[np.bool_]:
        """Bool [V]: every ordinary token and EOS (other special tokens stay out of holes)."""
        if self._everything is None:
            mask = self._lengths > 0
            mask[list(self.vocab.eos_token_ids)] = True
            mask.flags.writeable = False  # shared
            self._everything = mask
        return self._everything


class HealCursor:
    """The cursor of an unconstrained hole whose first bytes must be `prefix` (the healed
    text): masks tokens until the prefix is produced, then allows every ordinary token."""

    def __init__(self, masks: PrefixMasks, prefix: bytes) -> None:
        self.masks = masks
        self.prefix = prefix
        self.remaining = prefix
        self.past: Past = None  # what it had left before each token (past.py)

    def copy(self) -> HealCursor:
        clone = HealCursor(self.masks, self.prefix)
        clone.remaining, clone.past = self.remaining, self.past
        return clone

    def forced_bytes(self) -> bytes:
        return b""  # the prefix is produced under its masks; after it nothing is forced

    def accepts(self, data: bytes) -> bool:
        return data.startswith(self.prefix)

    def allowed(self, tokens_left: int | None = None) -> npt.NDArray[np.bool_]:
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
            remaining = self.remaining[len(data) :]
        elif data.startswith(self.remaining):
            remaining = b""
        else:
            raise ValueError(f"token {token_id} does not continue the healed prefix")
        self.remaining, self.past = remaining, (self.remaining, self.past)

    def consume(self, token_id: int) -> bool:
        if not (0 <= token_id < self.masks.vocab.size and bool(self.allowed()[token_id])):
            return False
        self.advance(token_id)
        return True

    def rollback(self, tokens: int) -> None:
        self.remaining, self.past = rolled_back(self.remaining, self.past, tokens)
