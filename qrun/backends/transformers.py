"""The transformers adapter: the only module that imports transformers or touches its Cache
classes. Wraps a causal LM and its tokenizer behind the Backend protocol."""

from __future__ import annotations

import copy
import functools
import inspect
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from qrun.backends.base import BatchForward, StepModel, TreeBatch, TreeScorer
from qrun.backends.hf_tokenizer import HFTokenizerMixin, generation_eos
from qrun.backends.loading import quiet_transformers
from qrun.backends.packed_linear import can_pack, pack_linear_layers
from qrun.backends.prefix_cache import PrefixCache
from qrun.errors import ModelLoadError, UsageError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@functools.cache
def _masked_gqa_on_cpu() -> None:
    """Make transformers' SDPA attention let SDPA read grouped KV heads (enable_gqa) under an
    attention mask on a CPU, as it already does without a mask, instead of copying every KV
    head for each query head first (repeat_kv). Masks come with batched forwards (left
    padding: forward_batch) and token trees: 8 rows over a 1k-token context (SmolLM2, one
    thread) take 0.4 s instead of 0.8-1.4 s, with the same logits (max |diff| 3e-5 either
    way). Elsewhere (CUDA, where a mask with enable_gqa leaves the fast kernels) and for
    anything else transformers' own function runs unchanged. Registered once per process."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                  dropout: float = 0.0, scaling: float | None = None,
                  is_causal: bool | None = None, **kwargs: Any) -> tuple[Any, None]:
        if (attention_mask is None or getattr(module, "num_key_value_groups", 1) == 1
                or query.device.type != "cpu" or dropout or kwargs.get("output_attentions")
                or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None):
            result: tuple[Any, None] = sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                is_causal=is_causal, **kwargs)
            return result
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("sdpa", attention)


class TransformersCache:
    """A transformers DynamicCache behind the KVCache protocol."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def length(self) -> int:
        return int(self.cache.get_seq_length())

    def crop(self, length: int) -> None:
        remove = self.length() - length
        if remove < 0:
            raise ValueError(f"cannot crop a {self.length()}-position cache to {length}")
        if remove:
            # transformers 5.x refuses positive arguments: crop(-k) drops the last k positions.
            self.cache.crop(-remove)

    def fork(self) -> TransformersCache:
        # Shallow copies of the layers share their tensors: update() concatenates into new
        # tensors and crop() takes views, so neither side can change the other's positions.
        clone = copy.copy(self.cache)
        clone.layers = [copy.copy(layer) for layer in self.cache.layers]
        return TransformersCache(clone)

    def storages(self) -> list[tuple[int, int]]:
        found: dict[int, int] = {}
        for layer in self.cache.layers:
            for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if tensor is None or tensor.numel() == 0:
                    continue
                storage = tensor.untyped_storage()
                found[storage.data_ptr()] = storage.nbytes()
        return list(found.items())

    def release(self, wait: bool = False) -> None:
        pass  # nothing is held between forwards

    def take_counts(self) -> None:
        return None  # a forward computes exactly the tokens it is given


