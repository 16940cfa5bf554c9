"""A model's tokenizer with no weights: the Backend protocol's tokenizer half (encoding, chat
markers, the result's token ids) and neither a StepModel nor a HoleSampler. A template with no
holes needs nothing more, so it runs without loading the weights (docs/language.md §16.2)."""

from __future__ import annotations

import time
from typing import Any

from qrun.backends.base import Capabilities
from qrun.backends.hf_tokenizer import HFTokenizerMixin, generation_eos, load_tokenizer


class TokenizerBackend(HFTokenizerMixin):
    """The tokenizer (and config) of a HF model folder or hub id; a `gen` or `select` hole on
    it fails at that hole (runtime/engines.py: no hole filler)."""

    kind = "tokenizer"
    capabilities = Capabilities(heals_in_context=False)

    def __init__(self, tokenizer: Any, config: Any, name: str, load_s: float = 0.0) -> None:
        self.tokenizer = tokenizer
        self.name = name
        self.device = "none"
        self.dtype = "none"
        self.load_s = load_s
        self._vocab_size = int(getattr(config, "vocab_size", None) or len(tokenizer))
        self._eos = generation_eos(getattr(config, "eos_token_id", None))
        self._markers: dict[str, tuple[str, str] | None] = {}
        length = getattr(config, "max_position_embeddings", None)
        self._max_context = length if isinstance(length, int) else None

    @property
    def max_context(self) -> int | None:
        return self._max_context


def load_tokenizer_only(name: str, folder: str) -> TokenizerBackend:
    """The tokenizer of the model folder (or hub id) `folder`, without its weights.

    Raises:
        ModelLoadError: the tokenizer or config cannot be loaded.
    """
    started = time.perf_counter()
    tokenizer, config = load_tokenizer(folder, name)
    return TokenizerBackend(tokenizer, config, name, time.perf_counter() - started)
