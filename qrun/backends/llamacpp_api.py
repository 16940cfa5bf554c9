"""The only module that touches llama-cpp-python's ctypes layer (`llama_cpp.llama_cpp`, an
optional extra: `make llamacpp`): typed wrappers over the few C functions the llamacpp backend
(backends/llamacpp.py) calls. The bindings ship no type stubs, so everything untyped stays
here. The high-level `Llama` class is never used: qrun feeds token ids with explicit
positions and sequence ids, and reads the logits itself.

Facts this relies on (llama.h of the vendored llama.cpp, checked on 0.3.36): `llama_decode`
returns 0 (done), 1 (no free KV cell; memory unchanged), -1 (invalid batch) or < -1 (fatal);
the logits buffer is overwritten by the next decode, so rows are copied out; several
sequence ids may share a cell in a unified KV cache (`kv_unified`), which makes
`llama_memory_seq_cp` a metadata copy; an out-of-range sequence id in a memory call aborts
the process (GGML_ASSERT), so callers check ids before every call."""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from qrun.errors import ModelLoadError

# Log levels of ggml.h's enum ggml_log_level: WARN and ERROR lines are kept for messages.
_LOG_WARN = 3
_LOG_CONT = 5
# llama_decode's answer when no KV cell is free for the batch (memory left unchanged).
DECODE_NO_ROOM = 1

_lock = threading.Lock()
_lib: Any = None
_log_lines: deque[str] = deque(maxlen=8)
_log_keep: list[Any] = []  # the C callback object: it must outlive every call into llama.cpp


def library() -> Any:
    """The `llama_cpp.llama_cpp` module, imported and initialised once: its own log callback
    (which prints every line of llama.cpp to stderr) replaced by one that keeps the last
    warnings and errors for qrun's messages.

    Raises:
        ModelLoadError: llama-cpp-python is not installed.
    """
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        try:
            import llama_cpp.llama_cpp as lib
        except ImportError as exc:
            raise ModelLoadError(
                f"the llamacpp backend needs llama-cpp-python ({exc}); install it with "
                "`make llamacpp` or `pip install 'qrun[llamacpp]'`") from None

        def on_log(level: int, text: bytes, user_data: Any) -> None:
            if level >= _LOG_WARN and level != _LOG_CONT:
                _log_lines.append(text.decode("utf-8", "replace").strip())

        callback = lib.llama_log_callback(on_log)
        _log_keep.append(callback)
        lib.llama_log_set(callback, ctypes.c_void_p(0))
        lib.llama_backend_init()
        _lib = lib
        return lib


def last_log() -> str:
    """The last warnings and errors llama.cpp logged (empty if none), then forgotten."""
    lines = [line for line in _log_lines if line]
    _log_lines.clear()
    return "; ".join(lines[-3:])


# llama.h's enum llama_ftype for each weight type qrun re-quantizes to (options.GGUF_DTYPES).
_FTYPES = {"q8_0": 7}  # LLAMA_FTYPE_MOSTLY_Q8_0


def quantize(source: str, target: str, dtype: str, threads: int) -> None:
    """Write `source`'s weights re-quantized to `dtype` into the GGUF file `target`
    (`llama_model_quantize`; a quantized source is read dequantized: allow_requantize).
    Tensors llama.cpp keeps in another type by its own rules stay so (the token embedding
    of SmolLM2, already q8_0).

    Raises:
        ModelLoadError: llama.cpp could not read `source` or write `target`.
    """
    lib = library()
    params = lib.llama_model_quantize_default_params()
    params.ftype = _FTYPES[dtype]
    params.allow_requantize = True
    params.nthread = threads
    last_log()
    code = int(lib.llama_model_quantize(source.encode("utf-8"), target.encode("utf-8"),
                                        ctypes.byref(params)))
    if code != 0:
        reason = last_log() or f"llama_model_quantize returned {code}"
        raise ModelLoadError(f"llama.cpp cannot re-quantize {source} to {dtype}: {reason}")


