"""A GGUF re-quantized once for llama.cpp's batched CPU kernels (`--backend llamacpp --dtype
q8_0`), kept in the model cache beside the HF conversions and checked on every load as they
are (backends/model_cache.py: written atomically, a manifest with each file's BLAKE3).

Why: llama.cpp multiplies Q4_1 weights (the shipped SmolLM2 file) row by row, so a batch of
16 rows or a prompt of 512 tokens costs nearly what its rows cost one at a time. Q8_0 goes
through ggml's tiled kernels (llamafile's tinyBLAS on AVX2), which reuse each loaded weight
block across the rows. Measured on a 2-core AVX2 EPYC (SmolLM2-135M, docs/internals.md §10):
a 512-token prompt 1.99 s -> 1.19 s, a forward of 16 rows 87 -> 60 ms, one row 8.1 -> 8.9 ms;
mean next-token KL to the shipped weights 0.004 nats over 2,048 tokens, the top token the
same at 97.8 % of positions. The 4-bit types ggml repacks for AVX2 (Q4_0, IQ4_NL) batch too
but lose 0.16-0.21 nats re-quantized from Q4_1, and K-quants do not fit SmolLM2's 576-wide
rows."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from qrun.backends.llama_threads import llama_threads
from qrun.backends.llamacpp_api import quantize
from qrun.backends.model_cache import build_once, source_of
from qrun.cache_dir import cache_dir

# Bump when what a re-quantized copy holds changes, so stale copies are made again.
REQUANTIZE_VERSION = 1
MODEL_FILE = "model.gguf"


def requantized(gguf: Path, dtype: str) -> Path:
    """The GGUF file of `gguf` re-quantized to `dtype` (one of options.GGUF_DTYPES), made on
    first use (seconds) and again when the cached copy fails its manifest check.

    Raises:
        ModelLoadError: the cache cannot be written, or llama.cpp cannot read `gguf`.
    """
    source = {**source_of(gguf, REQUANTIZE_VERSION), "dtype": dtype}
    # Named by what it is made from (the manifest records the same): another source file,
    # version or dtype is another folder.
    digest = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:16]
    target = cache_dir() / "models" / f"{gguf.stem}-{dtype}-{digest}"

    def build(folder: Path) -> None:
        quantize(str(gguf), str(folder / MODEL_FILE), dtype, llama_threads())

    folder = build_once(target, source, build, main_file=MODEL_FILE, adopt=False,
                        doing="re-quantizing")
    return folder / MODEL_FILE