class TransformersBackend(HFTokenizerMixin):
    """A causal LM and its tokenizer from transformers, on one device: token-level forwards,
    batched forwards and tree-shaped forwards for select."""

    kind = "transformers"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        name: str,
        load_s: float = 0.0,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.model = model
        self.prefix_cache = prefix_cache
        self.tokenizer = tokenizer
        _masked_gqa_on_cpu()
        self.name = name
        self.device = str(next(model.parameters()).device)
        self.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.load_s = load_s
        self._markers: dict[str, tuple[str, str] | None] = {}
        self._cache_kw = cache_argument(model)
        # The rows of the last batched forward when they all ended at its last position:
        # the next one over the same caches, untouched since, reuses its KV (_reusable_batch).
        self._last_rows: list[_BatchRow] = []
        self.stacked_batches = 0  # batched forwards that stacked their rows' KV anew
        # What one more forward costs, in padded token positions (forward_batch's groups).
        # On the CPU, SmolLM2 with 2 threads: 8 rows of 2 tokens took 54 ms and 8 of 31
        # tokens 190 ms, so a forward costs ~45 ms and a position ~0.6 ms: ~77 positions. On
        # a GPU a small batch's forward is bound by its kernel launches, not its positions.
        self.call_cost_positions = 64 if self.device == "cpu" else 2048
        self._rows_lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        # out_features: the head may be a PackedLinear (qrun/backends/packed_linear.py).
        return int(self.model.get_output_embeddings().out_features)

    @property
    def max_context(self) -> int | None:
        length = getattr(self.model.config, "max_position_embeddings", None)
        return int(length) if isinstance(length, int) else None

    def _generation_eos(self) -> list[int]:
        return generation_eos(getattr(self.model.generation_config, "eos_token_id", None))

    def step_model(self) -> StepModel:
        return self

    def batch_forward(self) -> BatchForward:
        return self

    def tree_scorer(self) -> TreeScorer:
        return self

    def tree_batch(self) -> TreeBatch:
        return self

    def clear_cache(self) -> None:
        """Forget every KV snapshot and cached logits of the prefix cache."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def new_cache(self) -> TransformersCache:
        from transformers import DynamicCache

        return TransformersCache(DynamicCache(config=self.model.config))

    def forward(
        self, token_ids: Sequence[int], cache: Any, logits_for: int = 1
    ) -> npt.NDArray[np.float32]:
        assert isinstance(cache, TransformersCache)
        start = cache.length()
        device = self.model.device
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
        # Explicit positions: the cache may have been cropped, so they are not implied.
        positions = torch.arange(start, start + len(token_ids), device=device).unsqueeze(0)
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                position_ids=positions,
                **{self._cache_kw: cache.cache},
                use_cache=True,
                logits_to_keep=logits_for,
            )
        return _host(out.logits[0, -logits_for:, :])  # [logits_for, V]

    def forward_batch(
        self, items: Sequence[tuple[Sequence[int], Any]], logits_for: int = 1
    ) -> list[npt.NDArray[np.float32]]:
        """Item i feeds token_ids_i on top of cache_i (caches of any lengths), and each cache
        is extended as if fed alone. Returns each item's logits of its last `logits_for`
        positions, [logits_for, V].

        Rows are padded to the longest row's new tokens, so the items run in the groups
        (`padding_groups`) that cost least: one forward when their lengths are alike, the
        runs that decode one token apart from one that reads a line of fixed text."""
        groups = padding_groups([len(ids) for ids, _ in items], self.call_cost_positions)
        if len(groups) == 1:
            return self._forward_padded(items, logits_for)
        logits: list[npt.NDArray[np.float32]] = [np.empty(0, np.float32)] * len(items)
        for group in groups:
            for index, row in zip(group, self._forward_padded([items[i] for i in group],
                                                              logits_for), strict=True):
                logits[index] = row
        return logits

    def _forward_padded(
        self, items: Sequence[tuple[Sequence[int], Any]], logits_for: int
    ) -> list[npt.NDArray[np.float32]]:
        """One forward for several independent contexts, as forward_batch.

        Caches are left-padded to a common length and new tokens right-padded; a 2-D attention
        mask hides the padding and explicit positions keep each row's own numbering. Each
        cache afterwards holds views of its row of the batched KV (no copy).
        """
        caches = [cache for _, cache in items]
        assert all(isinstance(c, TransformersCache) for c in caches)
        past = [c.length() for c in caches]
        new = [len(ids) for ids, _ in items]
        width_past, width_new = max(past), max(new)
        device = self.model.device
        pad = self.start_token_id
        input_ids = torch.tensor(
            [list(ids) + [pad] * (width_new - len(ids)) for ids, _ in items], device=device
        )
        attention = torch.zeros(len(items), width_past + width_new, dtype=torch.long,
                                device=device)
        positions = torch.zeros(len(items), width_new, dtype=torch.long, device=device)
        for i, (p, n) in enumerate(zip(past, new, strict=True)):
            attention[i, width_past - p : width_past + n] = 1
            positions[i] = torch.arange(p, p + width_new, device=device)
        batched = self._reusable_batch(caches, width_past)
        if batched is None:
            batched = self._stack_caches(caches, width_past)
        # The output layer runs only at the positions some row wants logits for: each row's
        # last `logits_for` (its new tokens end at different places, rows being right-padded).
        # Over the whole width, 8 rows padded to 31 tokens computed 248 rows of SmolLM2's
        # 49k-word output layer: 225 ms a forward on 2 cores, 190 ms with the 8 it needs.
        wanted = [range(max(0, n - logits_for), n) for n in new]
        keep = sorted({j for rows in wanted for j in rows})
        column = {j: c for c, j in enumerate(keep)}
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention,
                position_ids=positions,
                **{self._cache_kw: batched},
                use_cache=True,
                logits_to_keep=torch.tensor(keep, device=device),
            )
        _hold_rows(caches, batched, width_past, past, new)
        rows = [_BatchRow.of(c) for c in caches] if len(set(new)) == 1 else []
        with self._rows_lock:
            self._last_rows = rows
        logits = _host(out.logits)  # [B, len(keep), V]
        return [logits[i, [column[j] for j in rows]] for i, rows in enumerate(wanted)]

    def _reusable_batch(self, caches: Sequence[TransformersCache], width: int) -> Any:
        """The batched KV of the last forward_batch, when these are its caches in its order,
        each untouched since (still holding the views of its row that forward_batch left) and
        all ending at its last position: then the batch holds exactly their positions, each
        row left-padded to `width`, and stacking them again (a copy of every row's KV, as long
        as the model's own step on a 1k-token context) is not needed. Decoding branches or
        batched runs step after step reuse it until a row leaves or is changed. None
        otherwise."""
        from transformers import DynamicCache

        with self._rows_lock:
            rows = self._last_rows
        if len(rows) != len(caches) or not all(
                row.holds(cache) for row, cache in zip(rows, caches, strict=True)):
            return None
        batched = DynamicCache(config=self.model.config)
        for index, layer in enumerate(batched.layers):
            row = caches[0].cache.layers[index]
            keys = _whole_batch(row.keys, len(caches), width)
            values = _whole_batch(row.values, len(caches), width)
            if keys is None or values is None:
                return None
            _set_layer(layer, keys, values)
        return batched

    def _stack_caches(self, caches: Sequence[TransformersCache], width: int) -> Any:
        from transformers import DynamicCache

        batched = DynamicCache(config=self.model.config)
        self.stacked_batches += 1
        if width == 0:
            return batched
        for index, layer in enumerate(batched.layers):
            keys, values = [], []
            for cache in caches:
                source = cache.cache.layers[index]
                k, v = _layer_tensors(source, self._empty_kv_shape(), self.model)
                keys.append(_left_pad(k, width))
                values.append(_left_pad(v, width))
            _set_layer(layer, torch.cat(keys), torch.cat(values))
        return batched

    def _empty_kv_shape(self) -> tuple[int, int, int, int]:
        """[batch 1, KV heads, 0 positions, head dim]: a layer that holds nothing yet."""
        config = self.model.config
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = (getattr(config, "head_dim", None)
                    or config.hidden_size // config.num_attention_heads)
        return (1, heads, 0, head_dim)

    def forward_tree(
        self, token_ids: Sequence[int], parents: Sequence[int], cache: Any
    ) -> tuple[npt.NDArray[np.float32], TransformersCache]:
        assert isinstance(cache, TransformersCache)
        prefix, n = cache.length(), len(token_ids)
        device = self.model.device
        sees, depth = _tree_layout(parents)
        visible = torch.ones(n, prefix + n, dtype=torch.bool)
        visible[:, prefix:] = sees
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
        positions = torch.tensor([[prefix + d for d in depth]], dtype=torch.long, device=device)
        tree = cache.fork()
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                position_ids=positions,
                attention_mask=self._custom_mask(visible[None]),
                **{self._cache_kw: tree.cache},
                use_cache=True,
                logits_to_keep=n,
            )
        return _host(out.logits[0]), tree  # [n, V]

    def forward_trees(
        self, items: Sequence[tuple[Sequence[int], Sequence[int], Any]]
    ) -> list[tuple[npt.NDArray[np.float32], TransformersCache]]:
        """Several trees, each on its own cache, as rows of padded forwards (TreeBatch): the
        trees of batched runs (particles finishing a value, runtime/particles.py; selects)
        arrive together, and a forward reads every weight once however many rows it has.
        Measured (SmolLM2, float32, 2 AVX2 cores, an 18-token chat prompt): one tree of 8
        nodes 94 ms, of one node 79 ms; 16 trees of 8 nodes in one forward 434 ms, not 1.5 s.
        Grouped as forward_batch groups rows (padding_groups), each group at most
        TREE_BATCH_NODES padded nodes."""
        results: dict[int, tuple[npt.NDArray[np.float32], TransformersCache]] = {}
        for group in padding_groups([len(ids) for ids, _, _ in items],
                                    self.call_cost_positions):
            size = max(1, TREE_BATCH_NODES // max(len(items[i][0]) for i in group))
            for start in range(0, len(group), size):
                part = group[start:start + size]
                for index, result in zip(part, self._forward_trees_padded(
                        [items[i] for i in part]), strict=True):
                    results[index] = result
        return [results[i] for i in range(len(items))]

    def _forward_trees_padded(
        self, items: Sequence[tuple[Sequence[int], Sequence[int], Any]]
    ) -> list[tuple[npt.NDArray[np.float32], TransformersCache]]:
        """One forward of several trees: caches left-padded to a common length and nodes
        right-padded, as _forward_padded; a 4-D mask lets each node see its cache and its
        ancestors only (a padding node sees itself, so that no row of the mask is empty).
        Each tree's cache holds views of its row of the batched KV."""
        caches = [cache for _, _, cache in items]
        assert all(isinstance(c, TransformersCache) for c in caches)
        past = [c.length() for c in caches]
        new = [len(ids) for ids, _, _ in items]
        width_past, width_new = max(past), max(new)
        device = self.model.device
        pad = self.start_token_id
        visible = torch.zeros(len(items), width_new, width_past + width_new, dtype=torch.bool)
        positions = torch.zeros(len(items), width_new, dtype=torch.long)
        for i, ((_, parents, _), p, n) in enumerate(zip(items, past, new, strict=True)):
            sees, depth = _tree_layout(parents)
            visible[i, :n, width_past - p : width_past] = True
            visible[i, :n, width_past : width_past + n] = sees
            visible[i, n:, width_past + n:] = torch.eye(width_new - n, dtype=torch.bool)
            positions[i, :n] = torch.tensor([p + d for d in depth])
            positions[i, n:] = p
        input_ids = torch.tensor(
            [list(ids) + [pad] * (width_new - len(ids)) for ids, _, _ in items], device=device)
        batched = self._stack_caches(caches, width_past)
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                position_ids=positions.to(device),
                attention_mask=self._custom_mask(visible),
                **{self._cache_kw: batched},
                use_cache=True,
                logits_to_keep=width_new,
            )
        logits = _host(out.logits)  # [B, width_new, V]
        trees = [cache.fork() for cache in caches]
        _hold_rows(trees, batched, width_past, past, new)
        return [(logits[i, :n], tree) for i, (tree, n) in enumerate(zip(trees, new, strict=True))]

    def _custom_mask(self, visible: torch.Tensor) -> torch.Tensor:
        """A ready 4-D attention mask [B, 1, q, kv] from a bool [B, q, kv] (True: attend), in
        the form the model's attention takes as is: bool for SDPA, additive floats
        otherwise."""
        mask = visible[:, None].to(self.model.device)
        if getattr(self.model.config, "_attn_implementation", "sdpa") == "sdpa":
            return mask
        dtype = next(self.model.parameters()).dtype
        additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        return additive.masked_fill(~mask, torch.finfo(dtype).min)

    def keep_path(self, tree: Any, length: int, path: Sequence[int]) -> TransformersCache:
        assert isinstance(tree, TransformersCache)
        kept = tree.fork()
        if list(path) == list(range(len(path))):
            kept.crop(length + len(path))  # the path is the first nodes: a view, no copy
            return kept
        index = torch.tensor([*range(length), *(length + p for p in path)],
                             device=self.model.device)
        for layer in kept.cache.layers:
            _set_layer(layer, layer.keys.index_select(-2, index),
                       layer.values.index_select(-2, index))
        return kept


