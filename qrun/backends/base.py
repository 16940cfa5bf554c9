"""The interface between the runtime and a loaded model. Every backend has the tokenizer half
(`Backend`) and declares how holes can be filled on it: a `StepModel` (token-level forwards over
an opaque KV cache, so the runtime's own sampling loop fills holes) or a `HoleSampler` (a server
that samples a whole hole per request, which the runtime replays and checks), plus optional
faster ways to score `select` options (`TreeScorer`, `PromptScorer`), to batch forwards
(`BatchForward`) and to score several runs' trees in one forward (`TreeBatch`). The runtime
chooses its strategies from these declarations once per run; a new kind of backend is one new
adapter class."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from qrun.backends.kv_cache import KVCache

if TYPE_CHECKING:
    from qrun.backends.chat_template import ToolCallFormat, ToolTurn
    from qrun.backends.prefix_cache import PrefixCache
    from qrun.constraint import Vocabulary

__all__ = [
    "Backend", "BackendDefaults", "BatchForward", "Capabilities", "Completion", "HoleSampler",
    "KVCache", "PromptScorer", "ScoredRows", "StepModel", "TreeBatch", "TreeScorer",
]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """How a backend behaves, declared by its adapter class.

    batches_itself: runs may call it concurrently and it batches what is in flight (vLLM's
        scheduler, a server); otherwise batched runs meet in the runtime's scheduler.
    heals_in_context: one forward can return the logits of two positions, so a healed token may
        stay in the context until the model writes it again (no extra forward); otherwise it is
        taken back before the hole.
    lookahead: one forward over several new tokens returns the logits after each at little
        more than the cost of one, so guessed tokens can be checked for free (speculation).
    draft_cost: what each guessed token adds to a forward, as a share of a one-token forward;
        speculation holds back while the model accepts a smaller share of the guesses
        (runtime/speculate.py). 0: always guess.
    """

    batches_itself: bool = False
    heals_in_context: bool = True
    lookahead: bool = True
    draft_cost: float = 0.0


class StepModel(Protocol):
    """Token-level forwards: the runtime samples every token itself (masks, stop strings)."""

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """KV snapshots and logits shared by every run on this model (thread-safe; None: off)."""
        ...

    def new_cache(self) -> KVCache:
        """An empty KV cache on the model's device."""
        ...

    def forward(
        self, token_ids: Sequence[int], cache: KVCache, logits_for: int = 1
    ) -> npt.NDArray[np.float32]:
        """Feed `token_ids` after the cache's positions, extending the cache in place.

        Returns the float32 logits of the last `logits_for` positions, shape [logits_for, V],
        as a numpy array on the CPU whatever the model's device: masks and sampling are numpy
        (runtime/sampler.py), so the runtime never imports torch itself.
        """
        ...


class BatchForward(Protocol):
    """One forward for several independent contexts (batched runs)."""

    def forward_batch(
        self, items: Sequence[tuple[Sequence[int], KVCache]], logits_for: int = 1
    ) -> list[npt.NDArray[np.float32]]:
        """Item i feeds token_ids_i on top of cache_i (caches of any lengths), each cache
        extended as if fed alone. Returns each item's logits of its last `logits_for`
        positions, [logits_for, V]."""
        ...


@dataclass(frozen=True, slots=True)
class ScoredRows:
    """Per row, the log-probability of each of its tokens in context; and the positions the
    backend computed and served from its own cache to get them."""

    logprobs: list[list[float]]
    computed: int
    cached: int


@dataclass(frozen=True, slots=True)
class Completion:
    """One hole sampled by a server: the tokens (an end-of-sequence token not included), their
    log-probabilities, why it ended ("stop": a stop string, "eos", or "length"), and the
    positions it computed / served from its prefix cache when it reports them."""

    token_ids: list[int]
    logprobs: list[float | None]
    finish: str
    computed: int
    cached: int


class HoleSampler(Protocol):
    """Backends that sample a whole hole per request (a vLLM server)."""

    def complete(self, prompt: Sequence[int], max_tokens: int, *, temperature: float,
                 top_p: float, top_k: int, seed: int, stop: Sequence[str] = (),
                 regex: str | None = None, grammar: str | None = None,
                 stop_token_ids: Sequence[int] = (),
                 extra: Mapping[str, object] | None = None) -> Completion:
        """Sample up to max_tokens after `prompt` (token ids), under `regex` (the server's
        dialect) or `grammar` (llguidance's Lark) when given, ending at a stop string or after
        one of `stop_token_ids` (which is returned) when given. `extra`: more sampling fields
        by the names of vLLM's completions API (min_p, the penalties, logit_bias)."""
        ...

    def reads_llguidance(self) -> bool:
        """Whether the server samples `grammar` requests with llguidance (so its values
        follow qrun's json= and grammar= holes exactly)."""
        ...


class PromptScorer(Protocol):
    """Scores continuations through prompt log-probabilities (vLLM)."""

    def score_continuations(
        self, context: Sequence[int], rows: Sequence[Sequence[int]]
    ) -> ScoredRows:
        """The log-probability of each token of each row, following `context`."""
        ...


