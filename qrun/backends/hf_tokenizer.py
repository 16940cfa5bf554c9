"""The token-level half of the Backend protocol for models with a Hugging Face tokenizer:
encoding, decoding, the byte vocabulary for masks, end/start tokens and chat markers. Every
adapter over a HF model (transformers, vLLM) shares it."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any

from qrun.backends.base import BackendDefaults, control_tokens_of
from qrun.backends.chat_template import (
    ToolCallFormat,
    ToolTurn,
    role_markers,
    tool_call_format,
    tools_turn,
)
from qrun.constraint import Vocabulary
from qrun.constraint.vocab import VocabularyError
from qrun.errors import ModelLoadError

# transformers' fast tokenizers implement `split_special_tokens` by setting a flag on the one
# Rust tokenizer they wrap, then encoding: two threads encoding at once (the runs of a batch,
# qrun/runtime/runner.py) could each encode under the other's flag, so a user's "<|im_end|>"
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
        return vocabulary_of(self.tokenizer, size=self.vocab_size)

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
            self._markers[role] = (role_markers(self._render, role)
                                   if self._has_chat_template() else None)
        return self._markers[role]

    def tool_call_format(self) -> ToolCallFormat | None:
        return self._tool_call_format

    @cached_property
    def _tool_call_format(self) -> ToolCallFormat | None:
        return tool_call_format(self._render) if self._has_chat_template() else None

    def tools_turn(self, tools: list[dict[str, Any]]) -> ToolTurn | None:
        if not self._has_chat_template():
            return None
        return tools_turn(self._render, tools, self.control_tokens)

    def _has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def _render(self, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None) -> str:
        text = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
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


def vocabulary_of(tokenizer: Any, size: int | None = None) -> Vocabulary:
    """The byte vocabulary of a Hugging Face tokenizer, cached per tokenizer object (and size).

    Byte-level BPE token strings are decoded by inverting GPT-2's `bytes_to_unicode`;
    SentencePiece-style ones (`▁` for space, `<0xNN>` byte tokens) are also understood.

    Raises:
        VocabularyError: the token strings are neither byte-level nor SentencePiece-style,
            or `size` is smaller than the tokenizer.
    """
    return _CACHE.get(tokenizer, size)


# SentencePiece marks a leading space with U+2581 and spells raw bytes as <0xNN>.
_SP_SPACE = "\u2581"
_SP_BYTE_PREFIX, _SP_BYTE_LEN = "<0x", 6



def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's `bytes_to_unicode`: printable bytes map to themselves, the other 68
    bytes to U+0100.. in order. Byte-level BPE token strings are spelled in these characters."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_OF_CHAR = _gpt2_unicode_to_byte()
# The same map for str.translate: a byte-level piece becomes the text whose code points are its
# bytes, which latin-1 encodes one to one (17 ms for SmolLM2's 49k pieces; a per-character
# generator took 42 ms).
_BYTE_TRANSLATION = {ord(ch): byte for ch, byte in _BYTE_OF_CHAR.items()}


class _VocabularyCache:
    """Vocabularies keyed weakly by tokenizer object: built once, dropped with the tokenizer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_tokenizer: weakref.WeakKeyDictionary[Any, dict[tuple[int, int], Vocabulary]]
        self._by_tokenizer = weakref.WeakKeyDictionary()

    def get(self, tokenizer: Any, size: int | None) -> Vocabulary:
        length = len(tokenizer)
        key = (length, length if size is None else size)
        with self._lock:
            built = self._by_tokenizer.setdefault(tokenizer, {})
            if key not in built:
                built[key] = _build_from_tokenizer(tokenizer, key[1])
            return built[key]


_CACHE = _VocabularyCache()


def _build_from_tokenizer(tokenizer: Any, size: int) -> Vocabulary:
    length = len(tokenizer)
    if size < length:
        raise VocabularyError(
            f"model vocabulary size {size} is smaller than the tokenizer ({length})"
        )
    special = set(getattr(tokenizer, "all_special_ids", ()))
    special.update(getattr(tokenizer, "added_tokens_decoder", {}).keys())
    pieces: list[str | None] = list(tokenizer.convert_ids_to_tokens(list(range(length))))
    ordinary = [p for i, p in enumerate(pieces) if i not in special and p is not None]
    decode = _pick_decoder(ordinary)
    token_bytes: list[bytes | None] = [
        None if i in special or piece is None else decode(piece) for i, piece in enumerate(pieces)
    ]
    token_bytes.extend([None] * (size - length))
    eos = _eos_ids(tokenizer)
    return Vocabulary.from_token_bytes(token_bytes, eos)


def _eos_ids(tokenizer: Any) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return list(eos) if isinstance(eos, list | tuple) else [int(eos)]


def _pick_decoder(pieces: Sequence[str]) -> Any:
    """Byte-level if every ordinary piece is spelled in the GPT-2 byte alphabet, SentencePiece if
    the vocabulary has `▁` pieces and <0xNN> byte pieces; otherwise unsupported."""
    if set().union(*pieces) <= _BYTE_OF_CHAR.keys():
        return _decode_byte_level
    has_byte_pieces = any(_is_sp_byte(p) for p in pieces)
    if has_byte_pieces and any(_SP_SPACE in p for p in pieces):
        return _decode_sentencepiece
    bad = next(p for p in pieces if not all(ch in _BYTE_OF_CHAR for ch in p))
    raise VocabularyError(
        f"unsupported tokenizer: token {bad!r} is neither byte-level BPE (GPT-2 byte alphabet) "
        "nor SentencePiece with <0xNN> byte tokens, so token bytes cannot be known exactly"
    )


def _decode_byte_level(piece: str) -> bytes:
    return piece.translate(_BYTE_TRANSLATION).encode("latin-1")


def _is_sp_byte(piece: str) -> bool:
    return (
        len(piece) == _SP_BYTE_LEN
        and piece.startswith(_SP_BYTE_PREFIX)
        and piece.endswith(">")
        and all(c in "0123456789ABCDEFabcdef" for c in piece[3:5])
    )


def _decode_sentencepiece(piece: str) -> bytes:
    # The tokenizer's own "add a leading space" normalisation is a tokenizer concern; here a
    # `▁` is simply the space byte it stands for inside the text.
    if _is_sp_byte(piece):
        return bytes([int(piece[3:5], 16)])
    return piece.replace(_SP_SPACE, " ").encode("utf-8")
