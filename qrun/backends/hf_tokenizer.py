"""The token-level half of the Backend protocol for models with a Hugging Face tokenizer:
encoding, decoding, the byte vocabulary for masks, end/start tokens and chat markers. Every
adapter over a HF model (transformers, vLLM) shares it."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any

from qrun.backends.base import BackendDefaults, control_tokens_of
from qrun.backends.vocab import Vocabulary
from qrun.errors import ModelLoadError

# A text no chat template would contain, used to cut a rendered message into its markers.
_SENTINEL = "\x00QRUN-CONTENT\x00"

# transformers' fast tokenizers implement `split_special_tokens` by setting a flag on the one
# Rust tokenizer they wrap, then encoding: two threads encoding at once (the runs of a batch,
# qrun/runtime/batch.py) could each encode under the other's flag, so a user's "<|im_end|>"
# became the control token, or a template's chat marker became text. Encoding under one lock
# makes setting the flag and encoding one step (tests/backends/test_tokenizer_threads.py).
_ENCODE_LOCK = threading.Lock()


class HFTokenizerMixin(BackendDefaults):
    """Needs `tokenizer` (a HF tokenizer), and `_vocab_size` and `_eos` (the end-of-sequence
    ids the model's config names besides the tokenizer's) unless `vocab_size` and
    `_generation_eos()` are overridden."""

    tokenizer: Any
    _markers: dict[str, tuple[str, str] | None]
    _vocab_size: int
    _eos: list[int]

    @property
    def vocab_size(self) -> int:
        """Width of the logits (may exceed the tokenizer's length)."""
        return self._vocab_size

    def _generation_eos(self) -> Iterable[int]:
        return self._eos

    @cached_property
    def eos_token_ids(self) -> frozenset[int]:
        ids = {int(i) for i in self._generation_eos()}
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return frozenset(ids)

    @cached_property
    def start_token_id(self) -> int:
        for token_id in (self.tokenizer.bos_token_id, self.tokenizer.eos_token_id, 0):
            if token_id is not None:
                return int(token_id)
        return 0

    @cached_property
    def vocabulary(self) -> Vocabulary:
        return Vocabulary.from_tokenizer(self.tokenizer, size=self.vocab_size)

    def encode(self, text: str, *, special: bool = False) -> list[int]:
        # split_special_tokens: "<|im_end|>" typed by a user is text, never the control token.
        with _ENCODE_LOCK:
            return list(self.tokenizer.encode(text, add_special_tokens=False,
                                              split_special_tokens=not special))

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    @cached_property
    def control_tokens(self) -> Mapping[str, int]:
        return control_tokens_of(self.encode, {
            int(i): str(t.content)
            for i, t in getattr(self.tokenizer, "added_tokens_decoder", {}).items()})

    def chat_markers(self, role: str) -> tuple[str, str] | None:
        if role not in self._markers:
            self._markers[role] = self._render_markers(role)
        return self._markers[role]

    def _render_markers(self, role: str) -> tuple[str, str] | None:
        if not getattr(self.tokenizer, "chat_template", None):
            return None
        # Some templates (SmolLM2's among them) add a default system turn before the first
        # message; rendering after an explicit system turn and subtracting it leaves only
        # this role's own markers.
        base = [{"role": "system", "content": "S"}] if role != "system" else []
        before = self._render(base) if base else ""
        rendered = self._render([*base, {"role": role, "content": _SENTINEL}])
        if not rendered.startswith(before) or _SENTINEL not in rendered:
            return None
        prefix, _, suffix = rendered[len(before):].partition(_SENTINEL)
        return prefix, suffix

    def _render(self, messages: list[dict[str, str]]) -> str:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False)
        return str(text)


def load_tokenizer(folder: str, name: str) -> tuple[Any, Any]:
    """The Hugging Face tokenizer and config of the model folder (or hub id) `folder`.

    Raises:
        ModelLoadError: either cannot be loaded.
    """
    from transformers import AutoConfig, AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder), AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load the tokenizer of model '{name}': {exc}") from exc


def generation_eos(configured: Any) -> list[int]:
    """The eos_token_id of a generation config: an int, a list of them, or None."""
    if isinstance(configured, int):
        return [configured]
    if isinstance(configured, list | tuple):
        return [int(i) for i in configured]
    return []
