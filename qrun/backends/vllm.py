"""The in-process vLLM adapter: the same Backend protocol as transformers, with vLLM's engine
doing the forwards, its paged KV cache and prefix caching carrying the context across
segments, and its scheduler batching every run in flight.

How a forward maps onto vLLM: a context is a vLLM request whose prompt is the context's token
ids (earlier segments come from vLLM's prefix cache, never re-encoded by qrun). A logits
processor registered on the engine hands each step's logits of qrun's requests to the run
that owns them and waits for its decision: the next token to append (the runtime sampled it,
with its own masks and sampler, so every constraint means exactly what it means on
transformers), or nothing more, which ends the request. Appending more than a few tokens at
once starts a new request on the longer prompt, whose prefix vLLM finds in its cache.

Only this module and vllm_engine.py (the engine thread, the live requests, the logits
processor) import vllm; it is an optional extra (`make vllm`)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from qrun.backends.base import (
    BatchForward,
    Capabilities,
    PromptScorer,
    ScoredRows,
    StepModel,
)
from qrun.backends.hf_tokenizer import HFTokenizerMixin, generation_eos, load_tokenizer
from qrun.backends.prefix_cache import PrefixCache
from qrun.backends.vllm_engine import (
    DECISION_TIMEOUT_S,
    EXTRA_KEY,
    Counts,
    Hub,
    Live,
    ScoreRequest,
    VllmError,
    decisions_processor,
)
from qrun.errors import ModelLoadError, UsageError

# vLLM's CPU attention works on blocks of a multiple of 32 positions (16 is refused); prefix
# caching reuses whole blocks only, so at most 31 trailing positions of a prompt are
# recomputed by a new request (docs/internals.md §9.2).
CPU_BLOCK_SIZE = 32
# Appending up to this many tokens to a live request forces them one step each; more start a
# new request (prefix-cache hit, up to 31 positions recomputed, plus the request's own cost).
FORCE_MAX = 4


class VllmCache:
    """A context as vLLM sees it: the token ids its next request starts with, and the live
    request that holds exactly those positions (None: the next forward starts one)."""

    def __init__(self, hub: Hub, token_ids: Sequence[int] = ()) -> None:
        self.hub = hub
        self.token_ids = list(token_ids)
        self.live: Live | None = None
        self.counts = Counts()

    def length(self) -> int:
        return len(self.token_ids)

    def crop(self, length: int) -> None:
        if length > len(self.token_ids):
            raise ValueError(f"cannot crop a {len(self.token_ids)}-position cache to {length}")
        if length < len(self.token_ids):
            self.release()
            del self.token_ids[length:]

    def fork(self) -> VllmCache:
        return VllmCache(self.hub, self.token_ids)

    def storages(self) -> list[tuple[int, int]]:
        return []  # the KV lives in vLLM's own block pool, under its own budget

    def release(self, wait: bool = False) -> None:
        """Let go of the live request (its next step ends it); with `wait`, until vLLM has
        finished it and reported its cached positions."""
        live, self.live = self.live, None
        if live is None:
            return
        with self.hub.cond:
            live.released = True
            self.hub.cond.notify_all()
        if wait:
            self.hub.let_go_of_idle()
            with self.hub.cond:
                self.hub.cond.wait_for(lambda: live.finished, timeout=DECISION_TIMEOUT_S)

    def __del__(self) -> None:
        # A context dropped while its request awaits a decision (a run's last context, a
        # particle given up) would hold every engine step until DECISION_TIMEOUT_S.
        if self.live is not None:
            self.release()

    def take_counts(self) -> tuple[int, int]:
        """(positions computed, positions served by vLLM's prefix cache) since the last call."""
        with self.hub.cond:
            return self.counts.take()


class VllmBackend(HFTokenizerMixin):
    """A model on vLLM's in-process engine (LLM with VLLM_ENABLE_V1_MULTIPROCESSING=0):
    token-level forwards, and select scoring through prompt log-probabilities."""

    kind = "vllm"

    # Runs share the engine directly: vLLM's scheduler batches whatever is in flight. A healed
    # token kept in the context until the model writes it again needs the logits of two
    # positions: a forced step of its own here (rpg: 7 of them, batch: 16), so healing takes the
    # token back instead.
    capabilities = Capabilities(batches_itself=True, heals_in_context=False, lookahead=False)

    def __init__(self, hub: Hub, tokenizer: Any, name: str, load_s: float = 0.0) -> None:
        self.hub = hub
        self.llm = llm = hub.llm
        self.tokenizer = tokenizer
        self.name = name
        self.load_s = load_s
        self.prefix_cache: PrefixCache | None = None  # vLLM's own prefix cache does this job
        config = llm.llm_engine.vllm_config.model_config
        self.device = "cpu" if _platform_is_cpu() else "cuda"
        self.dtype = str(config.dtype).removeprefix("torch.")
        self._vocab_size = int(config.get_vocab_size())
        self._eos = generation_eos(getattr(config.hf_config, "eos_token_id", None))
        self._markers: dict[str, tuple[str, str] | None] = {}

    @property
    def max_context(self) -> int:
        return self._max_len()

    def step_model(self) -> StepModel:
        return self

    def prompt_scorer(self) -> PromptScorer:
        return self

    def new_cache(self) -> VllmCache:
        return VllmCache(self.hub)

    def clear_cache(self) -> None:
        """Forget vLLM's cached prefixes."""
        self.hub.let_go_of_idle()
        self.hub.call(lambda llm: llm.reset_prefix_cache())

    def close(self) -> None:
        """Stop the engine thread (requests in flight fail)."""
        self.hub.close()

    def batch_forward(self) -> BatchForward:
        return self

    def forward(self, token_ids: Sequence[int], cache: Any, logits_for: int = 1
                ) -> npt.NDArray[np.float32]:
        return self.forward_batch([(token_ids, cache)], logits_for)[0]

    def forward_batch(self, items: Sequence[tuple[Sequence[int], Any]], logits_for: int = 1
                      ) -> list[npt.NDArray[np.float32]]:
        """Every item's tokens go to the engine before any result is waited for. One thread
        stepping several contexts (a run's particles) one forward after another would leave
        the others' requests awaiting its decision, holding each engine step until
        DECISION_TIMEOUT_S (measured: 4 particles on a 4-city hole took 82 s, now 1.2 s); given
        together they are also one batch of vLLM's."""
        for ids, cache in items:
            assert isinstance(cache, VllmCache)
            if not ids or not 1 <= logits_for <= len(ids):
                raise ValueError(f"cannot keep {logits_for} logits of {len(ids)} tokens")
        lives: list[Live] = []
        try:
            for ids, cache in items:
                lives.append(self._send(list(ids), cache, logits_for))
            self.hub.let_go_of_idle(keep=lives)
            results = []
            for (ids, cache), live in zip(items, lives, strict=True):
                results.append(self._wait(live))
                cache.token_ids.extend(ids)
                cache.live = live
            return results
        except BaseException:
            with self.hub.cond:  # none of them may be left awaiting a decision
                for live in lives:
                    live.released = True
                self.hub.cond.notify_all()
            raise

    def _send(self, ids: list[int], cache: VllmCache, logits_for: int) -> Live:
        """`ids` appended to the cache's live request (a few, forced one step each) or a new
        request on the cache's tokens and `ids`; the live request whose result is awaited."""
        hub, live = self.hub, cache.live
        with hub.cond:
            continuing = (live is not None and live.awaiting and not live.released
                          and len(ids) <= FORCE_MAX)
            if continuing:
                assert live is not None
                live.result, live.want = None, logits_for
                live.plan.extend(ids)
                live.owner = threading.get_ident()
                hub.cond.notify_all()
                return live
        cache.release()
        cut = len(ids) - (logits_for - 1)
        return self._start(cache.token_ids + ids[:cut], ids[cut:], logits_for, cache.counts)

    def _start(self, prompt: list[int], plan: list[int], want: int, counts: Counts) -> Live:
        from vllm import SamplingParams

        hub = self.hub
        request_id = hub.new_id("run")
        live = Live(request_id, counts, len(prompt), deque(plan), want)
        limit = self._max_len() - len(prompt)
        if limit < 1:
            raise VllmError(f"the context ({len(prompt)} tokens) fills the model's maximum "
                            f"length ({self._max_len()})")
        params = SamplingParams(
            max_tokens=limit, temperature=0.0, detokenize=False, stop_token_ids=[hub.eos],
            extra_args={EXTRA_KEY: request_id},
        )
        with hub.cond:
            hub.lives[request_id] = live
        hub.submit(request_id, prompt, params)
        return live

    def _wait(self, live: Live) -> npt.NDArray[np.float32]:
        hub = self.hub
        with hub.cond:
            hub.cond.wait_for(lambda: live.result is not None or live.finished)
            if live.result is None:
                raise VllmError(f"vLLM ended request {live.request_id} early: "
                                f"{live.error or 'it reached the maximum length'}")
            return live.result

    def score_continuations(
        self, context: Sequence[int], rows: Sequence[Sequence[int]]
    ) -> ScoredRows:
        """From vLLM's prompt log-probabilities: one request per row, run together (the
        context's blocks come from the prefix cache)."""
        context = list(context)
        scores = [self._score(context + list(row), fresh=False) for row in rows]
        self.hub.let_go_of_idle()
        outputs = [self._wait_score(score) for score in scores]
        results = [self._row_logprobs(output, len(context), row)
                   for output, row in zip(outputs, rows, strict=True)]
        for i, row in enumerate(rows):
            if results[i] is None:
                # Positions vLLM served from its cache have no prompt log-probability: score
                # this row again without reading the cache.
                outputs.append(self._wait_score(self._score(context + list(row), fresh=True)))
                results[i] = self._row_logprobs(outputs[-1], len(context), row)
        logprobs = []
        for values in results:
            if values is None:
                raise VllmError("vLLM returned no prompt log-probabilities for an option")
            logprobs.append(values)
        cached = sum(int(o.num_cached_tokens or 0) for o in outputs)
        computed = sum(len(o.prompt_token_ids) for o in outputs) - cached
        return ScoredRows(logprobs, computed, cached)

    def _score(self, prompt: list[int], fresh: bool) -> ScoreRequest:
        from vllm import SamplingParams

        hub = self.hub
        request_id = hub.new_id("score")
        score = ScoreRequest()
        params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                                prompt_logprobs=0, skip_reading_prefix_cache=fresh)
        with hub.cond:
            hub.scores[request_id] = score
        hub.submit(request_id, prompt, params)
        return score

    def _wait_score(self, score: ScoreRequest) -> Any:
        with self.hub.cond:
            self.hub.cond.wait_for(lambda: score.output is not None or score.error is not None)
        if score.error is not None:
            raise VllmError(f"vLLM could not score an option: {score.error}")
        return score.output

    @staticmethod
    def _row_logprobs(output: Any, start: int, row: Sequence[int]) -> list[float] | None:
        logprobs = output.prompt_logprobs or []
        values = []
        for k, token in enumerate(row):
            at = logprobs[start + k] if start + k < len(logprobs) else None
            if not at or token not in at:
                return None
            values.append(float(at[token].logprob))
        return values

    def _max_len(self) -> int:
        return int(self.llm.llm_engine.vllm_config.model_config.max_model_len)


