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

Only this module imports vllm; it is an optional extra (`make vllm`)."""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from qrun.backends.base import ScoredRows
from qrun.backends.hf_tokenizer import HFTokenizerMixin, generation_eos
from qrun.errors import BackendError, ModelLoadError, UsageError
from qrun.runtime.prefix_cache import PrefixCache

# vLLM's CPU attention works on blocks of a multiple of 32 positions (16 is refused); prefix
# caching reuses whole blocks only, so at most 31 trailing positions of a prompt are
# recomputed by a new request (shared/research/vllm-cpu.md).
CPU_BLOCK_SIZE = 32
# Appending up to this many tokens to a live request forces them one step each; more start a
# new request (prefix-cache hit, up to 31 positions recomputed, plus the request's own cost).
FORCE_MAX = 4
# A live request whose owner has not decided within this time is ended (the owner's next
# forward starts a new one): a safety net, never a change of results.
DECISION_TIMEOUT_S = 10.0
# The key in SamplingParams.extra_args that marks a request as driven by qrun.
_EXTRA_KEY = "qrun_request"


class VllmError(BackendError):
    """vLLM failed to run a request."""


@dataclass(eq=False)
class _Counts:
    """Positions vLLM computed and positions it served from its prefix cache, not yet taken
    into a run's stats."""

    computed: int = 0
    cached: int = 0

    def take(self) -> tuple[int, int]:
        out = (self.computed, self.cached)
        self.computed = self.cached = 0
        return out


@dataclass(eq=False)
class _Live:
    """One engine request and the conversation with its owner.

    The logits processor appends each step's logits to `window`; while `plan` holds tokens it
    forces the next one, else it delivers the last `want` rows as `result` and waits for the
    owner's next plan, or ends the request when the owner lets go (`released`).
    """

    request_id: str
    counts: _Counts
    prompt_len: int
    plan: deque[int] = field(default_factory=deque)
    want: int = 1
    window: list[torch.Tensor] = field(default_factory=list)
    result: torch.Tensor | None = None
    awaiting: bool = False  # delivered, waiting for the owner's decision
    released: bool = False
    finished: bool = False
    error: BaseException | None = None
    seen_output: bool = False


