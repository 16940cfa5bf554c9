"""sampler="smc" (runtime/particles.py, docs/language.md §14.8): particles towards the model's
conditional over a constraint's language. The weights' arithmetic is checked against plain
forwards of the HF model (tests/runtime/test_exact.py sequence_logprob), the estimates against
sampler="exact", which scores the whole language."""

from __future__ import annotations

import collections
import math
import re
from typing import Any

import numpy as np
import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import TemplateError
from qrun.runtime import particles as particles_module
from qrun.runtime.particles import Particle, resampled, spread
from qrun.runtime.sampler import draw
from qrun.runtime.scheduler import ForwardScheduler
from tests.runtime.test_exact import sequence_logprob

PROMPT = "The animal is a"


def runs(model: Any, template: str, count: int, **options: Any) -> list[qrun.Result]:
    return qrun.Query(template).run_many([{}] * count, model=model, **options)  # type: ignore[return-value]


@pytest.fixture
def stepwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Particles that never finish a small rest exactly (_finish_exactly): the tests of the
    token-by-token proposal use languages small enough that they would from the start."""
    monkeypatch.setattr(particles_module, "TAIL_BYTES", 0)


@pytest.mark.usefixtures("stepwise")
def test_one_particle_weighs_the_model_against_the_mask(tiny: TransformersBackend) -> None:
    # One particle, no resampling: its weight is P_model(x) / q_mask(x) exactly (every value
    # of this language must end where it does: no EOS step).
    template = PROMPT + '{{ gen x regex=" (cat|dog|bird)" sampler="smc" particles=1 }}'
    for seed in (2, 3):
        result = qrun.Query(template).run(model=tiny, temperature=1.0, seed=seed)
        record = result.holes["x"]
        context = result.token_ids[: record.start]
        model_lp = sequence_logprob(tiny, context, record.token_ids)
        masked_lp = sum(record.logprobs)  # type: ignore[arg-type]
        assert record.particles is not None and len(record.particles) == 1
        assert record.log_evidence == pytest.approx(model_lp - masked_lp, abs=1e-4)
        assert model_lp - masked_lp < -1e-3  # the mask did cut something


def test_the_weight_is_an_unbiased_estimate_of_the_languages_mass(
        tiny: TransformersBackend) -> None:
    language = '" (cat|dog|bird)"'
    exact = qrun.Query(PROMPT + f"{{{{ gen x regex={language} sampler=\"exact\" }}}}").run(
        model=tiny).holes["x"].log_evidence
    assert exact is not None
    template = PROMPT + f'{{{{ gen x regex={language} sampler="smc" particles=1 }}}}'
    draws = runs(tiny, template, 300, temperature=1.0, seed=5)
    mean = sum(math.exp(r.holes["x"].log_evidence) for r in draws) / len(draws)  # type: ignore[arg-type]
    assert mean == pytest.approx(math.exp(exact), rel=0.15)


def test_one_token_per_value_gives_the_exact_distribution(tiny: TransformersBackend) -> None:
    exact = qrun.Query('Pick: {{ gen x regex="[abc]" sampler="exact" }}').run(model=tiny)
    probs = exact.holes["x"].value_probs
    assert probs is not None and set(probs) == {"a", "b", "c"}
    draws = runs(tiny, 'Pick: {{ gen x regex="[abc]" sampler="smc" particles=4 }}', 400,
                 temperature=1.0, seed=3)
    counts = collections.Counter(r["x"] for r in draws)
    distance = 0.5 * sum(abs(counts[v] / 400 - p) for v, p in probs.items())
    assert distance < 0.08, (counts, probs)


def test_particles_correct_what_masking_gets_wrong(tiny: TransformersBackend) -> None:
    # Under the mask " a" and " b" are one choice each, then " b" is forced on through five
    # more tokens the model finds unlikely: masking takes it about half the time, the model's
    # conditional almost never.
    language = '" (a|bqzxjv)"'
    exact = qrun.Query(f'Go: {{{{ gen x regex={language} sampler="exact" }}}}').run(model=tiny)
    assert (exact.holes["x"].value_probs or {})[" a"] > 0.99
    masked = runs(tiny, f"Go: {{{{ gen x regex={language} }}}}", 100, temperature=1.0,
                  seed=1)
    assert sum(r["x"] == " a" for r in masked) < 80
    smc = runs(tiny, f'Go: {{{{ gen x regex={language} sampler="smc" particles=16 }}}}', 40,
               temperature=1.0, seed=1)
    assert sum(r["x"] == " a" for r in smc) >= 38
    record = smc[0].holes["x"]
    assert record.particles is not None and len(record.particles) == 16
    assert sum(w for _, w in record.particles) == pytest.approx(1.0)
    # Resampling dropped the particles that went into the long value and copied the others.
    assert sum(value == " a" for value, _ in record.particles) >= 15


def test_the_value_keeps_its_particles_cache(tiny: TransformersBackend) -> None:
    # The chosen particle's KV (a fork, maybe a copy of a copy) becomes the context's: what
    # follows is what follows the same text given as fixed text.
    after = " then{{ gen y max_tokens=6 temperature=0 }}"
    template = (PROMPT + '{{ gen x regex=" (cat|dog|bird)( and a (cat|dog))?" sampler="smc" '
                'particles=6 }}' + after)
    checked = 0
    for seed in range(1, 6):
        sampled = qrun.Query(template).run(model=tiny, temperature=1.0, seed=seed)
        record = sampled.holes["x"]
        if record.token_ids[record.prefix_tokens :] != tiny.encode(record.text):
            continue  # a non-canonical spelling: fixed text would read otherwise
        follow = qrun.Query(PROMPT + sampled["x"] + after).run(model=tiny)
        assert sampled["y"] == follow["y"], seed
        checked += 1
    assert checked >= 2


SMALL = PROMPT + '{{ gen x regex=" (cat|dog|bird)s?" sampler="smc" particles=8 }}.'


def test_same_seed_same_value(tiny: TransformersBackend) -> None:
    first = qrun.Query(SMALL).run(model=tiny, temperature=1.0, seed=11)
    again = qrun.Query(SMALL).run(model=tiny, temperature=1.0, seed=11)
    assert first.holes["x"].particles == again.holes["x"].particles
    assert first.text == again.text


@pytest.mark.parametrize("finished", ["exactly", "stepwise"])
def test_greedy_takes_the_value_the_particles_weigh_most(
        tiny: TransformersBackend, finished: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Finished exactly, every particle weighs the same and stands for every value: a greedy
    # value drawn among them would be any value (it was, by seed). Token by token, particles
    # that drew alike are one value, which can outweigh a lone heavier particle.
    if finished == "stepwise":
        monkeypatch.setattr(particles_module, "TAIL_BYTES", 0)
    for seed in range(6):
        greedy = qrun.Query(SMALL).run(model=tiny, seed=seed)
        probs = greedy.holes["x"].value_probs
        assert probs is not None and len(probs) > 1
        assert greedy["x"] == max(probs, key=probs.__getitem__), (seed, probs)
        # The context holds the value and the run goes on from it.
        assert greedy.text == f"{PROMPT}{greedy['x']}."


def test_json_grammar_and_a_loop(tiny: TransformersBackend) -> None:
    schema = {"type": "string", "enum": ["red", "green", "blue"]}
    template = ('{% for i in range(2) %}Colour: {{ gen c json=schema sampler="smc" '
                'particles=4 }}\n{% endfor %}Answer: {{ gen a grammar=g sampler="smc" }}')
    result = qrun.Query(template).run(model=tiny, schema=schema, g='start: "yes" | "no"',
                                      temperature=1.0, seed=4)
    assert all(c in ("red", "green", "blue") for c in result["c"])
    assert result["a"] in ("yes", "no")
    assert len(result.holes["a"].particles or []) == 16  # the default


@pytest.mark.parametrize(("hole", "message"), [
    ('{{ gen x regex="a|b" sampler="mask" particles=4 }}', 'applies to sampler="smc" only'),
    ('{{ gen x regex="a|b" sampler="exact" particles=4 }}', 'applies to sampler="smc"'),
    ('{{ gen x regex="a|b" sampler="smc" particles=65 }}', "particles must be an integer"),
    ('{{ gen x sampler="smc" }}', "needs a constraint"),
    ('{{ gen x regex="a|b" sampler="smc" top_k=3 }}', "cannot be used with top_k="),
    ('{{ gen x regex="a|b" sampler="exact" ess_threshold=0.2 }}',
     'ess_threshold= applies to sampler="smc" only'),
    ('{{ gen x regex="a|b" ess_threshold=1.5 }}', "ess_threshold must be a number from 0 to 1"),
    ('{{ gen x ess_threshold=0.5 }}', "needs a constraint"),
])
def test_what_smc_refuses_at_compile_time(hole: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message) as caught:
        qrun.Query("Hi " + hole)
    # The caret is at the argument at fault where there is one (the one the message names).
    named = re.search(r"(\w+)=( applies| must|$)", message) or re.search(r"with (\w+)=", message)
    if named is not None:
        where = caught.value.span.column - 1 - len("Hi ")
        assert hole[where:].startswith(named.group(1) + "="), (hole[where:], message)


def test_the_run_and_the_front_matter_choose_for_holes_that_do_not(
        tiny: TransformersBackend) -> None:
    template = ('Go: {{ gen a regex=" (cat|dog)" }} {{ gen b regex=" (cat|dog)" stop="." }} '
                '{{ gen c max_tokens=2 }} {{ gen d regex=" (cat|dog)" sampler="mask" }}'
                '{{ gen e regex=" (cat|dog)" particles=3 }}')
    result = qrun.Query(template).run(model=tiny, sampler="smc", particles=5, seed=1,
                                      temperature=1.0)
    holes = result.holes
    assert len(holes["a"].particles or []) == 5  # the run's
    assert holes["b"].particles is None  # stop= is refused by particles: this hole masks
    assert holes["c"].particles is None  # no constraint
    assert holes["d"].particles is None  # its own choice
    assert len(holes["e"].particles or []) == 3  # particles= alone is sampler="smc"
    fronted = qrun.Query("---\nsampler: exact\n---\n" + template).run(model=tiny)
    assert fronted.holes["a"].value_probs is not None and fronted.holes["b"].value_probs is None
    assert len(fronted.holes["e"].particles or []) == 3


def test_a_run_sampler_with_a_reshaping_option_is_refused() -> None:
    with pytest.raises(qrun.errors.UsageError, match="cannot be used with top_p"):
        qrun.RunOptions(sampler="smc", top_p=0.5)
    with pytest.raises(qrun.errors.UsageError, match="particles must be an integer from 1"):
        qrun.RunOptions(particles=0)
    assert qrun.RunOptions(particles=8).resolved().sampler == "smc"


def test_particles_in_forks_batch_through_the_runs_scheduler(tiny: TransformersBackend) -> None:
    template = ('{% fork w in ["One", "Two", "Three"] %}{{ w }}:{{ gen x regex=" (cat|dog)s?" '
                'sampler="smc" particles=4 }}{% endfork %}')
    first = qrun.Query(template).run(model=tiny, temperature=1.0, seed=9)
    assert len(first["x"]) == 3
    assert all(v in (" cat", " dog", " cats", " dogs") for v in first["x"])
    again = qrun.Query(template).run(model=tiny, temperature=1.0, seed=9)
    # Branches' rows share batches as their threads come: the logits (and so the weights)
    # may differ in the last bits from one run to the next (docs/language.md §14.8), not the
    # particles' values.
    for one, other in zip(first.hole_lists["x"], again.hole_lists["x"], strict=True):
        assert [v for v, _ in one.particles or []] == [v for v, _ in other.particles or []]
        assert [w for _, w in one.particles or []] == pytest.approx(
            [w for _, w in other.particles or []], rel=1e-3, abs=1e-9)


def test_a_holes_sampler_beside_the_runs_reshaping_option_is_refused(
        tiny: TransformersBackend) -> None:
    with pytest.raises(qrun.errors.EvaluationError, match="the run's top_k") as caught:
        qrun.Query('Hi {{ gen x regex="a|b" sampler="smc" }}').run(model=tiny, top_k=5)
    assert caught.value.span.column == 33  # the sampler= value
    fronted = "---\nmin_p: 0.1\n---\n" + 'Hi {{ gen x regex="a|b" sampler="exact" }}'
    with pytest.raises(qrun.errors.EvaluationError, match="the run's min_p"):
        qrun.Query(fronted).run(model=tiny)


class _Cursor:
    def copy(self) -> _Cursor:
        return _Cursor()


def test_resampling_leaves_finished_particles_and_keeps_the_live_ones_total() -> None:
    finished = [Particle(_Cursor(), None, log_weight=math.log(0.01), finish="match")  # type: ignore[arg-type]
                for _ in range(4)]
    heavy = [Particle(_Cursor(), None, log_weight=0.0) for _ in range(2)]  # type: ignore[arg-type]
    light = [Particle(_Cursor(), None, log_weight=math.log(1e-4)) for _ in range(10)]  # type: ignore[arg-type]
    before = [*finished, *heavy, *light]
    total = sum(math.exp(p.log_weight) for p in heavy + light)
    after = resampled(before, np.random.default_rng(0), 0.5)
    assert after is not before and len(after) == 16
    # The finished ones are all there, untouched: their weights owe nothing more.
    assert [p for p in after if p.finish] == finished
    assert all(p.log_weight == math.log(0.01) for p in finished)
    live = [p for p in after if not p.finish]
    assert len(live) == 12 and sum(p in heavy for p in live) >= 1
    assert sum(math.exp(p.log_weight) for p in live) == pytest.approx(total)
    # Light ones are dropped for copies of heavy ones.
    assert not any(p is q for p in live for q in light)


def test_the_ess_threshold_says_when_particles_are_resampled() -> None:
    # ESS of 1 heavy and 15 light particles: (1 + 15e)² / (1 + 15e²) ≈ 1.3 of 16.
    def live() -> list[Particle]:
        return [Particle(_Cursor(), None, log_weight=w)  # type: ignore[arg-type]
                for w in [0.0] + [math.log(0.001)] * 15]

    for threshold, resamples in ((0.0, False), (0.05, False), (0.5, True), (1.0, True)):
        before = live()
        after = resampled(before, np.random.default_rng(0), threshold)
        assert (after is not before) == resamples, threshold
    # Nearly even weights (ESS 15.9 of 16): only a threshold of 1 resamples them.
    even = [Particle(_Cursor(), None, log_weight=math.log(1.0 + 0.01 * k))  # type: ignore[arg-type]
            for k in range(16)]
    assert resampled(even, np.random.default_rng(0), 0.5) is even
    assert resampled(even, np.random.default_rng(0), 1.0) is not even


def test_the_ess_threshold_reaches_the_sampler(tiny: TransformersBackend,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # The hole's argument, else the run's option, else the front matter's, else 0.5; the
    # argument alone asks for sampler="smc", as particles= does.
    seen: list[float] = []

    def spy(particles: list[Particle], generator: np.random.Generator, threshold: float
            ) -> list[Particle]:
        seen.append(threshold)
        return resampled(particles, generator, threshold)

    monkeypatch.setattr(particles_module, "resampled", spy)
    hole = 'Go:{{ gen a regex=" (cat|dog)" heal=false ARG}}'
    cases = [(hole.replace("ARG", "ess_threshold=0.25 "), {}, 0.25),
             (hole.replace("ARG", 'sampler="smc" '), {"ess_threshold": 0.75}, 0.75),
             ("---\ness_threshold: 0\n---\n" + hole.replace("ARG", ""), {}, 0.0),
             (hole.replace("ARG", "particles=4 "), {}, 0.5)]
    for template, options, expected in cases:
        seen.clear()
        result = qrun.Query(template).run(model=tiny, temperature=1.0, seed=1, **options)
        assert result.holes["a"].particles is not None
        assert seen and set(seen) == {expected}, (template, seen)


def test_a_small_rest_is_finished_exactly(tiny: TransformersBackend,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # A language small from the start: every particle is finished by scoring its canonical
    # spellings whole, so the estimate of its mass is exact's (whose other spellings hold
    # under 10⁻⁴ of it here); token by token it is a noisy estimate.
    small = '" (cat|dog|bird)"'
    exact = qrun.Query(f"{PROMPT}{{{{ gen x regex={small} sampler=\"exact\" }}}}").run(
        model=tiny).holes["x"]
    smc = qrun.Query(f"{PROMPT}{{{{ gen x regex={small} sampler=\"smc\" particles=4 }}}}").run(
        model=tiny, temperature=1.0, seed=2).holes["x"]
    assert exact.log_evidence is not None
    assert smc.log_evidence == pytest.approx(exact.log_evidence, abs=1e-4)
    # Each particle counts every value it could have drawn by its probability, not its draw:
    # 4 particles' estimate is the conditional itself.
    assert exact.value_probs is not None and smc.value_probs is not None
    assert smc.value_probs == pytest.approx(exact.value_probs, abs=1e-4)
    # A larger one: particles write the first word token by token, then, its rest small
    # (three words and a full stop), finish exactly: the weights lose the variance of the
    # rest's tokens and the estimate comes closer.
    language = '" (one|two|six|ten) (cats|dogs|birds)\\."'
    whole = qrun.Query(f'Go:{{{{ gen x regex={language} heal=false sampler="exact" }}}}').run(
        model=tiny).holes["x"].value_probs
    assert whole is not None and len(whole) == 12
    template = f'Go:{{{{ gen x regex={language} heal=false sampler="smc" particles=4 }}}}'

    def measured() -> tuple[float, float]:
        results = runs(tiny, template, 40, temperature=1.0, seed=3)
        spread = float(np.std([r.holes["x"].log_evidence for r in results]))
        mean: collections.Counter[str] = collections.Counter()
        for result in results:
            for value, share in (result.holes["x"].value_probs or {}).items():
                mean[value] += share / len(results)
        return spread, 0.5 * sum(abs(mean[v] - p) for v, p in whole.items())

    # A bound the rest after the first word fits (a tree of three fed nodes: " cats" and the
    # others, each followed by the full stop) and the whole language's tree (16 nodes) does
    # not, pooled over the 4 particles at the first step (12).
    monkeypatch.setattr(particles_module, "TAIL_NODES", 3)
    spread, distance = measured()
    monkeypatch.setattr(particles_module, "TAIL_BYTES", 0)
    spread_stepwise, distance_stepwise = measured()
    # Measured: spread 0.083 against 0.38, distance 0.018 against 0.048 (drawing from p
    # where the proposal is now √p, TEMPER: 0.18 against 0.44, 0.083 against 0.135).
    assert spread < 0.5 * spread_stepwise, (spread, spread_stepwise)
    assert distance < 0.5 * distance_stepwise, (distance, distance_stepwise)


@pytest.mark.usefixtures("stepwise")
def test_particles_on_one_path_are_fed_as_one_row(tiny: TransformersBackend) -> None:
    # 16 particles that all begin " b" (one token, then "cf" or "df", one token each): the
    # step after " b" feeds one row, not 16 (copies share their KV cache until they part).
    template = 'Pick:{{ gen x regex=" b(c|d)(e|f)" sampler="smc" particles=16 heal=false }}'
    result = qrun.Query(template).run(model=tiny, temperature=1.0, seed=1)
    assert tiny.encode(" bcf")[0] == tiny.encode(" bdf")[0] == tiny.encode(" b")[0]
    prompt = len(tiny.encode("Pick:"))
    assert result.stats.forward_tokens <= prompt + 2  # 16 + prompt when each fed its own
    assert len(result.holes["x"].particles or []) == 16
    # Particles that part after sharing: each value keeps its own particle's cache, as the
    # same text given as fixed text would read.
    follow = " then{{ gen y max_tokens=4 temperature=0 }}"
    long = ('Pick:{{ gen x regex=" (a|b)(c|d)(e|f)" sampler="smc" particles=16 heal=false }}'
            + follow)
    for seed in (3, 4, 5):
        sampled = qrun.Query(long).run(model=tiny, temperature=1.0, seed=seed)
        given = qrun.Query("Pick:" + sampled["x"] + follow).run(model=tiny)
        assert sampled["y"] == given["y"], seed


def test_particles_on_one_path_spread_over_its_tokens() -> None:
    # Five tokens, one likely: 16 particles drawn together give every token one particle
    # (2·5 ≤ 16: the proposal mixes in 1/16 each) and the likely one the rest; each draw's
    # importance weight p/q makes the weighted particles estimate p exactly in expectation.
    p = np.array([0.9, 0.04, 0.03, 0.02, 0.01])
    total = np.zeros(5)
    for seed in range(2000):
        draws = spread(p * 3.0, 16, np.random.default_rng(seed))  # weights need not sum to 1
        counts = np.bincount([k for k, _ in draws], minlength=5)
        assert (counts >= 1).all(), counts
        for k, log_importance in draws:
            assert log_importance <= math.log(2.0) + 1e-12
            total[k] += math.exp(log_importance) / 16
    assert total / 2000 == pytest.approx(p, abs=0.005)
    # Past count/2 tokens: the proposal is p tempered, q ∝ √p, drawn systematically (each
    # token gets ⌊16q⌋ or ⌈16q⌉ particles), each weight × p/q: every token of p = 0.05 gets
    # a particle each time (16q = 1.22), where p itself gives one 0.8 of the time; the
    # weighted particles still estimate p.
    many = np.array([0.5, *([0.05] * 10)])
    q = np.sqrt(many) / np.sqrt(many).sum()
    total = np.zeros(len(many))
    for seed in range(2000):
        draws = spread(many, 16, np.random.default_rng(seed))
        counts = np.bincount([k for k, _ in draws], minlength=len(many))
        assert counts[0] in (math.floor(16 * q[0]), math.ceil(16 * q[0]))
        assert (counts >= 1).all(), counts
        for k, log_importance in draws:
            assert log_importance == pytest.approx(math.log(many[k] / q[k]))
            total[k] += math.exp(log_importance) / 16
    assert total / 2000 == pytest.approx(many, abs=0.005)
    # One particle draws as the masked loop does.
    assert spread(p, 1, np.random.default_rng(7)) == [(draw(p, np.random.default_rng(7)), 0.0)]


def test_a_twist_moves_the_particles_not_the_estimate() -> None:
    # With a look ahead's twist (what each token leads to), 8 particles on a path draw from
    # p × twist: of 4 tokens the twist leaves 3 (2·3 ≤ 8, so stratified_proposal over it); the
    # token of twist 0 gets none, and each weight × p/q keeps the weighted particles an
    # estimate of p wherever the twist is not 0.
    p = np.array([0.6, 0.3, 0.08, 0.02])
    twist = np.array([0.01, 0.5, 1.0, 0.0])
    base = p * twist / (p * twist).sum()
    q = (1 - 3 / 8) * base + np.where(base > 0, 1 / 8, 0.0)
    total = np.zeros(4)
    for seed in range(2000):
        draws = spread(p, 8, np.random.default_rng(seed), twist)
        counts = np.bincount([k for k, _ in draws], minlength=4)
        assert counts[3] == 0 and counts[1] in (math.floor(8 * q[1]), math.ceil(8 * q[1]))
        for k, log_importance in draws:
            assert log_importance == pytest.approx(math.log(p[k] / q[k]))
            total[k] += math.exp(log_importance) / 8
    assert total[:3] / 2000 == pytest.approx(p[:3], abs=0.01)
    # A twist that is 0 everywhere (every token a dead end) leaves the draw to p.
    assert spread(p, 8, np.random.default_rng(3), np.zeros(4)) == spread(
        p, 8, np.random.default_rng(3))


@pytest.mark.usefixtures("stepwise")
def test_particles_on_a_path_look_ahead_before_they_draw(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # " b" is a likely first token but forces five unlikely ones after it: looking one
    # token ahead, the particles see that after " b" the next step's share is small and put
    # the fewest they may there (without resampling, which would drop them later); the
    # estimate of the language's mass (over canonical spellings: " a" then nothing, since
    # " bqzxjv" is 1e-27 of it) stays unbiased either way.
    template = ('Go: {{ gen x regex=" (a|bqzxjv)" sampler="smc" particles=16 '
                'ess_threshold=0 }}')

    def on_b(lookahead: bool) -> tuple[float, list[float]]:
        monkeypatch.setattr(particles_module, "LOOKAHEAD", lookahead)
        results = runs(tiny, template, 30, temperature=1.0, seed=2)
        share = sum(sum(value != " a" for value, _ in r.holes["x"].particles or [])
                    for r in results) / (16 * len(results))
        return share, [math.exp(r.holes["x"].log_evidence or -math.inf) for r in results]

    looked, looked_mass = on_b(True)
    blind, blind_mass = on_b(False)
    # Two tokens and 16 particles: each token has at least one (stratified_proposal), and
    # looking ahead " b" has no more (measured: 0.146 of them blind).
    assert looked == pytest.approx(1 / 16) and blind > 0.12, (blind, looked)
    result = qrun.Query(template).run(model=tiny, temperature=1.0, seed=2)
    record = result.holes["x"]
    assert record.text == " a"
    mass = math.exp(sequence_logprob(tiny, result.token_ids[: record.start], record.token_ids))
    # Looking, 15 particles stand on " a" whose proposal is 15/16 and the weights' mean is
    # its probability to the digit that " b" adds; blind, the mean over runs is.
    assert looked_mass == pytest.approx([mass] * 30, rel=1e-3)
    assert sum(blind_mass) / 30 == pytest.approx(mass, rel=0.05)


@pytest.mark.usefixtures("stepwise")
def test_particles_try_every_first_word(tiny: TransformersBackend) -> None:
    # 16 particles at the start of a 4-word choice each run: every word has a particle,
    # whatever the model's first-token preference (drawn independently, the tiny model's
    # likeliest word takes most of them and a word is often left out).
    template = ('Go:{{ gen x regex=" (one|two|six|ten) (cats|dogs)\\\\." heal=false '
                'sampler="smc" particles=16 ess_threshold=0 }}')
    for result in runs(tiny, template, 6, temperature=1.0, seed=4):
        words = {value.split()[0] for value, _ in result.holes["x"].particles or []}
        assert words == {"one", "two", "six", "ten"}, words


def test_a_rest_is_finished_exactly_only_within_the_tree_bound(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two words and a full stop, small in bytes from the start: within TAIL_NODES the whole
    # language is one tree at the first step (the estimate of its mass is exact's); with no
    # node to spare, only rests that feed nothing (a last one-token word, the full stop) are
    # finished so, the rest written token by token: no tree is fed, the estimate is noisy.
    language = '" (one|two|six) (cats|dogs)\\."'
    exact = qrun.Query(f'Go:{{{{ gen x regex={language} heal=false sampler="exact" }}}}').run(
        model=tiny).holes["x"].log_evidence
    template = f'Go:{{{{ gen x regex={language} heal=false sampler="smc" particles=4 }}}}'
    whole = qrun.Query(template).run(model=tiny, temperature=1.0, seed=2)
    assert whole.holes["x"].log_evidence == pytest.approx(exact, abs=1e-3)
    assert whole.stats.rollback_tokens > 0  # the tree's nodes, fed and not kept
    monkeypatch.setattr(particles_module, "TAIL_NODES", 0)
    stepwise = [qrun.Query(template).run(model=tiny, temperature=1.0, seed=seed)
                for seed in (2, 3, 4)]
    assert all(r.stats.rollback_tokens == 0 for r in stepwise)
    assert any(abs((r.holes["x"].log_evidence or 0.0) - (exact or 0.0)) > 1e-3 for r in stepwise)


def test_the_particles_on_a_path_pool_their_tree_bound(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # A language whose whole tree is larger than one particle's bound but not than four's:
    # four particles on the first path are finished together, by that tree, at the first
    # step (the estimate of the language's mass is exact's whatever the seed); one particle
    # alone goes token by token first (its estimate is noisy).
    language = '" (one|two|six) (cats|dogs)\\."'
    exact = qrun.Query(f'Go:{{{{ gen x regex={language} heal=false sampler="exact" }}}}').run(
        model=tiny).holes["x"].log_evidence
    template = 'Go:{{{{ gen x regex={} heal=false sampler="smc" particles={} }}}}'
    nodes = qrun.Query(template.format(language, 4)).run(
        model=tiny, temperature=1.0, seed=2).stats.rollback_tokens  # the whole tree, fed once
    assert nodes > 4
    monkeypatch.setattr(particles_module, "TAIL_NODES", math.ceil(nodes / 4))
    for seed in (2, 3, 4):
        pooled = qrun.Query(template.format(language, 4)).run(model=tiny, temperature=1.0,
                                                              seed=seed)
        assert pooled.holes["x"].log_evidence == pytest.approx(exact, abs=1e-3)
        assert pooled.stats.rollback_tokens == nodes
    alone = [qrun.Query(template.format(language, 1)).run(model=tiny, temperature=1.0, seed=seed)
             for seed in (2, 3, 4)]
    assert any(abs((r.holes["x"].log_evidence or 0.0) - (exact or 0.0)) > 1e-3 for r in alone)


def test_batched_runs_finish_their_particles_in_one_tree_forward(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # Runs of a batch whose particles each finish the language exactly at the first step send
    # their trees together, and the scheduler scores them in one forward (TreeBatch): each
    # run's estimate is still exact's for its own prompt (a row of the batch sees only its
    # own cache, of its own length, and its own nodes).
    language = '" (one|two|six) (cats|dogs)\\."'
    prompts = [{"w": w} for w in ("", " now", " and then, at last,", " again")]
    exact_query = qrun.Query(
        f'Go{{{{ w }}}}:{{{{ gen x regex={language} heal=false sampler="exact" }}}}')
    exact = [exact_query.run(model=tiny, **w).holes["x"] for w in prompts]
    sizes: list[int] = []
    forward_trees = tiny.forward_trees

    def spy(items: Any) -> Any:
        sizes.append(len(items))
        return forward_trees(items)

    monkeypatch.setattr(tiny, "forward_trees", spy)
    template = (f'Go{{{{ w }}}}:{{{{ gen x regex={language} heal=false sampler="smc" '
                'particles=4 }}')
    batch = qrun.Query(template).run_many(prompts, model=tiny, temperature=1.0, seed=7,
                                          batch_size=4)
    assert sizes and max(sizes) > 1 and sum(sizes) <= 4
    assert len({e.log_evidence for e in exact}) == 4
    for result, alone in zip(batch, exact, strict=True):
        assert isinstance(result, qrun.Result) and alone.value_probs is not None
        record = result.holes["x"]
        assert record.log_evidence == pytest.approx(alone.log_evidence, abs=1e-3)
        assert record.value_probs is not None
        for value, p in alone.value_probs.items():
            assert record.value_probs.get(value, 0.0) == pytest.approx(p, abs=1e-3)


@pytest.mark.usefixtures("stepwise")
def test_a_step_feeds_its_looks_and_its_tokens_in_one_forward(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # The paths where several particles stand look ahead, the others feed the token they
    # took: both are rows of the step's one forward (a forward reads every weight once), and
    # the look's rows are all a looking path needs (no second forward for its particles).
    per_step: list[list[int]] = [[]]  # each step's forwards, as their rows
    step, feed = particles_module.resampled, particles_module.forward_step

    def resampled_counting(*args: Any) -> Any:
        per_step.append([])
        return step(*args)

    def forward_step_counting(model: Any, batcher: Any, scorer: Any, rows: Any,
                              trees: Any) -> Any:
        per_step[-1].append(len(rows))
        return feed(model, batcher, scorer, rows, trees)

    monkeypatch.setattr(particles_module, "resampled", resampled_counting)
    monkeypatch.setattr(particles_module, "forward_step", forward_step_counting)
    for r in runs(tiny, 'Go: {{ gen x regex="[ab]{6}" sampler="smc" particles=16 }}', 4,
                  temperature=1.0, seed=5):
        assert len(r.holes["x"].particles or []) == 16
    assert max(len(forwards) for forwards in per_step) == 1, per_step
    # Not vacuous: the particles go apart, and steps feed several rows.
    assert max(sum(forwards) for forwards in per_step) >= 4, per_step


def test_a_step_that_steps_and_finishes_paths_waits_for_one_batch(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # Words of one to eight letters: after " a" the rest is small and that path is finished
    # by a tree, while the particles on " ijkl..." go on token by token. The step's rows and
    # its trees go to the run's scheduler together: one batch, where the other runs of a
    # run_many wait for each (8 runs of bench/faithfulness.py's 2,400 sentences, 4 at a time:
    # 37 batches -> 31, the same values).
    monkeypatch.setattr(particles_module, "TAIL_NODES", 2)
    per_step: list[list[tuple[int, int]]] = []  # each step's batches: (rows, trees)
    step, submit = particles_module.resampled, ForwardScheduler.submit_step

    def resampled_counting(*args: Any) -> Any:
        per_step.append([])
        return step(*args)

    def submit_counting(self: ForwardScheduler, order: Any, rows: Any, trees: Any = ()) -> Any:
        if per_step:
            per_step[-1].append((len(rows), len(trees)))
        return submit(self, order, rows, trees)

    monkeypatch.setattr(particles_module, "resampled", resampled_counting)
    monkeypatch.setattr(ForwardScheduler, "submit_step", submit_counting)
    template = ('Go:{{ gen x regex=" (a|b|cd|efgh|ijklmnop)(x|yz)\\." heal=false '
                'sampler="smc" particles=8 }}')
    for seed in (0, 2):
        per_step.clear()
        record = qrun.Query(template).run(model=tiny, temperature=1.0, seed=seed).holes["x"]
        assert len(record.particles or []) == 8
        # A step's batches after the first step (whose first batch feeds the prompt), the
        # last step's (the hole's last forward) left out.
        steps = per_step[:-1]
        assert all(len(batches) <= 1 for batches in steps), per_step
        assert any(rows and trees for batches in steps for rows, trees in batches), per_step