def _platform_is_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def load_vllm(name: str, folder: str, device: str | None, dtype: str | None,
              max_model_len: int | None = None) -> VllmBackend:
    """Start vLLM's engine in this process on a HF folder (or hub id).

    Raises:
        ModelLoadError: vLLM is not installed, or cannot load the model.
        UsageError: a device or dtype vLLM cannot give here.
    """
    # In-process engine: the logits processor must share this process's objects, and on a
    # 2-core CPU the separate engine processes cost 20-35 s per start for nothing.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: ~23k positions of SmolLM2
    # vLLM logs to stdout by default, which would mix with qrun's output (--json).
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    started = time.perf_counter()
    with _quiet():
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ModelLoadError(
                f"the vllm backend needs vLLM ({exc}); install it with `make vllm` "
                "(vLLM's CPU build) or `pip install 'qrun[vllm]'`") from None
        return _load(LLM, name, folder, device, dtype, max_model_len, started)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """vLLM's import and start-up print notices to stdout and raise deprecation warnings;
    stdout is qrun's (text or --json), so they go to stderr, warnings to nowhere."""
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _load(LLM: Any, name: str, folder: str, device: str | None, dtype: str | None,
          max_model_len: int | None, started: float) -> VllmBackend:
    cpu = _platform_is_cpu()
    wanted = device or "auto"
    if wanted != "auto" and wanted.startswith("cuda") == cpu:
        raise UsageError(f"--device {wanted} was asked for, but this vLLM build runs on "
                         f"{'the CPU' if cpu else 'CUDA'}")
    tokenizer, config = load_tokenizer(folder, name)
    length = min(max_model_len or 8192, int(getattr(config, "max_position_embeddings", 8192)))
    holder: dict[str, Hub] = {}
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    kwargs: dict[str, Any] = dict(
        model=folder, tokenizer=folder, dtype=_vllm_dtype(dtype, cpu), seed=0,
        enforce_eager=True, enable_prefix_caching=True, enable_chunked_prefill=False,
        max_model_len=length, max_num_batched_tokens=length,
        logits_processors=[decisions_processor(holder)], disable_log_stats=True,
        use_tqdm_on_load=False,
    )
    if cpu:
        kwargs["block_size"] = CPU_BLOCK_SIZE
    if not getattr(config, "architectures", None):
        # Folders converted from GGUF before `architectures` was written: without it vLLM
        # resolves the base model class.
        kwargs["hf_overrides"] = {"architectures": [f"{type(config).__name__[:-6]}ForCausalLM"]}
    try:
        hub = holder["hub"] = Hub(lambda: LLM(**kwargs), int(eos))
    except Exception as exc:  # noqa: BLE001 - vLLM raises many kinds; the user gets one
        raise ModelLoadError(f"vLLM cannot load model '{name}': {exc}") from exc
    return VllmBackend(hub, tokenizer, name, time.perf_counter() - started)


def _vllm_dtype(dtype: str | None, cpu: bool) -> str:
    """The dtype to ask vLLM for: as for transformers, bfloat16 on CUDA and float32 on the CPU
    (vLLM's CPU build was faster in float32 too: bench/RESULTS.md, vLLM backend tables)."""
    from qrun.backends.transformers import DTYPES, default_dtype

    if dtype is None or dtype == "auto":
        return str(default_dtype("cpu" if cpu else "cuda")).removeprefix("torch.")
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype '{dtype}'; choose one of {', '.join(DTYPES)}")
    return dtype