class _Hub:
    """The engine, its thread and every live request: the owners' threads talk to the engine
    thread only through `cond`-guarded state and the command list."""

    def __init__(self, build: Callable[[], Any], eos: int) -> None:
        self.eos = eos
        self.cond = threading.Condition()
        self.lives: dict[str, _Live] = {}
        self.scores: dict[str, _Score] = {}
        # Work for the engine thread, run between steps: vLLM's engine is not thread-safe.
        self.commands: list[Callable[[], None]] = []
        self.ids = itertools.count()
        self.closing = False
        self.llm: Any = None
        self.engine: Any = None
        self._build_error: BaseException | None = None
        ready = threading.Event()
        # vLLM's CPU worker binds the OpenMP threads of the thread that builds the engine;
        # driven from any other thread, every step ran ~40 % slower here (3.47 s against
        # 2.21-2.25 s for 64 tokens). So the engine thread builds it.
        self.thread = threading.Thread(target=self._run, args=(build, ready),
                                       name="qrun-vllm-engine", daemon=True)
        self.thread.start()
        ready.wait()
        if self._build_error is not None:
            raise self._build_error

    def _run(self, build: Callable[[], Any], ready: threading.Event) -> None:
        try:
            self.llm = build()
            self.engine = self.llm.llm_engine
        except BaseException as exc:  # noqa: BLE001 - raised again in the loading thread
            self._build_error = exc
            return
        finally:
            ready.set()
        self._serve()

    def new_id(self, kind: str) -> str:
        return f"qrun-{kind}-{next(self.ids)}"

    def submit(self, request_id: str, prompt: list[int], params: Any) -> None:
        """Add a request to the engine (in its thread, before its next step)."""
        from vllm.inputs import TokensPrompt

        def add() -> None:
            try:
                self.engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt),
                                        params)
            except Exception as exc:  # noqa: BLE001 - the owner gets it as its error
                self._fail(request_id, exc)

        self._command(add)

    def call(self, work: Callable[[Any], Any]) -> Any:
        """Run `work(llm)` in the engine thread between two steps and return its result."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["result"] = work(self.llm)
            except Exception as exc:  # noqa: BLE001 - raised again in the caller's thread
                box["error"] = exc
            done.set()

        self._command(run)
        done.wait()
        if "error" in box:
            raise box["error"]
        return box.get("result")

    def _command(self, work: Callable[[], None]) -> None:
        with self.cond:
            self.commands.append(work)
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self.thread.join(timeout=30)

    # --- the engine thread -------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self.cond:
                while not (self.commands or self.closing or self._busy()):
                    self.cond.wait()
                if self.closing and not self._busy():
                    return
                commands, self.commands = self.commands, []
            for work in commands:
                work()
            if self._busy():
                try:
                    outputs = self.engine.step()
                except Exception as exc:  # noqa: BLE001 - every waiting owner gets it
                    for request_id in list(self.lives) + list(self.scores):
                        self._fail(request_id, exc)
                    continue
                for output in outputs:
                    self._on_output(output)

    def _busy(self) -> bool:
        return bool(self.engine.has_unfinished_requests())

    def _on_output(self, output: Any) -> None:
        with self.cond:
            live = self.lives.get(output.request_id)
            if live is not None:
                if not live.seen_output:
                    live.seen_output = True
                    cached = int(output.num_cached_tokens or 0)
                    live.counts.cached += cached
                    live.counts.computed += live.prompt_len - cached
                if output.finished:
                    live.finished = True
                    self.lives.pop(output.request_id, None)
            score = self.scores.get(output.request_id)
            if score is not None and output.finished:
                score.output = output
                self.scores.pop(output.request_id, None)
            self.cond.notify_all()

    def _fail(self, request_id: str, exc: BaseException) -> None:
        with self.cond:
            target = self.lives.pop(request_id, None) or self.scores.pop(request_id, None)
            if target is not None:
                target.error = exc
                if isinstance(target, _Live):
                    target.finished = True
            self.cond.notify_all()

    # --- inside engine.step(), from the logits processor ---------------------------------

    def decide(self, rows: list[tuple[_Live, torch.Tensor]]) -> None:
        """Give every row's logits to its owner and force each request's next token: first
        all deliveries (the owners then sample in parallel), then all decisions."""
        forced: list[tuple[torch.Tensor, int]] = []
        waiting: list[tuple[_Live, torch.Tensor]] = []
        with self.cond:
            for live, row in rows:
                if live.released:
                    forced.append((row, self.eos))
                    continue
                live.window.append(row.detach().to("cpu", torch.float32, copy=True))
                if live.plan:
                    forced.append((row, live.plan.popleft()))
                    live.counts.computed += 1
                    continue
                live.result = torch.stack(live.window[-live.want:])  # [want, V]
                live.window = []
                live.awaiting = True
                waiting.append((live, row))
            self.cond.notify_all()
            deadline = time.monotonic() + DECISION_TIMEOUT_S
            for live, row in waiting:
                self.cond.wait_for(_decided(live), timeout=max(0.0, deadline - time.monotonic()))
                live.awaiting = False
                if live.plan and not live.released:
                    forced.append((row, live.plan.popleft()))
                    live.counts.computed += 1
                else:
                    live.released = True
                    forced.append((row, self.eos))
        for row, token in forced:
            row.fill_(float("-inf"))
            row[token] = 0.0


def _decided(live: _Live) -> Callable[[], bool]:
    return lambda: bool(live.plan) or live.released


@dataclass(eq=False)
class _Score:
    """A prompt-scoring request (select): its finished output, or its error."""

    output: Any = None
    error: BaseException | None = None


def _decisions_processor(holder: dict[str, _Hub]) -> type:
    """The logits processor class vLLM builds for this engine: rows of requests marked with
    _EXTRA_KEY go through the hub's decide(); every other request is left alone. The hub is
    made after the engine (it needs it), so the class finds it in `holder` when called."""
    from vllm.v1.sample.logits_processor import LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates

    class QrunDecisions(LogitsProcessor):
        def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
            self.rows: dict[int, _Live] = {}

        def is_argmax_invariant(self) -> bool:
            return False  # it decides the token: it must run for greedy requests too

        def update_state(self, batch_update: Any) -> None:
            def new_state(params: Any, prompt: Any, output: Any) -> _Live | None:
                key = (params.extra_args or {}).get(_EXTRA_KEY)
                return holder["hub"].lives.get(key) if key is not None else None

            process_dict_updates(self.rows, batch_update, new_state)

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            rows = [(live, logits[index]) for index, live in sorted(self.rows.items())
                    if index < logits.shape[0]]
            if rows:
                holder["hub"].decide(rows)
            return logits

    return QrunDecisions


class VllmCache:
    """A context as vLLM sees it: the token ids its next request starts with, and the live
    request that holds exactly those positions (None: the next forward starts one)."""

    def __init__(self, hub: _Hub, token_ids: Sequence[int] = ()) -> None:
        self.hub = hub
        self.token_ids = list(token_ids)
        self.live: _Live | None = None
        self.counts = _Counts()

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
                self.hub.cond.wait_for(lambda: live.finished, timeout=DECISION_TIMEOUT_S)

    def take_counts(self) -> tuple[int, int]:
        """(positions computed, positions served by vLLM's prefix cache) since the last call."""
        with self.hub.cond:
            return self.counts.take()


class VllmBackend(HFTokenizerMixin):
    """A model on vLLM's in-process engine (LLM with VLLM_ENABLE_V1_MULTIPROCESSING=0)."""

    # Runs share the engine directly: vLLM's scheduler batches whatever is in flight.
    batches_itself = True

    def __init__(self, hub: _Hub, tokenizer: Any, name: str, load_s: float = 0.0) -> None:
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
    def vocab_size(self) -> int:
        return self._vocab_size

    def _generation_eos(self) -> list[int]:
        return self._eos

    def new_cache(self) -> VllmCache:
        return VllmCache(self.hub)

    def clear_cache(self) -> None:
        """Forget vLLM's cached prefixes."""
        self.hub.call(lambda llm: llm.reset_prefix_cache())

    def close(self) -> None:
        """Stop the engine thread (requests in flight fail)."""
        self.hub.close()

    def forward(self, token_ids: Sequence[int], cache: Any, logits_for: int = 1) -> torch.Tensor:
        assert isinstance(cache, VllmCache)
        if not token_ids or not 1 <= logits_for <= len(token_ids):
            raise ValueError(f"cannot keep {logits_for} logits of {len(token_ids)} tokens")
        hub, ids = self.hub, list(token_ids)
        live = cache.live
        with hub.cond:
            continuing = (live is not None and live.awaiting and not live.released
                          and len(ids) <= FORCE_MAX)
            if continuing:
                assert live is not None
                live.result, live.want = None, logits_for
                live.plan.extend(ids)
                hub.cond.notify_all()
        if not continuing:
            cache.release()
            cut = len(ids) - (logits_for - 1)
            live = self._start(cache.token_ids + ids[:cut], ids[cut:], logits_for, cache.counts)
        assert live is not None
        logits = self._wait(live)
        cache.token_ids.extend(ids)
        cache.live = live
        return logits

    def _start(self, prompt: list[int], plan: list[int], want: int, counts: _Counts) -> _Live:
        from vllm import SamplingParams

        hub = self.hub
        request_id = hub.new_id("run")
        live = _Live(request_id, counts, len(prompt), deque(plan), want)
        limit = self._max_len() - len(prompt)
        if limit < 1:
            raise VllmError(f"the context ({len(prompt)} tokens) fills the model's maximum "
                            f"length ({self._max_len()})")
        params = SamplingParams(
            max_tokens=limit, temperature=0.0, detokenize=False, stop_token_ids=[hub.eos],
            extra_args={_EXTRA_KEY: request_id},
        )
        with hub.cond:
            hub.lives[request_id] = live
        hub.submit(request_id, prompt, params)
        return live

    def _wait(self, live: _Live) -> torch.Tensor:
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

    def _score(self, prompt: list[int], fresh: bool) -> _Score:
        from vllm import SamplingParams

        hub = self.hub
        request_id = hub.new_id("score")
        score = _Score()
        params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                                prompt_logprobs=0, skip_reading_prefix_cache=fresh)
        with hub.cond:
            hub.scores[request_id] = score
        hub.submit(request_id, prompt, params)
        return score

    def _wait_score(self, score: _Score) -> Any:
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
    from transformers import AutoConfig, AutoTokenizer

    cpu = _platform_is_cpu()
    wanted = device or "auto"
    if wanted != "auto" and wanted.startswith("cuda") == cpu:
        raise UsageError(f"--device {wanted} was asked for, but this vLLM build runs on "
                         f"{'the CPU' if cpu else 'CUDA'}")
    try:
        config = AutoConfig.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load model '{name}': {exc}") from exc
    length = min(max_model_len or 8192, int(getattr(config, "max_position_embeddings", 8192)))
    holder: dict[str, _Hub] = {}
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    kwargs: dict[str, Any] = dict(
        model=folder, tokenizer=folder, dtype=_vllm_dtype(dtype, cpu), seed=0,
        enforce_eager=True, enable_prefix_caching=True, enable_chunked_prefill=False,
        max_model_len=length, max_num_batched_tokens=length,
        logits_processors=[_decisions_processor(holder)], disable_log_stats=True,
        use_tqdm_on_load=False,
    )
    if cpu:
        kwargs["block_size"] = CPU_BLOCK_SIZE
    if not getattr(config, "architectures", None):
        # Folders converted from GGUF before `architectures` was written: without it vLLM
        # resolves the base model class.
        kwargs["hf_overrides"] = {"architectures": [f"{type(config).__name__[:-6]}ForCausalLM"]}
    try:
        hub = holder["hub"] = _Hub(lambda: LLM(**kwargs), int(eos))
    except Exception as exc:  # noqa: BLE001 - vLLM raises many kinds; the user gets one
        raise ModelLoadError(f"vLLM cannot load model '{name}': {exc}") from exc
    return VllmBackend(hub, tokenizer, name, time.perf_counter() - started)


def _vllm_dtype(dtype: str | None, cpu: bool) -> str:
    """The dtype to ask vLLM for: as for transformers, bfloat16 where the hardware has native
    kernels for it (CUDA; CPUs with AVX512-BF16/AMX), else float32."""
    from qrun.backends.transformers import DTYPES, default_dtype

    if dtype is None or dtype == "auto":
        return str(default_dtype("cpu" if cpu else "cuda")).removeprefix("torch.")
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype '{dtype}'; choose one of {', '.join(DTYPES)}")
    return dtype
