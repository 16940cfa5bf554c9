"""The machinery under the in-process vLLM backend (backends/vllm.py): the engine thread that
owns vLLM's LLMEngine, the live requests that hold a run's context, and the logits processor
that hands each step's logits to the run owning the request and forces the token it chose.

Threads: every run (the caller's thread, or one per run in a batch) talks to the engine thread
only through `Hub.cond`-guarded state and the command list; vLLM's engine is only ever touched
from the engine thread, which also built it (vLLM binds that thread's OpenMP threads)."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from qrun.errors import BackendError

# A live request whose owner has not decided within this time is ended (the owner's next
# forward starts a new one): a safety net, never a change of results.
DECISION_TIMEOUT_S = 10.0
# The key in SamplingParams.extra_args that marks a request as driven by qrun.
EXTRA_KEY = "qrun_request"


class VllmError(BackendError):
    """vLLM failed to run a request."""


@dataclass(eq=False)
class Counts:
    """Positions vLLM computed and positions it served from its prefix cache, not yet taken
    into a run's stats."""

    computed: int = 0
    cached: int = 0

    def take(self) -> tuple[int, int]:
        out = (self.computed, self.cached)
        self.computed = self.cached = 0
        return out


@dataclass(eq=False)
class Live:
    """One engine request and the conversation with its owner.

    The logits processor appends each step's logits to `window`; while `plan` holds tokens it
    forces the next one, else it delivers the last `want` rows as `result` and waits for the
    owner's next plan, or ends the request when the owner lets go (`released`).
    """

    request_id: str
    counts: Counts
    prompt_len: int
    plan: deque[int] = field(default_factory=deque)
    want: int = 1
    window: list[npt.NDArray[np.float32]] = field(default_factory=list)
    result: npt.NDArray[np.float32] | None = None
    awaiting: bool = False  # delivered, waiting for the owner's decision
    released: bool = False
    finished: bool = False
    error: BaseException | None = None
    seen_output: bool = False
    owner: int = field(default_factory=threading.get_ident)  # the thread that last sent on it


class Hub:
    """The engine, its thread and every live request: the owners' threads talk to the engine
    thread only through `cond`-guarded state and the command list."""

    def __init__(self, build: Callable[[], Any], eos: int) -> None:
        self.eos = eos
        self.cond = threading.Condition()
        self.lives: dict[str, Live] = {}
        self.scores: dict[str, ScoreRequest] = {}
        # Work for the engine thread, run between steps: vLLM's engine is not thread-safe.
        self.commands: list[Callable[[], None]] = []
        self.ids = itertools.count()
        self.closing = False
        # Requests ended by DECISION_TIMEOUT_S: each held every engine step that long. Zero
        # unless an owner stalls (tests/test_vllm.py test_no_request_is_left_holding_the_engine).
        self.timed_out = 0
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

    def let_go_of_idle(self, keep: Collection[Live] = ()) -> None:
        """Before this thread waits on the engine: end its live requests but `keep`. It cannot
        decide for them while it waits, and one awaiting a decision holds every engine step
        until DECISION_TIMEOUT_S (a run's particles stepped by one thread, a context left while
        its forks run, a select scored while the hole's context waits). Their contexts start a
        request on the prefix cache at their next forward."""
        me = threading.get_ident()
        with self.cond:
            for live in self.lives.values():
                if live.owner == me and not live.released and live not in keep:  # Live: eq=False
                    live.released = True
            self.cond.notify_all()

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
                if isinstance(target, Live):
                    target.finished = True
            self.cond.notify_all()

    # --- inside engine.step(), from the logits processor ---------------------------------

    def decide(self, rows: list[tuple[Live, torch.Tensor]]) -> None:
        """Give every row's logits to its owner and force each request's next token: first
        all deliveries (the owners then sample in parallel), then all decisions."""
        forced: list[tuple[torch.Tensor, int]] = []
        waiting: list[tuple[Live, torch.Tensor]] = []
        with self.cond:
            for live, row in rows:
                if live.released:
                    forced.append((row, self.eos))
                    continue
                live.window.append(row.detach().to("cpu", torch.float32, copy=True).numpy())
                if live.plan:
                    forced.append((row, live.plan.popleft()))
                    live.counts.computed += 1
                    continue
                live.result = np.stack(live.window[-live.want:])  # [want, V]
                live.window = []
                live.awaiting = True
                waiting.append((live, row))
            self.cond.notify_all()
            deadline = time.monotonic() + DECISION_TIMEOUT_S
            for live, row in waiting:
                if not self.cond.wait_for(_decided(live),
                                          timeout=max(0.0, deadline - time.monotonic())):
                    self.timed_out += 1
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


def _decided(live: Live) -> Callable[[], bool]:
    return lambda: bool(live.plan) or live.released


@dataclass(eq=False)
class ScoreRequest:
    """A prompt-scoring request (select): its finished output, or its error."""

    output: Any = None
    error: BaseException | None = None


def decisions_processor(holder: dict[str, Hub]) -> type:
    """The logits processor class vLLM builds for this engine: rows of requests marked with
    EXTRA_KEY go through the hub's decide(); every other request is left alone. The hub is
    made after the engine (it needs it), so the class finds it in `holder` when called."""
    from vllm.v1.sample.logits_processor import LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates

    class QrunDecisions(LogitsProcessor):
        def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
            self.rows: dict[int, Live] = {}

        def is_argmax_invariant(self) -> bool:
            return False  # it decides the token: it must run for greedy requests too

        def update_state(self, batch_update: Any) -> None:
            def new_state(params: Any, prompt: Any, output: Any) -> Live | None:
                key = (params.extra_args or {}).get(EXTRA_KEY)
                return holder["hub"].lives.get(key) if key is not None else None

            process_dict_updates(self.rows, batch_update, new_state)

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            rows = [(live, logits[index]) for index, live in sorted(self.rows.items())
                    if index < logits.shape[0]]
            if rows:
                holder["hub"].decide(rows)
            return logits

    return QrunDecisions