class Model:
    """A GGUF model loaded by llama.cpp (memory-mapped weights), with its vocabulary."""

    def __init__(self, path: str, vocab_only: bool = False) -> None:
        lib = library()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        params.vocab_only = vocab_only
        last_log()
        self.ptr = lib.llama_model_load_from_file(path.encode("utf-8"), params)
        if not self.ptr:
            reason = last_log() or "not a GGUF model llama.cpp can read"
            raise ModelLoadError(f"llama.cpp cannot load {path}: {reason}")
        self.lib = lib
        self.vocab = lib.llama_model_get_vocab(self.ptr)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.bos = int(lib.llama_vocab_bos(self.vocab))
        self.eos = int(lib.llama_vocab_eos(self.vocab))
        self.n_ctx_train = 0
        self.kv_bytes_per_position = 0
        self.description = ""
        if vocab_only:
            # The hyper-parameters are not loaded (they read 0, and the per-layer ones abort
            # the process): the trained length comes from the metadata.
            arch = self.meta("general.architecture")
            length = self.meta(f"{arch}.context_length") if arch else None
            self.n_ctx_train = int(length) if length and length.isdigit() else 0
            return
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(self.ptr))
        # Bytes of f16 keys and values one position holds (llama_context_default_params'
        # type_k/type_v), for the prefix cache's budget.
        heads = max(1, int(lib.llama_model_n_head(self.ptr)))
        kv_width = int(lib.llama_model_n_embd(self.ptr)) // heads * int(
            lib.llama_model_n_head_kv(self.ptr))
        self.kv_bytes_per_position = int(lib.llama_model_n_layer(self.ptr)) * 2 * kv_width * 2
        buf = ctypes.create_string_buffer(256)
        n = int(lib.llama_model_desc(self.ptr, buf, len(buf)))
        self.description = buf.raw[:max(0, n)].decode("utf-8", "replace")

    def close(self) -> None:
        if self.ptr:
            self.lib.llama_model_free(self.ptr)
            self.ptr = None

    def tokenize(self, text: str, special: bool) -> list[int]:
        """Token ids of `text` (no BOS/EOS); control tokens are read from their text only
        when `special` is set."""
        data = text.encode("utf-8")
        cap = len(data) + 8
        for _ in range(2):
            buf = (ctypes.c_int32 * cap)()
            n = int(self.lib.llama_tokenize(self.vocab, data, len(data), buf, cap, False,
                                            special))
            if n >= 0:
                return list(buf[:n])
            cap = -n
        raise RuntimeError(f"llama_tokenize could not size its output for {len(data)} bytes")

    def piece(self, token: int) -> bytes:
        """The bytes token `token` stands for in text (empty for control tokens)."""
        cap = 64
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = int(self.lib.llama_token_to_piece(self.vocab, token, buf, cap, 0, False))
            if n >= 0:
                return bytes(buf.raw[:n])
            cap = -n
        raise RuntimeError(f"llama_token_to_piece could not size token {token}")

    def text(self, token: int) -> str:
        """The token's own text (a control token's name, `<|im_end|>`)."""
        raw = self.lib.llama_vocab_get_text(self.vocab, token)
        return bytes(raw or b"").decode("utf-8", "replace")

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text, or None when the file has no such key."""
        cap = 1 << 16
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = int(self.lib.llama_model_meta_val_str(self.ptr, key.encode(), buf, cap))
            if n < 0:
                return None
            if n < cap:
                return buf.raw[:n].decode("utf-8", "replace")
            cap = n + 1
        return None


class Batch:
    """A llama_batch over numpy-owned arrays, filled with slice assignments (no Python loop
    per token); llama.cpp reads them only during llama_decode."""

    def __init__(self, capacity: int, seqs_per_token: int = 1) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, np.int32)
        self.pos = np.zeros(capacity, np.int32)
        self.n_seq_id = np.zeros(capacity, np.int32)
        self.seq = np.zeros((capacity, max(1, seqs_per_token)), np.int32)
        self.logits = np.zeros(capacity, np.int8)
        # seq_id is llama_seq_id**: one pointer per token into the rows of `seq`.
        rows = np.arange(capacity + 1, dtype=np.uint64) * np.uint64(self.seq.strides[0])
        self.seq_ptrs = (np.uint64(self.seq.ctypes.data) + rows).astype(np.uint64)
        self.seq_ptrs[capacity] = 0
        self.n = 0
        self.outputs = 0

    def add(self, tokens: Sequence[int], start: int, seq: int, outputs: int) -> None:
        """Append `tokens` at positions start.. of sequence `seq`, the last `outputs` of them
        flagged for logits."""
        k, i = len(tokens), self.n
        self.token[i:i + k] = tokens
        self.pos[i:i + k] = np.arange(start, start + k, dtype=np.int32)
        self.n_seq_id[i:i + k] = 1
        self.seq[i:i + k, 0] = seq
        self.logits[i:i + k] = 0
        if outputs:
            self.logits[i + k - outputs:i + k] = 1
        self.n = i + k
        self.outputs += outputs

    def add_node(self, token: int, pos: int, seqs: Sequence[int]) -> None:
        """Append one token shared by the sequences `seqs` (a token tree's node), with logits."""
        i = self.n
        self.token[i] = token
        self.pos[i] = pos
        self.n_seq_id[i] = len(seqs)
        self.seq[i, :len(seqs)] = seqs
        self.logits[i] = 1
        self.n = i + 1
        self.outputs += 1

    def struct(self, lib: Any) -> Any:
        batch = lib.llama_batch()
        batch.n_tokens = self.n
        batch.token = self.token.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.embd = None
        batch.pos = self.pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.seq_id = ctypes.cast(self.seq_ptrs.ctypes.data,
                                   ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)))
        batch.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        return batch


