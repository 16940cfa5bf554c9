"""The vLLM server adapter: holes sent to an OpenAI-compatible `vllm serve` as completions on
token-id prompts, the path past one machine. qrun cannot install its logits processor there,
so each hole's constraint travels as a vLLM structured output (a regex in a portable form:
see regex/portable.py), select options are scored through prompt log-probabilities, and the
KV cache across segments is the server's prefix cache.

The server's output is not taken on trust: every token is replayed through qrun's own
constraint cursor and stop-string logic (runtime/remote.py), so a value that breaks its
constraint is an error, never a silently wrong result."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from qrun.backends.base import Capabilities, Completion, HoleSampler, PromptScorer, ScoredRows
from qrun.backends.hf_tokenizer import HFTokenizerMixin, generation_eos, load_tokenizer
from qrun.errors import BackendError, ModelLoadError

# A completion can wait this long for a busy server (the engine queues requests).
REQUEST_TIMEOUT_S = 600.0


class ServerError(BackendError):
    """The server refused or failed a request (the message carries its own)."""


class VllmServerBackend(HFTokenizerMixin):
    """A model served by `vllm serve`, with its tokenizer loaded here: whole holes per
    request, and select scoring through prompt log-probabilities. The server keeps the KV cache
    across segments (its prefix cache) and batches concurrent requests."""

    capabilities = Capabilities(batches_itself=True, heals_in_context=False)

    def __init__(self, url: str, model_id: str, tokenizer: Any, name: str,
                 eos: Sequence[int], vocab_size: int, load_s: float = 0.0,
                 max_context: int | None = None) -> None:
        self.url = url.rstrip("/")
        self.model_id = model_id
        self.tokenizer = tokenizer
        self.name = name
        self.device = "server"
        self.dtype = "server"
        self.load_s = load_s
        self._eos = list(eos)
        self._vocab_size = vocab_size
        self._max_context = max_context
        self._markers: dict[str, tuple[str, str] | None] = {}

    @property
    def max_context(self) -> int | None:
        return self._max_context

    def hole_sampler(self) -> HoleSampler:
        return self

    def prompt_scorer(self) -> PromptScorer:
        return self

    def complete(self, prompt: Sequence[int], max_tokens: int, *, temperature: float,
                 top_p: float, top_k: int, seed: int, stop: Sequence[str] = (),
                 regex: str | None = None) -> Completion:
        """Sample one hole after `prompt` (token ids).

        Raises:
            ServerError: the server refused the request (e.g. a regex it cannot compile) or
                could not be reached.
        """
        body: dict[str, Any] = {
            "model": self.model_id, "prompt": list(prompt), "max_tokens": max_tokens,
            "temperature": temperature, "top_p": top_p, "top_k": top_k if top_k > 0 else -1,
            "seed": seed, "logprobs": 0, "return_token_ids": True,
            "skip_special_tokens": False, "include_stop_str_in_output": True,
        }
        if stop:
            body["stop"] = list(stop)
        if regex is not None:
            body["structured_outputs"] = {"regex": regex}
        choice, usage = self._complete(body)
        token_ids = [int(t) for t in choice.get("token_ids") or []]
        logprobs = [float(lp) if lp is not None else float("nan")
                    for lp in ((choice.get("logprobs") or {}).get("token_logprobs") or [])]
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        if token_ids and token_ids[-1] in self.eos_token_ids:
            token_ids.pop()
            finish = "eos"
        elif finish == "stop" and choice.get("stop_reason") is None:
            finish = "eos"  # ended by an end-of-sequence token it did not return
        computed, cached = _usage(usage)
        return Completion(token_ids, logprobs[: len(token_ids)], finish, computed, cached)

    def score_continuations(
        self, context: Sequence[int], rows: Sequence[Sequence[int]]
    ) -> ScoredRows:
        """Prompt log-probabilities of context + row, one prompt per row in one request."""
        body = {"model": self.model_id, "prompt": [list(context) + list(r) for r in rows],
                "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
        choices, usage = self._post("/v1/completions", body)
        out: list[list[float]] = [[] for _ in rows]
        for choice in choices["choices"]:
            index = int(choice["index"])
            row, logprobs = rows[index], choice.get("prompt_logprobs") or []
            for k, token in enumerate(row):
                at = logprobs[len(context) + k] if len(context) + k < len(logprobs) else None
                entry = (at or {}).get(str(token))
                if entry is None:
                    raise ServerError("the server returned no prompt log-probability for an "
                                      "option's token")
                out[index].append(float(entry["logprob"]))
        computed, cached = _usage(usage)
        return ScoredRows(out, computed, cached)

    def _complete(self, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        reply, usage = self._post("/v1/completions", body)
        choices = reply.get("choices") or []
        if not choices:
            raise ServerError("the server returned no completion")
        return choices[0], usage

    def _post(self, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        reply = _request(self.url + path, body)
        return reply, reply.get("usage") or {}

    def clear_cache(self) -> None:
        """Ask the server to forget its cached prefixes (needs a dev-mode server; ignored
        otherwise)."""
        try:
            _request(self.url + "/reset_prefix_cache", None)
        except ServerError:
            pass


def _usage(usage: dict[str, Any]) -> tuple[int, int]:
    """(positions computed, positions served from the prefix cache) from a usage block; the
    cached count needs a server started with --enable-prompt-tokens-details."""
    prompt = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0)
    return prompt - cached + int(usage.get("completion_tokens") or 0), cached


def _request(url: str, body: dict[str, Any] | None) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            payload = response.read()
    except urllib.error.HTTPError as exc:
        raise ServerError(f"the vLLM server at {url} answered {exc.code}: "
                          f"{_server_message(exc.read())}") from None
    except urllib.error.URLError as exc:
        raise ServerError(f"cannot reach the vLLM server at {url}: {exc.reason}") from None
    except OSError as exc:
        raise ServerError(f"cannot reach the vLLM server at {url}: {exc}") from None
    try:
        reply = json.loads(payload or b"{}")
    except json.JSONDecodeError:
        raise ServerError(f"the server at {url} did not answer with JSON") from None
    return reply if isinstance(reply, dict) else {"data": reply}


def _server_message(payload: bytes) -> str:
    try:
        reply = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return payload[:300].decode("utf-8", errors="replace")
    error = reply.get("error") if isinstance(reply, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(reply.get("message", reply)) if isinstance(reply, dict) else str(reply)


def connect_vllm_server(name: str, folder: str, url: str) -> VllmServerBackend:
    """Connect to `vllm serve` at `url`, with the tokenizer of the local model `name`.

    Raises:
        ModelLoadError: the server cannot be reached, serves no model, or its tokenizer is
            not the local one.
    """
    started = time.perf_counter()
    if not url.startswith(("http://", "https://")):
        raise ModelLoadError(f"--url must be http://HOST:PORT or https://..., got {url!r}")
    try:
        models = _request(url.rstrip("/") + "/v1/models", None)
    except ServerError as exc:
        raise ModelLoadError(str(exc)) from None
    served = [m for m in models.get("data", []) if isinstance(m, dict) and m.get("id")]
    if not served:
        raise ModelLoadError(f"the server at {url} serves no model")
    tokenizer, config = load_tokenizer(folder, name)
    length = served[0].get("max_model_len")
    backend = VllmServerBackend(
        url, str(served[0]["id"]), tokenizer, name,
        generation_eos(getattr(config, "eos_token_id", None)),
        int(getattr(config, "vocab_size", len(tokenizer))),
        max_context=length if isinstance(length, int) else None,
    )
    _check_tokenizer(backend, url)
    backend.load_s = time.perf_counter() - started
    return backend


def _check_tokenizer(backend: VllmServerBackend, url: str) -> None:
    # Token-id prompts only mean the same text if both sides share the vocabulary.
    probe = "qrun checks the tokenizer: Ünïcode, 12345, {\"json\": true}\n"
    try:
        reply = _request(backend.url + "/tokenize",
                         {"model": backend.model_id, "prompt": probe,
                          "add_special_tokens": False})
    except ServerError:
        return  # an older server without /tokenize: nothing to compare
    if [int(t) for t in reply.get("tokens", [])] != backend.encode(probe):
        raise ModelLoadError(
            f"the server at {url} serves '{backend.model_id}', whose tokenizer is not the one "
            f"of the local model '{backend.name}'; give the served model's folder with --model")
