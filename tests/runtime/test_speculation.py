"""Speculation inside holes (runtime/speculate.py, Session.lookahead): tokens drafted from the
context are fed with a step's own forward; when the model then chooses them, their steps need
no forward. The output never changes (greedy or sampled, the model chooses every token from
the same logits), and the stats say how many tokens were drafted and accepted."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from doubles import SteeredModel, script

import qrun
from qrun.backends.prefix_cache import PrefixCache
from qrun.backends.transformers import TransformersBackend
from qrun.runtime.sampler import log_softmax
from qrun.runtime.speculate import PROBE_EVERY, PromptLookup

DOC = "The invoice AB-12345 is for Jane Doe of 12 Elm Street, Springfield, paid in full."
TEMPLATE = (
    "Document: {{ doc }}\nWho: {{ gen who max_tokens=8 stop=',' }}, lives at "
    "{{ gen where regex=\"[0-9]+ [A-Z][a-z]+ Street\" }}.\n"
    "Number: {{ gen number max_tokens=6 stop=' ' }} Paid? {{ select paid options=['yes', 'no'] }}"
    "\nAgain: {{ gen again max_tokens=10 }}"
)


def copier(tiny: TransformersBackend, boost: float = 1e4, **kwargs: Any) -> SteeredModel:
    """The tiny model made to continue any context by copying: after a token that occurred
    before, it favours the token that followed that earlier occurrence (by `boost`)."""
    lookup = PromptLookup()
    held: list[list[int]] = []

    def steer(position: int, logits: npt.NDArray[Any]) -> None:
        ids = held[-1][:position]
        follow = lookup.propose(ids, 1)
        if follow:
            logits[follow[0]] += boost

    model = SteeredModel(tiny, steer, "copier", **kwargs)
    original = model.forward

    def forward(token_ids: Any, cache: Any, logits_for: int = 1) -> npt.NDArray[Any]:
        held.append(model._held.get(id(cache), [])[: cache.length()] + list(token_ids))  # noqa: SLF001
        return original(token_ids, cache, logits_for)

    model.forward = forward  # type: ignore[method-assign]
    return model


def test_greedy_output_is_the_same_with_fewer_forwards(tiny: TransformersBackend) -> None:
    model = copier(tiny)
    query = qrun.Query(TEMPLATE)
    off = query.run(model=model, doc=DOC, speculate=False)
    on = query.run(model=model, doc=DOC)
    assert on.text == off.text and on.vars == off.vars
    assert [r.token_ids for r in on.records()] == [r.token_ids for r in off.records()]
    assert on.token_ids == off.token_ids
    assert off.stats.drafted_tokens == off.stats.accepted_tokens == 0
    assert on.stats.accepted_tokens > 0
    assert on.stats.forward_calls < off.stats.forward_calls
    assert on.stats.accepted_tokens <= on.stats.drafted_tokens
    on.trace()  # the trace still validates


def test_with_the_prefix_cache_too(tiny: TransformersBackend) -> None:
    # A model scripted by position (forks of cached KV do not confuse it) that quotes the
    # document; two runs on one prefix cache, with and without speculation.
    prompt = "Document: " + DOC + "\nQuote:"
    quote = tiny.encode(" Jane Doe of 12 Elm Street, Springfield, paid")
    model = SteeredModel(tiny, script(len(tiny.encode(prompt)), quote),
                         prefix_cache=PrefixCache())
    query = qrun.Query("Document: {{ doc }}\nQuote:{{ gen q max_tokens=12 heal=false }}\nEnd")
    off = query.run(model=model, doc=DOC, speculate=False)
    on = query.run(model=model, doc=DOC)
    again = query.run(model=model, doc=DOC)
    assert on.text == off.text == again.text and on.token_ids == off.token_ids
    assert on.stats.accepted_tokens >= 5 and on.stats.forward_calls < off.stats.forward_calls


@pytest.mark.real
def test_the_default_model_quoting_a_document(smollm2: TransformersBackend) -> None:
    # The real model (its prefix cache on, as load_model gives it) copies from the document:
    # the same text, fewer forwards.
    doc = ("Order 7731 was shipped on 3 March by Northwind Traders to Maria Anders, "
           "Obere Strasse 57, Berlin. The parcel weighed 4.2 kg.")
    query = qrun.Query("{% user %}{{ doc }}\nWho received the parcel, and where?{% enduser %}"
                       "{% assistant %}{{ gen a max_tokens=30 stop='\\n' }}{% endassistant %}")
    smollm2.clear_cache()
    off = query.run(model=smollm2, doc=doc, speculate=False)
    smollm2.clear_cache()
    on = query.run(model=smollm2, doc=doc)
    assert on["a"] == off["a"] and on.token_ids == off.token_ids
    assert on.stats.accepted_tokens > 0
    assert on.stats.forward_calls < off.stats.forward_calls


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2, 3))])
def test_sampled_output_is_the_same_for_the_same_seed(tiny: TransformersBackend,
                                                      seed: int) -> None:
    model = copier(tiny, boost=3.0)
    query = qrun.Query(TEMPLATE)
    off = query.run(model=model, doc=DOC, speculate=False, temperature=1.0, seed=seed)
    on = query.run(model=model, doc=DOC, temperature=1.0, seed=seed)
    assert on.text == off.text and on.token_ids == off.token_ids


def test_batched_runs_speculate_too(tiny: TransformersBackend) -> None:
    prompt = "Document: " + DOC + "\nQuote:"
    quote = tiny.encode(" Jane Doe of 12 Elm Street, Springfield, paid")
    model = SteeredModel(tiny, script(len(tiny.encode(prompt)), quote),
                         prefix_cache=PrefixCache())
    query = qrun.Query("Document: {{ doc }}\nQuote:{{ gen q max_tokens=12 heal=false }}\nEnd")
    rows = [{"doc": DOC}] * 4
    alone = [r for r in query.run_many(rows, model=model, speculate=False)
             if isinstance(r, qrun.Result)]
    together = [r for r in query.run_many(rows, model=model, batch_size=4)
                if isinstance(r, qrun.Result)]
    assert len(together) == 4 and [r.text for r in together] == [r.text for r in alone]
    assert sum(r.stats.accepted_tokens for r in together) > 0


@pytest.mark.slow
def test_the_sampled_distribution_is_the_models(tiny: TransformersBackend) -> None:
    # The model copies with probability p (a boosted but not certain token); with speculation
    # the drafted copy is fed ahead, and the sampled token must still follow the model's
    # distribution: the frequency of copies over 400 seeds matches p (4 standard deviations).
    query = qrun.Query("Say: {{ doc }}\nAgain: {{ doc }}{{ gen x max_tokens=3 heal=false }}")
    text = "alpha beta gamma delta"
    first = query.run(model=tiny, doc=text)
    ids = first.token_ids[: first.holes["x"].start]  # the context the hole samples after
    wanted = PromptLookup().propose(ids, 1)  # "\n": what followed "delta" the first time
    plain = tiny.forward(ids, tiny.new_cache())[-1]
    others = np.delete(plain, wanted[0]).astype(np.float64)
    # A boost that makes the copy about as likely as everything else together.
    boost = float(others.max() + np.log(np.exp(others - others.max()).sum()) - plain[wanted[0]])
    model = copier(tiny, boost=boost)
    steered = model.forward(ids, model.new_cache())[-1]
    p = float(np.exp(log_softmax(steered)[wanted[0]]))
    assert 0.3 < p < 0.7, p
    runs = 400
    copies = drafted = 0
    for seed in range(runs):
        r = query.run(model=model, doc=text, temperature=1.0, seed=seed)
        copies += r.holes["x"].token_ids[0] == wanted[0]
        drafted += r.stats.drafted_tokens > 0
    assert drafted == runs  # every first step was checked with a draft fed ahead
    sigma = math.sqrt(p * (1 - p) / runs)
    assert abs(copies / runs - p) < 4 * sigma, (copies / runs, p)


def test_drafts_respect_the_constraint_and_the_budget(tiny: TransformersBackend) -> None:
    model = copier(tiny)
    r = qrun.Query("Code: ZZ-991 ZZ-991 and again {{ gen c regex=\"ZZ-[0-9]{3}\" max_tokens=6 }}"
                   ).run(model=model)
    assert r["c"].startswith("ZZ-") and len(r["c"]) == 6
    assert r.stats.drafted_tokens <= 3 * r.stats.forward_calls


def test_draft_length_follows_the_last_drafts_success() -> None:
    lookup = PromptLookup()
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2]
    assert lookup.propose(text) == [3, 4]  # a first draft is short
    # The model wrote both guessed tokens: the next draft may be longer (2 * 2 + 1).
    assert lookup.propose([*text, 3, 4]) == [5, 6, 7, 8, 9]
    # It wrote none of them: one token next time.
    assert lookup.propose([*text, 3, 4, 99, 1, 2]) == [3]
    assert lookup.propose([7, 8, 9]) == []  # no earlier occurrence of the suffix


def test_drafting_holds_back_where_guesses_cost_more_than_they_save() -> None:
    # A backend where each guessed token costs half a forward (llama.cpp): once fewer than
    # half of the recent guesses were taken, drafting stops, but for a one-token probe every
    # PROBE_EVERY steps; a probe the model takes opens the gate again.
    lookup = PromptLookup(min_rate=0.5)
    context = [1, 2, 3, 4, 7, 8, 9, 1, 2]
    assert lookup.propose(context) == [3, 4]
    for wrote in (50, 51):  # the model writes something else each time
        context += [wrote, 1, 2]
        assert lookup.propose(context) == [wrote]  # one token after a miss
    context += [52, 1, 2]  # 0 of 4 guesses taken: held back
    held = [lookup.propose(context) for _ in range(PROBE_EVERY)]
    assert held == [[]] * (PROBE_EVERY - 1) + [[52]]  # then one probe
    context += [52]  # the model took the probe: the gate opens, drafts grow again
    assert lookup.propose(context) == [1, 2, 52]
    # Without a cost (transformers) the same misses never stop drafting.
    free = PromptLookup()
    context = [1, 2, 3, 4, 7, 8, 9, 1, 2]
    free.propose(context)
    for wrote in range(50, 60):
        context += [wrote, 1, 2]
        assert free.propose(context) == [wrote]


def test_each_hole_starts_with_the_gate_open() -> None:
    lookup = PromptLookup(min_rate=0.5)
    context = [1, 2, 3, 4, 7, 8, 9, 1, 2]
    lookup.propose(context)
    for wrote in (50, 51, 52):
        context += [wrote, 1, 2]
        drafted = lookup.propose(context)
    assert drafted == []  # held back
    lookup.new_hole()
    assert lookup.propose(context) == [52]
