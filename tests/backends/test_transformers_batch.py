"""The transformers adapter's batched forward (backends/transformers.py forward_batch): rows of
any lengths give the logits they give alone, step after step; the batched KV of one step is
reused by the next over the same caches (no stacking), and not after a row changed or left;
rows of unlike lengths run in the groups that pad least."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from qrun.backends.transformers import TransformersBackend, TransformersCache, padding_groups


def contexts(tiny: TransformersBackend) -> list[TransformersCache]:
    """Three caches of different lengths, two sharing a prefix (forks)."""
    shared = tiny.new_cache()
    tiny.forward(list(range(5, 60)), shared)
    other = tiny.new_cache()
    tiny.forward(list(range(7, 40)), other)
    rows = [shared.fork(), other, shared.fork()]
    tiny.forward([7, 8, 9], rows[2])
    return rows


def step_alone(tiny: TransformersBackend, caches: list[TransformersCache], token: int
               ) -> list[Any]:
    return [tiny.forward([token], cache)[-1] for cache in caches]


def test_decoding_steps_reuse_the_batch_and_match_single_forwards(
        tiny: TransformersBackend) -> None:
    rows = contexts(tiny)
    stacked = tiny.stacked_batches
    alone = [row.fork() for row in rows]
    for step in range(5):
        batched = tiny.forward_batch([([300 + step], row) for row in rows])
        expected = step_alone(tiny, alone, 300 + step)
        for got, want in zip(batched, expected, strict=True):
            np.testing.assert_allclose(got[-1], want, atol=1e-4)
    assert tiny.stacked_batches == stacked + 1  # stacked once, then reused step after step
    assert [row.length() for row in rows] == [row.length() for row in alone]


def test_a_changed_or_missing_row_builds_the_batch_anew(tiny: TransformersBackend) -> None:
    rows = contexts(tiny)
    stacked = tiny.stacked_batches
    alone = [row.fork() for row in rows]
    tiny.forward_batch([([300], row) for row in rows])
    step_alone(tiny, alone, 300)
    # A row cropped (a rollback) and fed alone since: the batch is stacked again.
    rows[1].crop(rows[1].length() - 2)
    alone[1].crop(alone[1].length() - 2)
    tiny.forward([11], rows[1])
    tiny.forward([11], alone[1])
    # A row fed unevenly (two tokens where the others take one): not reusable after.
    batched = tiny.forward_batch([([301], rows[0]), ([12, 13], rows[1]), ([301], rows[2])])
    expected = [tiny.forward(ids, cache)[-1] for ids, cache in
                (([301], alone[0]), ([12, 13], alone[1]), ([301], alone[2]))]
    for got, want in zip(batched, expected, strict=True):
        np.testing.assert_allclose(got[-1], want, atol=1e-4)
    # A row leaving: the others are stacked again.
    batched = tiny.forward_batch([([302], rows[0]), ([302], rows[2])])
    expected = step_alone(tiny, [alone[0], alone[2]], 302)
    for got, want in zip(batched, expected, strict=True):
        np.testing.assert_allclose(got[-1], want, atol=1e-4)
    assert tiny.stacked_batches == stacked + 3  # each of the three batches stacked anew


def test_rows_that_share_a_cache_or_a_length_match_single_forwards(
        tiny: TransformersBackend) -> None:
    # A particle step's rows (runtime/particles.py): a look ahead's forks of one path's cache
    # (the same tensors, stacked once and gathered), other paths' caches of that length
    # (stacked by one concatenation per length), one shorter (left-padded) and an empty one.
    path = tiny.new_cache()
    tiny.forward(list(range(5, 30)), path)
    other = tiny.new_cache()
    tiny.forward(list(range(40, 65)), other)
    short = tiny.new_cache()
    tiny.forward(list(range(9, 20)), short)
    for caches in ([path.fork(), other.fork(), path.fork(), short.fork(), tiny.new_cache(),
                    path.fork()],
                   [path.fork(), path.fork(), other.fork()]):  # one length: no padding
        tokens = [300 + i for i in range(len(caches))]
        alone = [tiny.forward([t], cache.fork())[-1] for t, cache in zip(tokens, caches,
                                                                         strict=True)]
        batched = tiny.forward_batch([([t], cache) for t, cache in zip(tokens, caches,
                                                                        strict=True)])
        for got, want in zip(batched, alone, strict=True):
            np.testing.assert_allclose(got[-1], want, atol=1e-4)


@pytest.mark.parametrize(("lengths", "cost", "groups"), [
    ([1, 1, 1, 1, 1, 1, 1, 31], 64, [[7], [0, 1, 2, 3, 4, 5, 6]]),  # 64+31 + 64+7 < 64+8*31
    ([1, 1, 1, 1, 1, 1, 1, 31], 2048, [[0, 1, 2, 3, 4, 5, 6, 7]]),  # a dear call: one batch
    ([31, 30, 29, 28], 64, [[0, 1, 2, 3]]),
    ([5, 1, 31, 2, 30, 1, 1, 1], 64, [[2, 4], [0, 1, 3, 5, 6, 7]]),
    ([1, 1, 1], 0, [[0, 1, 2]]),  # equal lengths: splitting saves nothing
    ([4], 64, [[0]]),
])
def test_padding_groups_cost_least(lengths: list[int], cost: int,
                                   groups: list[list[int]]) -> None:
    assert padding_groups(lengths, cost) == groups


def test_rows_of_unlike_lengths_run_in_groups_and_give_their_logits_alone(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiny, "call_cost_positions", 64)  # the CPU's (a GPU's: one group)
    rows = contexts(tiny)
    alone = [row.fork() for row in rows]
    feeds = [[300], list(range(400, 480)), [301, 302, 303]]  # 80 tokens: a group of its own
    assert len(padding_groups([len(f) for f in feeds], tiny.call_cost_positions)) == 2
    batched = tiny.forward_batch(list(zip(feeds, rows, strict=True)), logits_for=2)
    for got, feed, cache in zip(batched, feeds, alone, strict=True):
        want = tiny.forward(feed, cache, logits_for=2)
        assert got.shape == want.shape  # [2, V], or [1, V] for a row fed one token
        np.testing.assert_allclose(got, want, atol=1e-4)
    assert [row.length() for row in rows] == [row.length() for row in alone]


TREES = [
    # (token ids, parents): a chain, a fork at the root, and one node
    ([400, 401, 402, 403], [-1, 0, 1, 2]),
    ([410, 411, 412, 413, 414, 415], [-1, 0, 0, 1, 2, -1]),
    ([420], [-1]),
]


@pytest.mark.parametrize("most_nodes", [1024, 8])
def test_trees_on_unlike_caches_give_their_logits_alone(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch, most_nodes: int) -> None:
    # Several runs' trees in one forward (forward_trees: each cache left-padded, each tree
    # right-padded, a 4-D mask per row); at 8 nodes they go in several forwards.
    monkeypatch.setattr("qrun.backends.transformers.TREE_BATCH_NODES", most_nodes)
    rows = contexts(tiny)
    lengths = [row.length() for row in rows]
    batched = tiny.forward_trees([(ids, parents, row) for (ids, parents), row
                                  in zip(TREES, rows, strict=True)])
    assert [row.length() for row in rows] == lengths  # the caches are left unchanged
    for (ids, parents), row, (logits, fed) in zip(TREES, rows, batched, strict=True):
        want, want_fed = tiny.forward_tree(ids, parents, row)
        assert logits.shape == want.shape
        np.testing.assert_allclose(logits, want, atol=1e-4)
        assert fed.length() == row.length() + len(ids)
        # The tree's cache goes on from any node as forward_tree's does: the last node's path.
        path = [len(ids) - 1]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        got = tiny.forward([500], tiny.keep_path(fed, row.length(), path))
        expected = tiny.forward([500], tiny.keep_path(want_fed, row.length(), path))
        np.testing.assert_allclose(got, expected, atol=1e-4)
