"""The vLLM server adapter: holes sent to an OpenAI-compatible `vllm serve` as completions on
token-id prompts, the path past one machine. qrun cannot install its logits processor there,
so each hole's constraint travels as a vLLM structured output (a regex in a portable form:
see regex/portable.py; json= and grammar= holes as llguidance Lark text, to a server whose
structured outputs run llguidance), select options are scored through prompt
log-probabilities, and the KV cache across segments is the server's prefix cache.

The server's output is not taken on trust: every token is replayed through qrun's own
constraint cursor and stop-string logic (runtime/remote.py), so a value that breaks its
constraint is an error, never a silently wrong result."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from qrun.backends.base import Capabilities, Completion, HoleSampler, PromptScorer, ScoredRows
from qrun.backends.hf_tokenizer import HFTokenizerMixin, generation_eos, load_tokenizer
from qrun.backends.server_http import REQUEST_TIMEOUT_S, ServerClient, ServerError
from qrun.errors import ModelLoadError

__all__ = ["REQUEST_TIMEOUT_S", "ServerError", "VllmServerBackend", "connect_vllm_server"]


# Only llguidance reads a `%llguidance` line: a server that samples under this grammar runs
# llguidance for grammars (vLLM's default "auto" mode sends what xgrammar refuses there, the
# "guidance" mode everything; "xgrammar" or "outlines" refuse it).
_PROBE_GRAMMAR = '%llguidance {}\nstart: "a"\n'


class VllmServerBackend(HFTokenizerMixin):
    """A model served by `vllm serve`, with its tokenizer loaded here: whole holes per
    request, and select scoring through prompt log-probabilities. The server keeps the KV cache
    across segments (its prefix cache) and batches concurrent requests."""

    kind = "vllm-server"
    capabilities = Capabilities(batches_itself=True, heals_in_context=False, lookahead=False)

    def __init__(self, client: ServerClient, model_id: str, tokenizer: Any, name: str,
                 eos: Sequence[int], vocab_size: int, load_s: float = 0.0,
                 max_context: int | None = None) -> None:
        self.client = client
        self.url = client.base_url
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
        self._llguidance: bool | None = None

    @property
    def max_context(self) -> int | None:
        return self._max_context

    def hole_sampler(self) -> HoleSampler:
        return self

    def prompt_scorer(self) -> PromptScorer:
        return self

    def complete(self, prompt: Sequence[int], max_tokens: int, *, temperature: float,
                 top_p: float, top_k: int, seed: int, stop: Sequence[str] = (),
                 regex: str | None = None, grammar: str | None = None,
                 stop_token_ids: Sequence[int] = (),
                 extra: Mapping[str, object] | None = None) -> Completion:
        """Sample one hole after `prompt` (token ids).

        Raises:
            ServerError: the server refused the request (e.g. a regex it cannot compile), could
                not be reached, did not answer in time, or answered with something that is not
                a completion of this model (wrong types, token ids outside the vocabulary).
        """
        body: dict[str, Any] = {
            "model": self.model_id, "prompt": list(prompt), "max_tokens": max_tokens,
            "temperature": temperature, "top_p": top_p, "top_k": top_k if top_k > 0 else -1,
            "seed": seed, "logprobs": 0, "return_token_ids": True,
            "skip_special_tokens": False, "include_stop_str_in_output": True,
        }
        body.update(extra or {})
        if stop:
            body["stop"] = list(stop)
        if stop_token_ids:
            body["stop_token_ids"] = list(stop_token_ids)
        if regex is not None:
            body["structured_outputs"] = {"regex": regex}
        elif grammar is not None:
            body["structured_outputs"] = {"grammar": grammar}
        reply = self._post(body)
        choice = self._first_choice(reply)
        token_ids = self._token_ids(choice.get("token_ids"))
        if len(token_ids) > max_tokens:
            raise self._bad(f"{len(token_ids)} tokens for max_tokens {max_tokens}")
        logprobs = self._logprobs(choice.get("logprobs"), len(token_ids))
        reason = choice.get("finish_reason")
        if reason is not None and not isinstance(reason, str):
            raise self._bad("a finish_reason that is not a string")
        finish = "length" if reason == "length" else "stop"
        if token_ids and token_ids[-1] in self.eos_token_ids:
            token_ids.pop()
            finish = "eos"
        elif finish == "stop" and choice.get("stop_reason") is None:
            finish = "eos"  # ended by an end-of-sequence token it did not return
        computed, cached = self._usage(reply, len(prompt), max_tokens)
        return Completion(token_ids, logprobs[: len(token_ids)], finish, computed, cached)

    def reads_llguidance(self) -> bool:
        """Whether the server's structured outputs sample grammars with llguidance: asked
        once, with a one-token request under a grammar only llguidance reads.

        Raises:
            ServerError: the server could not be reached or failed.
        """
        if self._llguidance is None:
            body = {"model": self.model_id, "prompt": self.encode("a"), "max_tokens": 1,
                    "temperature": 0.0, "structured_outputs": {"grammar": _PROBE_GRAMMAR}}
            try:
                self._post(body)
                self._llguidance = True
            except ServerError as exc:
                if exc.status is None or exc.status >= 500:
                    raise
                self._llguidance = False
        return self._llguidance

    def score_continuations(
        self, context: Sequence[int], rows: Sequence[Sequence[int]]
    ) -> ScoredRows:
        """Prompt log-probabilities of context + row, one prompt per row in one request.

        Raises:
            ServerError: as for `complete`, or no log-probability for an option's token.
        """
        body = {"model": self.model_id, "prompt": [list(context) + list(r) for r in rows],
                "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
        reply = self._post(body)
        choices = reply.get("choices")
        if not isinstance(choices, list) or len(choices) != len(rows):
            raise self._bad(f"{_count(choices)} choices for {len(rows)} prompts")
        out: list[list[float] | None] = [None] * len(rows)
        for choice in choices:
            index = choice.get("index") if isinstance(choice, dict) else None
            if not _is_int(index) or not 0 <= index < len(rows) or out[index] is not None:
                raise self._bad("a choice with a missing or repeated index")
            out[index] = self._prompt_logprobs(choice.get("prompt_logprobs"), len(context),
                                               rows[index])
        computed, cached = self._usage(reply, sum(len(context) + len(r) for r in rows), len(rows))
        return ScoredRows([row or [] for row in out], computed, cached)

    # ---- replies are data: checked before anything else reads them ---------------------------

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.client.post("/v1/completions", body)

    def _bad(self, what: str) -> ServerError:
        return ServerError(f"the vLLM server at {self.url} answered with {what}")

    def _first_choice(self, reply: dict[str, Any]) -> dict[str, Any]:
        choices = reply.get("choices")
        if not isinstance(choices, list) or not choices:
            raise self._bad("no completion")
        if not isinstance(choices[0], dict):
            raise self._bad("a choice that is not an object")
        return choices[0]

    def _token_ids(self, value: Any) -> list[int]:
        if value is None:
            return []
        if not isinstance(value, list) or not all(_is_int(t) for t in value):
            raise self._bad("token ids that are not a list of integers")
        outside = [t for t in value if not 0 <= t < self.vocab_size]
        if outside:
            raise self._bad(f"token id {outside[0]} outside the vocabulary "
                            f"(0..{self.vocab_size - 1})")
        return list(value)

    def _logprobs(self, value: Any, count: int) -> list[float | None]:
        raw = (value or {}).get("token_logprobs") if isinstance(value, dict | None) else value
        if raw is None:
            return []
        if not isinstance(raw, list):
            raise self._bad("log-probabilities that are not a list")
        return [self._logprob(item) for item in raw[:count]]

    def _logprob(self, item: Any) -> float | None:
        if item is None:
            return None
        if not _is_number(item) or not math.isfinite(item) or item > 0:
            raise self._bad(f"a log-probability that is not a number <= 0: {str(item)[:40]!r}")
        return float(item)

    def _prompt_logprobs(self, value: Any, start: int, row: Sequence[int]) -> list[float]:
        if not isinstance(value, list):
            raise self._bad("no prompt log-probabilities")
        out = []
        for k, token in enumerate(row):
            at = value[start + k] if start + k < len(value) else None
            entry = at.get(str(token)) if isinstance(at, dict) else None
            if not isinstance(entry, dict):
                raise ServerError(f"the vLLM server at {self.url} returned no prompt "
                                  "log-probability for an option's token")
            logprob = self._logprob(entry.get("logprob"))
            if logprob is None:
                raise self._bad("a missing log-probability for an option's token")
            out.append(logprob)
        return out

    def _usage(self, reply: dict[str, Any], prompt_tokens: int,
               max_completion: int) -> tuple[int, int]:
        """(positions computed, positions served from the prefix cache) from the usage block,
        checked: counts are integers, the prompt is the one sent, the completion within its
        max_tokens; the cached count needs a server started with
        --enable-prompt-tokens-details (absent: none cached)."""
        usage = reply.get("usage")
        if not isinstance(usage, dict):
            raise self._bad("no usage block" if usage is None else "a usage that is not an object")
        prompt = self._count(usage, "prompt_tokens")
        completion = self._count(usage, "completion_tokens")
        details = usage.get("prompt_tokens_details")
        if details is not None and not isinstance(details, dict):
            raise self._bad("prompt_tokens_details that is not an object")
        cached = (self._count(details, "cached_tokens")
                  if details is not None and "cached_tokens" in details else 0)
        if prompt != prompt_tokens:
            raise self._bad(f"usage.prompt_tokens {prompt} for a prompt of {prompt_tokens}")
        if completion > max_completion:
            raise self._bad(f"usage.completion_tokens {completion} over max_tokens "
                            f"{max_completion}")
        if cached > prompt:
            raise self._bad(f"{cached} cached tokens of a prompt of {prompt}")
        return prompt - cached + completion, cached

    def _count(self, block: dict[str, Any], key: str) -> int:
        value = block.get(key)
        if not _is_int(value) or value < 0:
            raise self._bad(f"usage.{key} that is not a count: {str(value)[:40]!r}")
        return int(value)

    def close(self) -> None:
        """End the kept connections to the server."""
        self.client.close()

    def clear_cache(self) -> None:
        """Ask the server to forget its cached prefixes (needs a dev-mode server; ignored
        otherwise)."""
        try:
            self.client.post("/reset_prefix_cache", {})
        except ServerError:
            pass


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _count(value: Any) -> str:
    return str(len(value)) if isinstance(value, list) else "no"


def connect_vllm_server(name: str, folder: str, url: str,
                        timeout: float = REQUEST_TIMEOUT_S) -> VllmServerBackend:
    """Connect to `vllm serve` at `url`, with the tokenizer of the local model `name`; each
    request waits at most `timeout` seconds for its answer.

    Raises:
        ModelLoadError: the server cannot be reached, serves no model, or its tokenizer is
            not the local one.
    """
    started = time.perf_counter()
    if not url.startswith(("http://", "https://")):
        raise ModelLoadError(f"--url must be http://HOST:PORT or https://..., got {url!r}")
    client = ServerClient(url, timeout)
    try:
        backend = _connect(client, name, folder, url)
    except BaseException:
        client.close()
        raise
    backend.load_s = time.perf_counter() - started
    return backend


def _connect(client: ServerClient, name: str, folder: str, url: str) -> VllmServerBackend:
    try:
        models = client.get("/v1/models")
    except ServerError as exc:
        raise ModelLoadError(str(exc)) from None
    served = [m for m in models.get("data", []) if isinstance(m, dict) and m.get("id")]
    if not served:
        raise ModelLoadError(f"the server at {url} serves no model")
    tokenizer, config = load_tokenizer(folder, name)
    length = served[0].get("max_model_len")
    backend = VllmServerBackend(
        client, str(served[0]["id"]), tokenizer, name,
        generation_eos(getattr(config, "eos_token_id", None)),
        int(getattr(config, "vocab_size", len(tokenizer))),
        max_context=length if isinstance(length, int) and length > 0 else None,
    )
    _check_tokenizer(backend, url)
    # Asked now, before any hole: vLLM's engine keeps the structured-output backend of the
    # first constrained request it gets (a regex one in "auto" mode picks xgrammar, which then
    # fails every llguidance grammar with a 500); the probe, a grammar only llguidance reads,
    # picks llguidance where the server can, and says so where it cannot.
    try:
        backend.reads_llguidance()
    except ServerError as exc:
        raise ModelLoadError(f"the server at {url} failed a one-token request: {exc}") from None
    return backend


def _check_tokenizer(backend: VllmServerBackend, url: str) -> None:
    # Token-id prompts only mean the same text if both sides share the vocabulary.
    probe = "qrun checks the tokenizer: Ünïcode, 12345, {\"json\": true}\n"
    try:
        reply = backend.client.post("/tokenize", {"model": backend.model_id, "prompt": probe,
                                                  "add_special_tokens": False})
    except ServerError:
        return  # an older server without /tokenize: nothing to compare
    if reply.get("tokens") != backend.encode(probe):
        raise ModelLoadError(
            f"the server at {url} serves '{backend.model_id}', whose tokenizer is not the one "
            f"of the local model '{backend.name}'; give the served model's folder with --model")