def load_transformers(
    name: str, folder: str, device: str | None, dtype: str | None, cache_mb: int = 0
) -> TransformersBackend:
    """Load a HF folder or hub id with transformers.

    Raises:
        ModelLoadError: the model cannot be loaded.
        UsageError: an unknown device or dtype.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or "cpu"
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device} was asked for, but torch sees no CUDA device")
    torch_dtype = resolve_dtype(dtype, device)
    started = time.perf_counter()
    with quiet_transformers():
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder)
            model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load model '{name}': {exc}") from exc
    model.to(device)
    model.eval()
    if can_pack(model):
        pack_linear_layers(model)
    cache = PrefixCache(cache_mb << 20) if cache_mb > 0 else None
    return TransformersBackend(model, tokenizer, name, time.perf_counter() - started, cache)


def cache_argument(model: Any) -> str:
    """The name under which the model's forward takes its KV cache: `cache` from transformers
    5.2x on, where `past_key_values` still works but warns on stderr at every run (a
    FutureWarning printed in the middle of the CLI's output); `past_key_values` before."""
    model_class: Any = type(model)
    return _cache_argument_of(model_class)


@functools.cache
def _cache_argument_of(model_class: Any) -> str:
    try:
        parameters = inspect.signature(model_class.forward).parameters
    except (AttributeError, TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def padding_groups(lengths: Sequence[int], call_cost: int) -> list[list[int]]:
    """The indices of rows whose new tokens number `lengths`, in the groups of padded forwards
    that cost least, longest rows first: a group costs `call_cost` plus its size times its
    longest row, in token positions. Each group is a run of the rows sorted by length (an
    optimal grouping is), found by dynamic programming over those runs (n <= a few dozen)."""
    if len(set(lengths)) == 1:  # every decoding step of a batch: nothing to weigh
        return [list(range(len(lengths)))]
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    ordered = [lengths[i] for i in order]
    # best[j]: the least cost of the first j sorted rows; cut[j]: where its last group starts.
    best = [0] + [0] * len(order)
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        best[j], cut[j] = min((best[i] + call_cost + (j - i) * ordered[j - 1], i)
                              for i in range(j))
    groups: list[list[int]] = []
    j = len(order)
    while j > 0:
        groups.append(sorted(order[cut[j]:j]))
        j = cut[j]
    return groups


TREE_BATCH_NODES = 1024
"""The most padded tree nodes in one forward of several trees (forward_trees): their logits
are [nodes, V] float32, 200 MB at SmolLM2's 49k-token vocabulary."""


def _tree_layout(parents: Sequence[int]) -> tuple[torch.Tensor, list[int]]:
    """A tree's attention among its nodes, sees[i, j] (node i attends to node j: an ancestor,
    or itself), and each node's depth (0: a child of the cache's last position)."""
    n = len(parents)
    depth = [0] * n
    sees = torch.zeros(n, n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        assert -1 <= parent < i, "a node's parent comes before it"
        if parent >= 0:
            depth[i] = depth[parent] + 1
            sees[i] = sees[parent]
        sees[i, i] = True
    return sees, depth


def _host(logits: torch.Tensor) -> npt.NDArray[np.float32]:
    """Logits as the runtime takes them (backends/base.py): float32 numpy on the CPU. On a
    CPU float32 model this is a view, no copy; from CUDA it is the one copy per step that the
    CPU-side masks and sampler need anyway (49k floats for SmolLM2)."""
    host: npt.NDArray[np.float32] = logits.detach().to("cpu", torch.float32).numpy()
    return host


def _layer_tensors(
    layer: Any, empty_shape: tuple[int, int, int, int], model: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache layer's keys and values, or empty ones for a layer never filled."""
    keys = getattr(layer, "keys", None)
    if getattr(layer, "is_initialized", False) and keys is not None and keys.numel() > 0:
        return layer.keys, layer.values
    dtype = next(model.parameters()).dtype
    empty = torch.zeros(empty_shape, dtype=dtype, device=model.device)
    return empty, empty


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    # tensor: [1, heads, T, head_dim] -> [1, heads, width, head_dim], zeros first.
    missing = width - tensor.shape[-2]
    if missing == 0:
        return tensor
    zeros = tensor.new_zeros(tensor.shape[0], tensor.shape[1], missing, tensor.shape[3])
    return torch.cat([zeros, tensor], dim=-2)


def _whole_batch(row: torch.Tensor, rows: int, width: int) -> torch.Tensor | None:
    """The [rows, heads, width, head_dim] tensor whose first row `row` is a view of (as
    forward_batch leaves each row's cache: the row's positions without its left padding), over
    the same storage; None when `row` is not laid out so."""
    _, heads, length, dim = row.shape
    if length > width:
        return None
    size = rows * heads * width * dim
    storage = row.untyped_storage()
    if storage.nbytes() != size * row.element_size() \
            or row.storage_offset() != (width - length) * dim or row.stride() != (
                heads * width * dim, width * dim, dim, 1):
        return None
    return row.new_empty(0).set_(storage, 0, (rows, heads, width, dim),
                                 (heads * width * dim, width * dim, dim, 1))


class _BatchRow:
    """One row of a batched forward, as forward_batch left it: its cache (weakly held), the
    view of the batched keys it was given (weakly held: a cache changed since holds another
    tensor) and its length."""

    __slots__ = ("cache", "keys", "length")

    def __init__(self, cache: weakref.ref[TransformersCache],
                 keys: weakref.ref[torch.Tensor], length: int) -> None:
        self.cache, self.keys, self.length = cache, keys, length

    @classmethod
    def of(cls, cache: TransformersCache) -> _BatchRow:
        return cls(weakref.ref(cache), weakref.ref(cache.cache.layers[0].keys), cache.length())

    def holds(self, cache: TransformersCache) -> bool:
        """Whether `cache` is this row's, unchanged since the forward."""
        return (self.cache() is cache and self.keys() is cache.cache.layers[0].keys
                and cache.length() == self.length)


def _hold_rows(caches: Sequence[TransformersCache], batched: Any, width_past: int,
               past: Sequence[int], new: Sequence[int]) -> None:
    """After a padded forward over `batched` (every row's cache left-padded to `width_past`,
    then its new positions): each cache holds views of its row of the batched KV, its `past`
    positions then its `new` ones, without the padding (no copy)."""
    for i, (cache, p, n) in enumerate(zip(caches, past, new, strict=True)):
        row = slice(width_past - p, width_past + n)
        for layer, source in zip(cache.cache.layers, batched.layers, strict=True):
            _set_layer(layer, source.keys[i : i + 1, :, row], source.values[i : i + 1, :, row])


def _set_layer(layer: Any, keys: torch.Tensor, values: torch.Tensor) -> None:
    # DynamicLayer.update would copy again (it concatenates onto what it holds); setting the
    # tensors after lazy initialisation keeps the views.
    if not getattr(layer, "is_initialized", False):
        layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values


def default_dtype(device: str) -> torch.dtype:
    """bfloat16 on CUDA, float32 on the CPU.

    On the CPU it is float32 even where bf16 kernels are native. Measured on this project's
    2-core AVX512-bf16 CPU with SmolLM2 (2026-11-25, quiet machine, 2 threads, the float32
    weights packed by backends/packed_linear.py): float32 decodes as fast or faster
    (bench/RESULTS.md "Model speed options": 40.8 / 52.7 ms per token at 256 / 1k positions
    against 44.0 / 53.9 in bfloat16; another run 41-43 against 54-56 at 1k); only prefill is
    faster in bfloat16 (953 against 561 tokens/s at 1k). And bfloat16's rounding depends on
    how many positions a forward holds, so a greedy run with speculation (runtime/speculate.py:
    drafts verified in one forward) could pick another token at a near tie than the same run
    without it (bench/workloads.py's rpg: age 18 against 20); in float32 the two agree
    (bench/RESULTS.md, "same text"). `--dtype bfloat16` stays for long prompts.
    """
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def resolve_dtype(dtype: str | None, device: str = "cpu") -> torch.dtype:
    """The torch dtype for a --dtype value on `device` (None and "auto": default_dtype).

    Raises:
        UsageError: an unknown dtype name.
    """
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype '{dtype}'; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]