class TreeScorer(Protocol):
    """Scores a tree of continuations of one cache in a single forward (select: options
    sharing leading tokens share their positions)."""

    def forward_tree(
        self, token_ids: Sequence[int], parents: Sequence[int], cache: KVCache
    ) -> tuple[npt.NDArray[np.float32], KVCache]:
        """Feed `token_ids` as a tree after the cache's positions: node i follows node
        `parents[i]` (an earlier node; -1: the cache's last position) and sees only the cache
        and its own ancestors. `cache` is left unchanged. Returns the logits after each node,
        [n, V], and a cache holding the cache's positions then every node."""
        ...

    def keep_path(self, tree: KVCache, length: int, path: Sequence[int]) -> KVCache:
        """From a cache returned by forward_tree over a `length`-position cache: the cache of
        those positions followed by the nodes `path` (a root-to-node chain), in order."""
        ...


class TreeBatch(Protocol):
    """Several trees, each on its own cache, in one forward (the trees of batched runs)."""

    def forward_trees(
        self, items: Sequence[tuple[Sequence[int], Sequence[int], KVCache]]
    ) -> Sequence[tuple[npt.NDArray[np.float32], KVCache]]:
        """Item i is (token_ids, parents, cache) as TreeScorer.forward_tree takes them; each
        result is what forward_tree returns for it (the logits after each node, [n, V], and
        a cache of the cache's positions then every node), every cache left unchanged."""
        ...


class Backend(Protocol):
    """A loaded model: its tokenizer and what it can do. Long-lived and read-only apart from
    its caches (thread-safe): many runs may share one backend."""

    name: str
    kind: str  # the adapter, as --backend names it: transformers, llamacpp, vllm, vllm-server
    device: str
    dtype: str
    load_s: float
    capabilities: Capabilities

    @property
    def max_context(self) -> int | None:
        """The most positions a context may hold (the model's maximum length), if known."""
        ...

    @property
    def vocab_size(self) -> int:
        """Width of the logits (may exceed the tokenizer's length)."""
        ...

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Tokens that end generation."""
        ...

    @property
    def start_token_id(self) -> int:
        """The token fed when logits are needed and the context is still empty."""
        ...

    @property
    def vocabulary(self) -> Vocabulary:
        """Token bytes for masks, stop strings and decoding (built once per backend)."""
        ...

    def encode(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids of `text` alone, no BOS/EOS added. The text of a special token inside it
        (`<|im_end|>`) is encoded as ordinary text unless `special` is set, which only the
        template's fixed text and chat markers get (docs/language.md §14.2)."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of token ids (special tokens skipped)."""
        ...

    @property
    def control_tokens(self) -> Mapping[str, int]:
        """The text of each control token that `encode(..., special=True)` reads as that token
        and plain `encode` as ordinary text (`<|im_end|>`): where the template's own text is cut
        before its runs of ordinary text are encoded (runtime/stretch.py)."""
        ...

    def chat_markers(self, role: str) -> tuple[str, str] | None:
        """The text the model's chat template puts before and after a `role` message, or None
        when the model has no chat template."""
        ...

    def tool_call_format(self) -> ToolCallFormat | None:
        """How the model writes a tool call, read from its chat template
        (backends/chat_template.py), or None: no template, or one without tool calls."""
        ...

    def tools_turn(self, tools: list[dict[str, Any]]) -> ToolTurn | None:
        """A system turn with `tools` (OpenAI's function format) as the chat template renders
        it, or None where the model has no chat template or its template ignores tools."""
        ...

    def clear_cache(self) -> None:
        """Forget every cached prefix (KV snapshots, logits; a server's or engine's own)."""
        ...

    def step_model(self) -> StepModel | None:
        """Token-level forwards, or None where the backend only samples whole holes."""
        ...

    def hole_sampler(self) -> HoleSampler | None:
        """Whole-hole sampling (a server), or None."""
        ...

    def batch_forward(self) -> BatchForward | None:
        """One forward for several contexts, or None (batched runs then take turns)."""
        ...

    def tree_scorer(self) -> TreeScorer | None:
        """Select scoring in one tree-shaped forward, or None."""
        ...

    def tree_batch(self) -> TreeBatch | None:
        """Several runs' trees in one forward, or None (they then take turns)."""
        ...

    def prompt_scorer(self) -> PromptScorer | None:
        """Select scoring through prompt log-probabilities, or None."""
        ...


class Encode(Protocol):
    """A backend's `encode`."""

    def __call__(self, text: str, *, special: bool = False) -> list[int]:
        ...


class BackendDefaults:
    """What an adapter has unless it says otherwise: no optional engine, no cache to clear, no
    known maximum length. Adapters subclass it and override what they declare."""

    capabilities = Capabilities()
    kind = "custom"

    @property
    def max_context(self) -> int | None:
        return None

    def clear_cache(self) -> None:
        pass

    def step_model(self) -> StepModel | None:
        return None

    def hole_sampler(self) -> HoleSampler | None:
        return None

    def batch_forward(self) -> BatchForward | None:
        return None

    def tree_scorer(self) -> TreeScorer | None:
        return None

    def tree_batch(self) -> TreeBatch | None:
        return None

    def prompt_scorer(self) -> PromptScorer | None:
        return None


def control_tokens_of(encode: Encode, candidates: Mapping[int, str]) -> dict[str, int]:
    """Backend.control_tokens from a backend's `encode` and the texts of candidate ids (a
    tokenizer's added tokens): the ones that encode to their own id only when special tokens
    are read (a token read either way, or never, is no control token of the template's)."""
    found: dict[str, int] = {}
    for token_id, text in candidates.items():
        if text and encode(text, special=True) == [token_id] and encode(text) != [token_id]:
            found[text] = token_id
    return found
