"""sampler="exact" and sampler="smc" on the llamacpp backend (tests marked `llamacpp`): values
in the language, the exact conditional close to the transformers backend's (the same weights,
other kernels), particles that correct what masking gets wrong on the default model. Skips
without llama_cpp unless QRUN_REQUIRE_LLAMACPP=1."""

from __future__ import annotations

import gc

import pytest
from tiers import require_llama_cpp

import qrun
from qrun.backends.transformers import TransformersBackend

pytestmark = pytest.mark.llamacpp

require_llama_cpp()

from qrun.backends.llamacpp import LlamaCppBackend  # noqa: E402

CITY = ("{% user %}Name one city in France. The name only.{% enduser %}\n{% assistant %}"
        '{{ gen city regex="(Paris Hilton|Lyon|Marseille|Toulouse)" SAMPLER }}{% endassistant %}')
VALUES = {"Paris Hilton", "Lyon", "Marseille", "Toulouse"}


def test_exact_agrees_with_transformers(llama: LlamaCppBackend,
                                        smollm2: TransformersBackend) -> None:
    query = qrun.Query(CITY.replace("SAMPLER", 'sampler="exact"'))
    here = query.run(model=llama).holes["city"].value_probs
    there = query.run(model=smollm2).holes["city"].value_probs
    assert here is not None and there is not None and set(here) == VALUES == set(there)
    assert 0.5 * sum(abs(here[v] - there[v]) for v in VALUES) < 0.1
    # " Paris" is a likely start that only a forced " Hilton" can follow: the model's
    # conditional gives the whole value next to nothing.
    assert here["Paris Hilton"] < 0.01


def test_particles_leave_the_dead_end_masking_takes(llama: LlamaCppBackend) -> None:
    masked = qrun.Query(CITY.replace("SAMPLER", "")).run_many(
        [{}] * 40, model=llama, temperature=1.0, seed=1)
    assert sum(r["city"] == "Paris Hilton" for r in masked) >= 8  # type: ignore[index]
    smc = qrun.Query(CITY.replace("SAMPLER", 'sampler="smc" particles=16')).run_many(
        [{}] * 20, model=llama, temperature=1.0, seed=1)
    assert all(r["city"] in VALUES for r in smc)  # type: ignore[index]
    assert sum(r["city"] == "Paris Hilton" for r in smc) <= 1  # type: ignore[index]
    record = smc[0].holes["city"]  # type: ignore[union-attr]
    assert record.particles is not None and len(record.particles) == 16


SENTENCE = ("{% user %}Write one short sentence about an animal.{% enduser %}{% assistant %}"
            '{{ gen subject regex="(The cat|The dog|A bird)" }} '
            '{{ gen verb regex="(sleeps|runs)" }}.{% endassistant %}')


def test_a_particles_block_sees_the_later_hole(llama: LlamaCppBackend) -> None:
    # Under the mask the subject is chosen before the verbs are seen: "A bird" about 40 % of
    # the time, where the model's conditional over both holes gives it about 3 %
    # (docs/language.md §23.5).
    masked = qrun.Query(SENTENCE).run_many([{}] * 40, model=llama, temperature=1.0, seed=1)
    assert sum(r["subject"] == "A bird" for r in masked) >= 8  # type: ignore[index]
    block = SENTENCE.replace("{{ gen subject", "{% particles 8 %}{{ gen subject").replace(
        "}}.{% endassistant %}", "}}.{% endparticles %}{% endassistant %}")
    results = qrun.Query(block).run_many([{}] * 12, model=llama, temperature=1.0, seed=1)
    bird = 0.0
    for result in results:
        (record,) = result.particle_blocks  # type: ignore[union-attr]
        bird += sum(w for v, w in zip(record.values, record.weights, strict=True)
                    if v["subject"] == "A bird") / len(results)
        assert f"{result['subject']} {result['verb']}." in result.text  # type: ignore[index]
    assert bird < 0.12


def test_a_blocks_particles_give_their_sequences_back(llama: LlamaCppBackend) -> None:
    # Each particle holds a llama.cpp sequence (of 256) until the block ends; they are given
    # back then, not when the garbage collector breaks the branch runs' reference cycles
    # (three blocks of 64 particles ran out of sequences that way: 32 each time here). Their
    # small holes are scored whole, 16 trees side by side: under that load a tree keeps no
    # sequence per leaf (LlamaCppBackend.forward_tree).
    template = ('Animal:{% particles 32 %}{{ gen a regex=" (cat|dog|bird)" }} and'
                '{{ gen b regex=" (one|two)" }}{% endparticles %}')
    gc.disable()
    try:
        qrun.Query(template).run(model=llama, temperature=1.0, seed=0)
        free = llama.free_sequences()  # after a run: the prefix cache holds no sequence
        for seed in range(1, 3):
            result = qrun.Query(template).run(model=llama, temperature=1.0, seed=seed)
            assert len(result.particle_blocks[0].values) == 32
            assert llama.free_sequences() >= free - 2
    finally:
        gc.enable()
