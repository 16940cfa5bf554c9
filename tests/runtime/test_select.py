"""select: options scored in full, in context, in one forward over their token tree; the
winner's KV kept."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.runtime.sampler import log_softmax, new_generator
from qrun.runtime.select import OptionTree, SelectRequest, TreeScoring, choose, select
from qrun.runtime.session import Session

PREFIX = "My favourite colour is"
OPTIONS = (" red", " green and blue", " ultramarine violet", " sky")


def sequential_score(backend: TransformersBackend, option: str) -> float:
    """Log P(option | prefix) from one uncached forward over prefix + option."""
    prefix_ids, option_ids = backend.encode(PREFIX), backend.encode(option)
    logits = backend.forward(prefix_ids + option_ids, backend.new_cache(),
                             logits_for=len(option_ids) + 1)
    logprobs = log_softmax(logits[:-1])
    return sum(float(logprobs[k, t]) for k, t in enumerate(option_ids))


def run_select(backend: TransformersBackend, temperature: float = 0.0,
               normalize: str = "sum") -> tuple[Session, object]:
    session = Session(backend, backend)
    session.append_text(PREFIX)
    request = SelectRequest("c", OPTIONS, temperature, normalize, new_generator(0))
    return session, select(session, request, TreeScoring(backend))


def test_scores_equal_separate_uncached_forwards(tiny: TransformersBackend) -> None:
    _, record = run_select(tiny)
    for option in OPTIONS:
        assert math.isclose(record.option_logprobs[option],  # type: ignore[attr-defined]
                            sequential_score(tiny, option), abs_tol=1e-3)
    best = max(OPTIONS, key=lambda o: sequential_score(tiny, o))
    assert record.value == best  # type: ignore[attr-defined]


def test_the_winner_row_becomes_the_context(tiny: TransformersBackend) -> None:
    session, record = run_select(tiny)
    ids = tiny.encode(PREFIX) + tiny.encode(record.value)  # type: ignore[attr-defined]
    assert session.token_ids == ids
    assert session.cache.length() == len(ids) - 1  # the last token is fed with what follows
    fresh = Session(tiny, tiny)
    fresh.append_tokens(ids)
    np.testing.assert_allclose(session.next_logits(), fresh.next_logits(), atol=1e-4, rtol=0)
    session.append_text(" and more")
    fresh.append_text(" and more")
    np.testing.assert_allclose(session.next_logits(), fresh.next_logits(), atol=1e-4, rtol=0)


def test_one_forward_feeds_each_option_but_its_last_token(tiny: TransformersBackend) -> None:
    session, record = run_select(tiny)
    option_tokens = [len(tiny.encode(o)) for o in OPTIONS]
    fed = sum(n - 1 for n in option_tokens)  # no two options share a first token here
    assert session.stats.forward_calls == 2  # the prefix, then all options together
    assert session.stats.forward_tokens == len(tiny.encode(PREFIX)) + fed
    winner = len(tiny.encode(record.value))  # type: ignore[attr-defined]
    assert session.stats.rollback_tokens == fed - (winner - 1)
    # The winner's last token is in the context, to be fed with whatever follows.
    assert session.fed == len(session.token_ids) - 1


SHARED = (" green", " green and blue", " green and gold", " greenish", " grey")


def test_options_sharing_tokens_are_scored_off_one_tree(tiny: TransformersBackend) -> None:
    session = Session(tiny, tiny)
    session.append_text(PREFIX)
    request = SelectRequest("c", SHARED, 0.0, "sum", None)
    record = select(session, request, TreeScoring(tiny))
    for option in SHARED:
        assert math.isclose(record.option_logprobs[option],  # type: ignore[index]
                            sequential_score(tiny, option), abs_tol=1e-3)
    rows = [tiny.encode(o) for o in SHARED]
    prefixes = {tuple(row[:k]) for row in rows for k in range(1, len(row))}
    assert len(prefixes) < sum(len(row) - 1 for row in rows)  # some tokens are shared
    assert session.stats.forward_tokens == len(tiny.encode(PREFIX)) + len(prefixes)


def test_any_option_can_win_and_become_the_context(tiny: TransformersBackend) -> None:
    # Whichever option wins, keep_path must give the cache of the context followed by that
    # option's fed tokens, wherever its nodes sit in the tree (first path: a crop; others:
    # gathered positions).
    tree = OptionTree.build([tiny.encode(o) for o in SHARED])
    base = Session(tiny, tiny)
    base.append_text(PREFIX)
    base.next_logits()
    logits, fed = tiny.forward_tree(tree.fed, tree.parents, base.cache)
    context = len(base.token_ids)
    for option, path in zip(SHARED, tree.paths, strict=True):
        row = tiny.encode(option)
        kept = tiny.keep_path(fed, context, path)
        assert kept.length() == context + len(row) - 1
        fresh = tiny.new_cache()
        expected = tiny.forward(base.token_ids + row, fresh, logits_for=1)
        got = tiny.forward(row[-1:], kept, logits_for=1)
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
        if path:
            direct = tiny.forward(base.token_ids + row[:-1], tiny.new_cache(), logits_for=1)
            np.testing.assert_allclose(logits[path[-1]], direct[0], atol=1e-4, rtol=0)


def test_mean_normalisation_divides_by_token_count(tiny: TransformersBackend) -> None:
    _, record = run_select(tiny, normalize="mean")
    means = {o: sequential_score(tiny, o) / len(tiny.encode(o)) for o in OPTIONS}
    assert record.value == max(means, key=means.__getitem__)  # type: ignore[attr-defined]


def test_sampling_follows_the_softmax_of_scores() -> None:
    scores = [math.log(0.6), math.log(0.3), math.log(0.1)]
    generator = new_generator(1234)
    draws = [choose(scores, 1.0, generator) for _ in range(3000)]
    for index, expected in enumerate((0.6, 0.3, 0.1)):
        assert abs(draws.count(index) / 3000 - expected) < 0.03
    # Lower temperature sharpens towards the best option.
    sharp = [choose(scores, 0.2, generator) for _ in range(1000)]
    assert sharp.count(0) > 900


def test_select_heals_the_text_before_it(tiny: TransformersBackend) -> None:
    import qrun

    r = qrun.Query('Paid: {{ select p options=["yes", "no"] }}.').run(model=tiny)
    assert r.stats.healed_tokens == 1
    assert r.text == f"Paid: {r['p']}."
    # Options were scored as " yes" / " no": the space belongs to their first token.
    assert r.holes["p"].token_ids == tiny.encode(" " + r["p"])
    assert r.token_ids == tiny.encode("Paid:") + tiny.encode(" " + r["p"]) + tiny.encode(".")


def tree_sizes(tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of nodes of each tree forward on `tiny` from now on, as they happen."""
    sizes: list[int] = []
    forward_tree = tiny.forward_tree

    def spy(token_ids: Any, parents: Any, cache: Any) -> Any:
        sizes.append(len(token_ids))
        return forward_tree(token_ids, parents, cache)

    monkeypatch.setattr(tiny, "forward_tree", spy)
    return sizes