class Context:
    """A llama.cpp context on a model: one unified KV cache shared by up to `n_seq_max`
    sequences. Not thread-safe: the backend holds one lock around every call."""

    def __init__(self, model: Model, n_ctx: int, n_seq_max: int, n_batch: int,
                 threads: int) -> None:
        lib = self.lib = model.lib
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = min(512, n_batch)
        params.n_seq_max = n_seq_max
        params.n_threads = threads
        params.n_threads_batch = threads
        params.kv_unified = True  # forks share cells; token trees need it (see module doc)
        params.no_perf = True
        last_log()
        self.ptr = lib.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise ModelLoadError(f"llama.cpp cannot make a context of {n_ctx} positions: "
                                 f"{last_log() or 'out of memory?'}")
        self.mem = lib.llama_get_memory(self.ptr)
        self.n_vocab = model.n_vocab
        self.n_ctx = int(lib.llama_n_ctx(self.ptr))
        self.n_batch = int(lib.llama_n_batch(self.ptr))
        self.n_seq_max = int(lib.llama_n_seq_max(self.ptr))

    def close(self) -> None:
        if self.ptr:
            self.lib.llama_free(self.ptr)
            self.ptr = None

    def decode(self, batch: Batch) -> int:
        """llama_decode's return code (0: done)."""
        return int(self.lib.llama_decode(self.ptr, batch.struct(self.lib)))

    def logits(self, rows: int) -> npt.NDArray[np.float32]:
        """A copy of the last decode's output rows [rows, V], in the batch's output order."""
        ptr = self.lib.llama_get_logits(self.ptr)
        address = ctypes.cast(ptr, ctypes.c_void_p).value
        if not address:
            raise RuntimeError("llama.cpp returned no logits")
        buffer = (ctypes.c_float * (rows * self.n_vocab)).from_address(address)
        view = np.frombuffer(memoryview(buffer), dtype=np.float32)
        return view.reshape(rows, self.n_vocab).copy()

    def _check(self, seq: int) -> None:
        # An id outside the cache's range aborts the whole process inside llama.cpp.
        if not 0 <= seq < self.n_seq_max:
            raise ValueError(f"sequence id {seq} outside 0..{self.n_seq_max - 1}")

    def clear(self) -> None:
        """Empty the KV cache: every sequence's cells, and the next allocation starts at the
        first cell again."""
        self.lib.llama_memory_clear(self.mem, True)

    def seq_rm(self, seq: int, start: int, end: int = -1) -> None:
        """Drop positions [start, end) of `seq` (start -1: all; end -1: to the end)."""
        self._check(seq)
        if not self.lib.llama_memory_seq_rm(self.mem, seq, start, end):
            raise RuntimeError(f"llama.cpp cannot remove positions {start}.. of sequence {seq}")

    def seq_cp(self, source: int, target: int, end: int = -1) -> None:
        """Make `target` share the cells of `source`'s positions [0, end) (-1: all)."""
        self._check(source)
        self._check(target)
        self.lib.llama_memory_seq_cp(self.mem, source, target, -1, end)

    def seq_pos_max(self, seq: int) -> int:
        self._check(seq)
        return int(self.lib.llama_memory_seq_pos_max(self.mem, seq))

    def seq_state(self, seq: int) -> Any:
        """A copy, in host memory, of `seq`'s cells (its positions' keys and values: llama.cpp's
        sequence state), as a ctypes byte array for set_seq_state."""
        self._check(seq)
        size = int(self.lib.llama_state_seq_get_size(self.ptr, seq))
        state = (ctypes.c_uint8 * size)()
        if int(self.lib.llama_state_seq_get_data(self.ptr, state, size, seq)) != size:
            raise RuntimeError(f"llama.cpp cannot copy out sequence {seq}")
        return state

    def set_seq_state(self, seq: int, state: Any) -> bool:
        """Write a seq_state copy into the empty sequence `seq`, in free cells; False when the
        KV cache has no room for it."""
        self._check(seq)
        return int(self.lib.llama_state_seq_set_data(self.ptr, state, len(state), seq)) > 0
