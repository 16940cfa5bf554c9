"""Filling a `select` hole: every option scored in full, in context, in one forward on top of
the current KV cache, the options' tokens merged into a tree (shared leading tokens fed once,
each option's last token not fed at all); the winner's positions stay in the context, so it is
never encoded twice."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from qrun.backends.base import KVCache, PromptScorer, TreeScorer
from qrun.runtime.hole import HoleFailure
from qrun.runtime.recorder import Recorder
from qrun.runtime.result import SelectRecord
from qrun.runtime.sampler import draw, log_normalizers, log_softmax, new_generator
from qrun.runtime.scheduler import forward_trees
from qrun.runtime.session import Session


@dataclass(frozen=True, slots=True)
class SelectRequest:
    """A `select` hole with its arguments evaluated."""

    name: str
    options: tuple[str, ...]
    temperature: float
    normalize: str  # "sum" | "mean"
    generator: np.random.Generator | None
    prefix: str = ""  # healed text taken back from the context; every option starts with it


@dataclass(frozen=True, slots=True)
class OptionTree:
    """The options' token rows merged into a trie. Only nodes with children are fed to the
    model (a row's last token predicts nothing the score needs), once each however many
    options share them: `fed` lists those nodes' tokens, `parents` their parent's index in
    `fed` (-1: the context), and `paths[r]` the `fed` indices of row r's tokens but its last."""

    fed: tuple[int, ...]
    parents: tuple[int, ...]
    paths: tuple[tuple[int, ...], ...]

    @staticmethod
    def build(rows: Sequence[Sequence[int]]) -> OptionTree:
        children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        tokens: list[int] = []
        parent_of: list[int] = []
        row_nodes: list[list[int]] = []
        for row in rows:
            node, nodes = -1, []
            for token in row:
                key = (node, token)
                if key not in children:
                    children[key] = len(tokens)
                    tokens.append(token)
                    parent_of.append(node)
                node = children[key]
                nodes.append(node)
            row_nodes.append(nodes)
        has_child = {parent for parent in parent_of if parent >= 0}
        # Nodes are created parents first, so fed positions keep that order.
        position = {node: i for i, node in enumerate(sorted(has_child))}
        return OptionTree(
            fed=tuple(tokens[node] for node in sorted(has_child)),
            parents=tuple(position.get(parent_of[node], -1) for node in sorted(has_child)),
            paths=tuple(tuple(position[node] for node in nodes[:-1]) for nodes in row_nodes),
        )


Commit = Callable[[int], None]


class Scoring(Protocol):
    """How a run scores select options on its backend, chosen once when the run starts."""

    def score(self, session: Session, rows: list[list[int]]
              ) -> tuple[list[list[float]], Commit]:
        """Each row's token log-probabilities after the context, and how to append row i."""
        ...


class Proposal(Protocol):
    """How a `{% particles %}` block's particle draws among values it has scored whole (a
    select's options, a small language's strings: runtime/particle_block.py Strata), from a
    proposal of its own rather than their probabilities."""

    def draw(self, scores: list[float]) -> tuple[int, float]:
        """An index, and the log of its importance weight: its probability under
        softmax(scores) over its probability under the proposal."""
        ...


def select(session: Session, request: SelectRequest, scoring: Scoring,
           proposal: Proposal | None = None) -> SelectRecord:
    """Score every option and append the chosen one to the context (drawn from `proposal`,
    at temperature 1 and summed scores, where one is given).

    Raises:
        HoleFailure: an option has no tokens.
    """
    started = time.perf_counter()
    backend = session.backend
    # With healing, each row is the canonical tokenization of prefix + option, so an option
    # after "Paid: " is scored as " yes", not as "yes" glued to a lone space token. The
    # prefix is common text, so comparing P(prefix + option) compares the options.
    rows = [backend.encode(request.prefix + option) for option in request.options]
    for option, row in zip(request.options, rows, strict=True):
        if not row:
            raise HoleFailure(f"select '{request.name}': option {option!r} has no tokens")
    token_logprobs, commit = scoring.score(session, rows)
    scores = [_score(lps, request.normalize) for lps in token_logprobs]
    log_importance = 0.0
    if proposal is None:
        chosen = choose(scores, request.temperature, request.generator)
    else:  # a particles block's: lang/args.py weighing_conflict left these at their defaults
        assert request.temperature == 1.0 and request.normalize == "sum"
        chosen, log_importance = proposal.draw(scores)
    commit(chosen)
    row = rows[chosen]
    start = len(session.token_ids) - len(row)
    healed, end, prefix_tokens = len(request.prefix.encode("utf-8")), 0, 0
    for token in row:  # the tokens that only re-produce the healed text
        end += len(backend.vocabulary.token_bytes[token] or b"")
        prefix_tokens += end <= healed
    session.stats.generated_tokens += len(row)
    value = request.options[chosen]
    if session.recorder is not None:
        _record(session.recorder, start, rows, token_logprobs, chosen)
    return SelectRecord(
        name=request.name,
        value=value,
        text=value,
        start=start,
        token_ids=list(row),
        logprobs=list[float | None](token_logprobs[chosen]),
        forced=[False] * len(row),
        finish="select",
        seconds=time.perf_counter() - started,
        option_logprobs={
            o: sum(lps) for o, lps in zip(request.options, token_logprobs, strict=True)
        },
        prefix_tokens=prefix_tokens,
        log_importance=log_importance,
    )


class TreeScoring:
    """Every option in one forward over their token tree on top of the KV cache; committing
    keeps the winner's positions and lets the others go."""

    def __init__(self, scorer: TreeScorer) -> None:
        self.scorer = scorer

    def score(self, session: Session, rows: list[list[int]]
              ) -> tuple[list[list[float]], Commit]:
        return _score_tree(session, self.scorer, rows)


class PromptScoring:
    """Every option as a prompt (context + option) whose token log-probabilities the backend
    returns; committing appends the winner, fed with what follows."""

    def __init__(self, scorer: PromptScorer) -> None:
        self.scorer = scorer

    def score(self, session: Session, rows: list[list[int]]
              ) -> tuple[list[list[float]], Commit]:
        return _score_prompts(session, self.scorer, rows)


TREE_NODES = 256
"""The most fed nodes one tree forward takes: it returns float32 logits of [nodes, V] (50 MB at
256 nodes for SmolLM2's 49,152 tokens); a select over 20,002 options asked for 3.66 GiB in one
forward and died with MemoryError. Larger trees are scored in parts (_score_in_parts)."""


def _score_tree(
    session: Session, backend: TreeScorer, rows: list[list[int]]
) -> tuple[list[list[float]], Commit]:
    first = log_softmax(session.next_logits())  # [V], after the whole context
    tree = OptionTree.build(rows)
    if len(tree.fed) > TREE_NODES:
        return _score_in_parts(session, backend, rows, first)
    context = len(session.token_ids)
    token_logprobs, logits, fed_cache = _forward_tree(session, backend, tree, rows, first)

    def commit(chosen: int) -> None:
        row, path = rows[chosen], tree.paths[chosen]
        # The winner's fed positions stay (its last token is fed with what follows, like a
        # sampled token); every other fed node was computed for nothing.
        session.stats.rollback_tokens += len(tree.fed) - len(path)
        if path:
            session.extend_fed(row[:-1], backend.keep_path(fed_cache, context, path),
                               logits[path[-1]])
        session.append_tokens(row[-1:])

    return token_logprobs, commit


def _forward_tree(
    session: Session, backend: TreeScorer, tree: OptionTree, rows: list[list[int]],
    first: npt.NDArray[np.float32],
) -> tuple[list[list[float]], npt.NDArray[np.float32], KVCache]:
    """Each row's token log-probabilities from one forward of `tree` (built from `rows`) on
    top of the context, whose next-token log-probabilities are `first`; and that forward's
    logits [len(tree.fed), V] and cache (the context's own when nothing is fed)."""
    if tree.fed:
        session.sync()
    t0 = time.perf_counter()
    token_logprobs, logits, fed_cache = tree_logprobs(backend, tree, rows, first, session.cache)
    if tree.fed:
        session.count_model_call(time.perf_counter() - t0, len(tree.fed))
    return token_logprobs, logits, fed_cache


def tree_logprobs(backend: TreeScorer, tree: OptionTree, rows: list[list[int]],
                  first: npt.NDArray[np.float32], cache: KVCache
                  ) -> tuple[list[list[float]], npt.NDArray[np.float32], KVCache]:
    """Each row's token log-probabilities from one forward of `tree` (built from `rows`) on
    top of `cache`, after which the next-token log-probabilities are `first`; and that
    forward's logits [len(tree.fed), V] and cache (`cache` itself when nothing is fed)."""
    logits = np.empty((0, first.shape[-1]), dtype=np.float32)
    fed_cache = cache
    if tree.fed:
        logits, fed_cache = backend.forward_tree(tree.fed, tree.parents, cache)
    return _row_logprobs(tree, rows, first, logits), logits, fed_cache


def _row_logprobs(tree: OptionTree, rows: list[list[int]], first: npt.NDArray[np.float32],
                  logits: npt.NDArray[np.float32]) -> list[list[float]]:
    """Each row's token log-probabilities from the logits after `tree`'s fed nodes (`first`
    before its first token)."""
    norms = log_normalizers(logits)  # [len(fed)]: a row's few tokens are read
    return [
        [float(first[row[0]])] + [float(logits[node, token]) - float(norms[node])
                                  for node, token in zip(path, row[1:], strict=True)]
        for row, path in zip(rows, tree.paths, strict=True)
    ]


def parts_logprobs(backend: TreeScorer, rows: list[list[int]], first: npt.NDArray[np.float32],
                   cache: KVCache) -> tuple[list[list[float]], int, int]:
    """Each row's token log-probabilities as tree_logprobs gives them, from trees of at most
    TREE_NODES fed nodes each (_parts) on top of `cache`, nothing of them kept; the nodes fed,
    and the forwards that fed them. What a select too large for one tree scores
    (_score_in_parts)."""
    (token_logprobs,), fed, forwards = jobs_logprobs(backend, [(rows, first, cache)])
    return token_logprobs, fed, forwards


def jobs_logprobs(
    backend: TreeScorer,
    jobs: Sequence[tuple[list[list[int]], npt.NDArray[np.float32], KVCache]],
) -> tuple[list[list[list[float]]], int, int]:
    """parts_logprobs for several jobs at once, each (rows, first, cache): every job's parts,
    in order, submitted together as trees of one batch (runtime/scheduler.py forward_trees)
    while they hold at most TREE_NODES fed nodes together (TreeJobs). Each job's token
    log-probabilities, the nodes fed, and the batches that fed them."""
    plan = TreeJobs.of(jobs)
    return plan.scored([forward_trees(backend, items) if items else []
                        for items in plan.batches])


@dataclass(frozen=True)
class TreeJobs:
    """Several jobs' trees, each job (rows, first, cache) cut into parts (_parts) and the parts
    into batches (`batches`: each a forward_trees' items, at most TREE_NODES fed nodes
    together), so that many small trees cost a few forwards (16 particles finishing 10 paths at
    one step of bench/faithfulness.py's 2,400 sentences fed 10 trees of a path's last two
    words, 27 nodes after "A big cat", each a forward of its own, ~80 ms apart from its nodes
    on transformers here). A caller may send the first batch with other forwards of its own
    (runtime/particles.py: with a step's rows, runtime/scheduler.py forward_step)."""

    jobs: Sequence[tuple[list[list[int]], npt.NDArray[np.float32], KVCache]]
    parts: list[tuple[int, list[list[int]], OptionTree]]
    groups: list[list[int]]  # per batch, the parts in it

    @classmethod
    def of(cls, jobs: Sequence[tuple[list[list[int]], npt.NDArray[np.float32], KVCache]]
           ) -> TreeJobs:
        parts = [(j, part, OptionTree.build(part))
                 for j, (rows, _, _) in enumerate(jobs) for part in _parts(rows)]
        groups: list[list[int]] = []
        size = 0
        for k, (_, _, tree) in enumerate(parts):
            if groups and size + len(tree.fed) <= TREE_NODES:
                groups[-1].append(k)
                size += len(tree.fed)
            else:
                groups.append([k])
                size = len(tree.fed)
        return cls(jobs, parts, groups)

    @property
    def batches(self) -> list[list[tuple[Sequence[int], Sequence[int], KVCache]]]:
        """Per batch, its trees (those that feed any node) as forward_trees takes them."""
        return [[(tree.fed, tree.parents, self.jobs[j][2])
                 for j, _, tree in (self.parts[k] for k in group) if tree.fed]
                for group in self.groups]

    def scored(self, outputs: list[list[tuple[npt.NDArray[np.float32], KVCache]]]
               ) -> tuple[list[list[list[float]]], int, int]:
        """Each job's token log-probabilities from each batch's forward_trees results
        (`outputs`, in `batches`' order), the nodes fed, and the batches that fed any."""
        scored: list[list[list[float]]] = [[] for _ in self.jobs]
        fed = forwards = 0
        for group, results in zip(self.groups, outputs, strict=True):
            logits_of = iter(results)
            for k in group:  # in order: a job's parts are its rows in order
                j, part, tree = self.parts[k]
                first = self.jobs[j][1]
                logits = next(logits_of)[0] if tree.fed else np.empty(
                    (0, first.shape[-1]), dtype=np.float32)
                scored[j].extend(_row_logprobs(tree, part, first, logits))
                fed += len(tree.fed)
            forwards += bool(results)
        return scored, fed, forwards


def _score_in_parts(
    session: Session, backend: TreeScorer, rows: list[list[int]],
    first: npt.NDArray[np.float32],
) -> tuple[list[list[float]], Commit]:
    """As _score_tree, one part of the options at a time (each part's tree at most TREE_NODES
    fed nodes, but for a single longer option), so memory stays bounded whatever the number of
    options. No part's positions are kept: the winner is appended afterwards and fed with what
    follows, and every node fed for scoring counts in rollback_tokens."""
    session.sync()
    started = time.perf_counter()
    token_logprobs, fed, forwards = parts_logprobs(backend, rows, first, session.cache)
    session.count_model_call(time.perf_counter() - started, fed, calls=forwards)

    def commit(chosen: int) -> None:
        session.stats.rollback_tokens += fed
        session.append_tokens(rows[chosen])

    return token_logprobs, commit


def _parts(rows: list[list[int]]) -> list[list[list[int]]]:
    """The rows in order, cut into parts whose trees feed at most TREE_NODES nodes: a row
    feeds its tokens but the last, less those its part's rows before it share with it (so
    rows that share prefixes fill a part: the rests of 600 sentences "(The|A|One|My)
    (big|...) ..." are 1,000 fed nodes in 4 parts, which counting every row's tokens cut into
    13 parts feeding 1,035)."""
    parts: list[list[list[int]]] = [[]]
    fed: set[tuple[int, ...]] = set()  # the current part's fed nodes, as their paths
    for row in rows:
        new = [tuple(row[:k]) for k in range(1, len(row)) if tuple(row[:k]) not in fed]
        if parts[-1] and len(fed) + len(new) > TREE_NODES:
            parts.append([])
            fed = set()
            new = [tuple(row[:k]) for k in range(1, len(row))]
        parts[-1].append(row)
        fed.update(new)
    return parts


def _score_prompts(
    session: Session, backend: PromptScorer, rows: list[list[int]]
) -> tuple[list[list[float]], Commit]:
    session.settle()
    session.ensure_start()
    session.pause()
    t0 = time.perf_counter()
    scored = backend.score_continuations(session.token_ids, rows)
    session.count_model_call(time.perf_counter() - t0, scored.computed, scored.cached,
                             calls=len(rows))

    def commit(chosen: int) -> None:
        session.stats.rollback_tokens += sum(len(r) for i, r in enumerate(rows) if i != chosen)
        session.append_tokens(rows[chosen])

    return scored.logprobs, commit


def _record(recorder: Recorder, start: int, rows: list[list[int]],
            token_logprobs: list[list[float]], chosen: int) -> None:
    """The winner's tokens into the context, the others as scored but never kept."""
    for option, (row, logprobs) in enumerate(zip(rows, token_logprobs, strict=True)):
        for k, (token, logprob) in enumerate(zip(row, logprobs, strict=True)):
            if option == chosen:
                recorder.chosen(start + k, token, "select", logprob, option=option)
            else:
                recorder.unchosen(start + k, token, logprob, option)


def _score(logprobs: list[float], normalize: str) -> float:
    total = sum(logprobs)
    return total / len(logprobs) if normalize == "mean" else total


def choose(scores: list[float], temperature: float, generator: np.random.Generator | None
           ) -> int:
    """The index of the chosen option: the best score at temperature 0 (the first on ties),
    else sampled from softmax(scores / temperature)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0.0:
        best = max(scores)
        return scores.index(best)  # first option wins ties
    scaled = np.array(scores, dtype=np.float64) / temperature
    if not np.isfinite(scaled.max()):
        return scores.index(max(scores))
    return draw(np.exp(scaled - scaled.max()), generator or new_generator())