def test_a_large_tree_is_scored_in_parts_with_the_same_scores(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    words = [" red", " green and blue", " ultramarine violet", " sky", " deep sea green",
             " the colour of old paper", " pale", " burnt orange and gold"]
    options = [f"{a}{b}" for a in words for b in words]  # 64 options, shared first tokens
    query = qrun.Query("My favourite colour is{{ select c options=opts }}. Yes.")
    whole = query.run(model=tiny, opts=options)
    monkeypatch.setattr("qrun.runtime.select.TREE_NODES", 6)
    sizes = tree_sizes(tiny, monkeypatch)
    parts = query.run(model=tiny, opts=options)
    assert len(sizes) > 5 and max(sizes) <= 6 + max(len(tiny.encode(o)) for o in options)
    assert parts.text == whole.text and parts["c"] == whole["c"]
    for option in options:
        assert math.isclose(parts.holes["c"].option_logprobs[option],  # type: ignore[attr-defined]
                            whole.holes["c"].option_logprobs[option], abs_tol=1e-3)
    # Every node fed for scoring was dropped; the winner is fed again with what follows.
    stats = parts.stats
    assert stats.rollback_tokens == sum(sizes)
    assert stats.forward_tokens <= stats.context_tokens + stats.rework_tokens


def test_options_that_share_prefixes_fill_each_part(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # A part is cut where the next option's new nodes would pass TREE_NODES: the nodes it
    # shares with the part's options before it are fed once. Counting every option's tokens
    # instead cut 600 sentences of four words (1,000 nodes) into 13 parts feeding 1,035.
    options = [f" The {a} {n} sleeps" for a in ("big", "small", "old", "young", "happy", "lazy")
               for n in ("cat", "dog", "bird", "fish", "horse", "cow", "pig", "hen")]
    monkeypatch.setattr("qrun.runtime.select.TREE_NODES", 30)
    sizes = tree_sizes(tiny, monkeypatch)
    result = qrun.Query("Pick:{{ select s options=opts }}").run(model=tiny, opts=options)
    longest = max(len(tiny.encode(o)) for o in options)
    assert len(sizes) > 1 and max(sizes) <= 30
    assert all(size > 30 - longest for size in sizes[:-1]), sizes
    assert result.stats.rollback_tokens == sum(sizes)


def test_thousands_of_options_are_scored_within_the_node_bound(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # One forward over a whole tree of 20,002 options asked for 3.66 GiB of logits and died
    # with MemoryError; in parts, no forward feeds more than TREE_NODES nodes (~50 MB of
    # logits), whatever the number of options. 2,002 options (6.4k nodes) make 25 parts.
    from qrun.runtime.select import TREE_NODES

    options = [f"{i} is the number" for i in range(2_002)]
    sizes = tree_sizes(tiny, monkeypatch)
    result = qrun.Query("Pick one: {{ select n options=opts }}").run(model=tiny, opts=options)
    assert result["n"] in options
    assert len(result.holes["n"].option_logprobs) == 2_002  # type: ignore[attr-defined]
    assert sum(sizes) > 20 * TREE_NODES and max(sizes) <= TREE_NODES


def test_several_jobs_are_scored_in_one_batch_of_trees_as_each_alone(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """jobs_logprobs (particles finishing several paths at one step) submits every job's trees
    together: one forward of several trees where they fit TREE_NODES nodes together, with each
    job's scores what parts_logprobs gives it alone."""
    from qrun.runtime.scheduler import ForwardScheduler, ScheduledModel
    from qrun.runtime.select import jobs_logprobs, parts_logprobs

    jobs = []
    for prefix, words in (("My favourite colour is", (" red", " green and blue", " sky")),
                          ("The animal I like most is the", (" cat", " dog that barks")),
                          ("Nothing to score here", ())):
        cache = tiny.new_cache()
        first = log_softmax(tiny.forward(tiny.encode(prefix), cache, 1)[-1])
        jobs.append(([tiny.encode(w) + tiny.encode(".") for w in words], first, cache))
    alone = [parts_logprobs(tiny, rows, first, cache) for rows, first, cache in jobs]
    batches: list[int] = []
    forward_trees = tiny.forward_trees
    monkeypatch.setattr(tiny, "forward_trees",
                        lambda items: batches.append(len(items)) or forward_trees(items))
    scheduler = ForwardScheduler(tiny, tiny, tiny.batch_forward(), tiny.tree_batch())
    scheduler.enter()
    try:
        scored, fed, forwards = jobs_logprobs(ScheduledModel(scheduler, 0), jobs)
        assert batches == [2] and forwards == 1  # the third job feeds nothing
        assert fed == sum(nodes for _, nodes, _ in alone)
        for together, (by_itself, _, _) in zip(scored, alone, strict=True):
            np.testing.assert_allclose(np.concatenate(together or [[]]),
                                       np.concatenate(by_itself or [[]]), atol=1e-4)
        batches.clear()
        monkeypatch.setattr("qrun.runtime.select.TREE_NODES", 8)  # each job's tree apart
        assert jobs_logprobs(ScheduledModel(scheduler, 0), jobs)[2] == 2
    finally:
        scheduler.leave()
