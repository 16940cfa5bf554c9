"""`{% particles N %}` blocks (runtime/particle_block.py, docs/language.md §23.5): the block's
holes drawn together by weighted particles. The weights' arithmetic is checked against the
holes' own records, the distribution against the exact conditional over both holes, built from
sampler="exact" runs (each hole's language scored whole, tests/runtime/test_exact.py)."""

from __future__ import annotations

import collections
import math
import re
from typing import Any

import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import (
    BackendError,
    EvaluationError,
    GenerationError,
    TemplateError,
    TemplateErrors,
)
from qrun.runtime.particle_block import Strata
from qrun.runtime.session import Session

# The second hole's language depends on the first's value: after " a" it has 2 values, after
# " b" 12, so the model's conditional over both holes prefers " b" where the first hole alone
# (and masking, which sees nothing ahead) prefers " a".
SECOND = '" (c|d)" if a == " a" else " (c|d|e|f|g|h|i|j|k|l|m|n)"'
FIRST = 'Go:{{ gen a regex=" (a|b)" heal=false }}'
BOTH = FIRST + '.{{ gen b regex=(' + SECOND + ') heal=false }}'


def block(count: int, body: str, before: str = "Go:", after: str = "") -> str:
    return f"{before}{{% particles {count} %}}{body}{{% endparticles %}}{after}"


def exact_first_choice(model: TransformersBackend) -> dict[str, float]:
    """p(a) under the model's conditional over both holes: P(a) from the first hole's exact
    distribution, times the second hole's exact P(language) after it (a given as text)."""
    first = qrun.Query(FIRST.replace("heal=false", 'heal=false sampler="exact"')).run(
        model=model).holes["a"]
    assert first.value_probs is not None
    second = BOTH.replace(") heal=false }}", ') heal=false sampler="exact" }}')
    weights = {}
    for value, prob in first.value_probs.items():
        evidence = qrun.Query(second).run(model=model, fill={"a": value}).holes["b"].log_evidence
        assert evidence is not None
        weights[value] = prob * math.exp(evidence)
    total = sum(weights.values())
    return {value: w / total for value, w in weights.items()}


def test_a_later_holes_constraint_corrects_the_earlier_choice(tiny: TransformersBackend) -> None:
    exact = exact_first_choice(tiny)
    assert 0.1 < exact[" a"] < 0.3  # the conditional prefers " b"
    body = BOTH.removeprefix("Go:")
    results = qrun.Query(block(16, body)).run_many([{}] * 20, model=tiny, temperature=1.0,
                                                   seed=4)
    estimate: collections.Counter[str] = collections.Counter()
    for result in results:
        (record,) = result.particle_blocks
        assert len(record.values) == 16 and sum(record.weights) == pytest.approx(1.0)
        for values, weight in zip(record.values, record.weights, strict=True):
            estimate[values["a"]] += weight / len(results)
    assert estimate[" a"] == pytest.approx(exact[" a"], abs=0.06), (estimate, exact)
    assert sum(r["a"] == " b" for r in results) >= 13
    masked = qrun.Query(BOTH).run_many([{}] * 40, model=tiny, temperature=1.0, seed=4)
    assert sum(r["a"] == " a" for r in masked) >= 28  # masking takes the first hole's view


def test_a_particles_weight_is_the_product_of_its_holes(tiny: TransformersBackend) -> None:
    # A small language is scored whole (sampler="exact": its weight is the language's exact
    # probability), a large one drawn by the block's particle (sampler="smc", one particle),
    # a select weighs its options' total, a free hole nothing.
    body = ('{{ gen a regex=" (cat|dog|bird)" heal=false }} and'
            '{{ select s options=[" one", " two", " three"] }} then{{ gen f max_tokens=2 }}'
            '{{ gen e regex=" [a-z]+" max_tokens=3 }}')
    for seed in (1, 2, 3):
        result = qrun.Query(block(1, body)).run(model=tiny, temperature=1.0, seed=seed)
        (record,) = result.particle_blocks
        a, e = result.holes["a"], result.holes["e"]
        assert a.value_probs is not None and a.particles is None  # scored whole
        assert e.particles is not None and len(e.particles) == 1  # the block's particle
        assert a.log_evidence is not None and e.log_evidence is not None
        select = result.holes["s"].option_logprobs  # type: ignore[attr-defined]
        options = math.log(sum(math.exp(lp) for lp in select.values()))
        # One particle: the block's estimate is its own weight, and the free hole adds 0.
        assert record.log_evidence == pytest.approx(a.log_evidence + options + e.log_evidence,
                                                    abs=1e-6)
        assert record.weights == [1.0] and record.chosen == 0


def test_a_proposals_draw_is_weighed_by_its_importance(tiny: TransformersBackend) -> None:
    # 8 particles, holes of 3 values: the block's proposal is not p (class Strata), and each
    # particle's weight is its holes' terms times p/q of each draw, which the records give.
    body = ('{{ gen a regex=" (cat|dog|bird)" heal=false }} and'
            '{{ select s options=[" one", " two", " three"] }}')
    result = qrun.Query(block(8, body)).run(model=tiny, temperature=1.0, seed=5)
    (record,) = result.particle_blocks
    totals = [0.0] * 8
    for hole in result.recorder.holes:
        index = record.chosen if hole.context is None else int(hole.context.split()[1]) - 1
        if hole.kind == "select":
            assert hole.options is not None
            term = math.log(sum(math.exp(lp) for _, lp, _ in hole.options))
        else:
            assert hole.log_evidence is not None
            term = hole.log_evidence
        totals[index] += term + hole.log_importance
    assert any(hole.log_importance != 0.0 for hole in result.recorder.holes)
    top = max(totals)
    shares = [math.exp(t - top) for t in totals]
    assert record.weights == pytest.approx([w / sum(shares) for w in shares], abs=1e-6)
    assert record.log_evidence == pytest.approx(top + math.log(sum(shares) / 8), abs=1e-6)
    chosen = result.holes["a"].log_importance + result.holes["s"].log_importance
    assert chosen == pytest.approx(sum(h.log_importance for h in result.recorder.holes
                                       if h.context is None))


def test_greedy_takes_the_values_weighed_most_and_a_seed_replays(
        tiny: TransformersBackend) -> None:
    animals = '" (cat|dog|bird|fish)"'
    template = block(8, f'{{{{ gen a regex={animals} }}}} and{{{{ gen b regex={animals} }}}}')
    for seed in range(12):
        greedy = qrun.Query(template).run(model=tiny, seed=seed)
        (record,) = greedy.particle_blocks
        # Particles that drew the same values are one outcome: their weights add up (taking
        # the heaviest particle instead, 2 of these 12 seeds took a lighter outcome).
        totals: collections.Counter[str] = collections.Counter()
        for values, weight in zip(record.values, record.weights, strict=True):
            totals[repr(values)] += weight
        assert {"a": greedy["a"], "b": greedy["b"]} == record.values[record.chosen]
        assert totals[repr(record.values[record.chosen])] == max(totals.values()), (
            seed, totals)
    first = qrun.Query(template).run(model=tiny, temperature=1.0, seed=8)
    again = qrun.Query(template).run(model=tiny, temperature=1.0, seed=8)
    assert first.particle_blocks[0].values == again.particle_blocks[0].values
    # Particles' rows share batches as their threads come: weights agree to the last bits.
    assert first.particle_blocks[0].weights == pytest.approx(again.particle_blocks[0].weights,
                                                             rel=1e-3, abs=1e-9)
    assert first.text == again.text


def test_the_chosen_particle_goes_on(tiny: TransformersBackend) -> None:
    # Its tokens and KV cache become the context's: what follows the block reads as after
    # the same values given as text; its `set`s and captures are the run's, its text is once
    # in the result and in the stream.
    body = BOTH.removeprefix("Go:") + '{% set seen = a ~ "/" ~ b %}'
    after = ' then{{ gen y max_tokens=5 temperature=0 }} {{ seen }}'
    shown: list[str] = []
    result = qrun.Query(block(4, body, after=after)).run(model=tiny, temperature=1.0, seed=2,
                                                         on_text=shown.append)
    assert result.text == f"Go:{result['a']}.{result['b']} then{result['y']} " \
                          f"{result['a']}/{result['b']}"
    assert "".join(shown) == result.text
    given = qrun.Query(BOTH + after.replace(" {{ seen }}", "")).run(
        model=tiny, fill={"a": result["a"], "b": result["b"]})
    assert given["y"] == result["y"]
    trace = result.trace()
    (entry,) = trace["particle_blocks"]
    assert entry["chosen"] == result.particle_blocks[0].chosen
    chosen_holes = [h for h in trace["holes"] if h["context"] is None]
    assert [h["name"] for h in chosen_holes] == ["a", "b", "y"]
    assert all(h["first_event"] is not None for h in chosen_holes)
    others = [h for h in trace["holes"] if h["context"] is not None]
    assert len(others) == 6 and all("not chosen" in h["context"] for h in others)
    page = result.to_html()
    assert "<h2>Particles</h2>" in page and "4 particles" in page


def test_loops_macros_and_forks_inside_and_around(tiny: TransformersBackend) -> None:
    template = (
        '{% macro pick() %}{{ gen m regex=" (x|y)" }}{% return m %}{% endmacro %}'
        '{% for i in range(2) %}[{% particles 3 %}'
        '{% for j in range(2) %}{{ gen x regex=" [ab]" }}{% endfor %}'
        '{% set got = pick() %}{% fork w in ["p", "q"] %}{{ w }}{{ gen f regex=" [cd]" }}'
        '{% endfork %}{% endparticles %}]{% endfor %}')
    result = qrun.Query(template).run(model=tiny, temperature=1.0, seed=5)
    assert len(result["x"]) == 4  # 2 per block run: each particle had its own list
    # (2 per round of the outer loop, as a fork in a loop gives without a block)
    assert all(v in (" a", " b") for v in result["x"])
    assert len(result["f"]) == 4 and all(v in (" c", " d") for v in result["f"])
    assert len(result.particle_blocks) == 2
    one = qrun.Query('{% macro pick() %}{{ gen m regex=" (x|y)" }}{% return m %}{% endmacro %}'
                     '{% particles 1 %}{% set got = pick() %}{% endparticles %}{{ got }}')
    run = one.run(model=tiny, temperature=1.0, seed=1)
    # The macro's hole weighs in the block's particle: its one particle's weight.
    assert run.particle_blocks[0].log_evidence < -1e-3
    assert run.text in (" x", " y")
    inside_fork = qrun.Query('{% fork w in ["A", "B"] %}{{ w }}{% particles 3 %}'
                             '{{ gen x regex=" [ab]" }}{% endparticles %}{% endfork %}')
    forked = inside_fork.run(model=tiny, temperature=1.0, seed=1)
    assert len(forked["x"]) == 2
    # Each branch's block run is the result's too, in branch order.
    assert [b.values[b.chosen] for b in forked.particle_blocks] == [
        {"x": [x]} for x in forked["x"]]
    assert all(sum(b.weights) == pytest.approx(1) for b in forked.particle_blocks)
    for context in ("fresh", "hidden"):
        inside = qrun.Query(f'A{{% {context} %}}{{% particles 3 %}}{{{{ gen y regex=" [ab]" }}}}'
                            f'{{% endparticles %}}{{% end{context} %}}')
        run = inside.run(model=tiny, temperature=1.0, seed=1)
        assert [b.values[b.chosen] for b in run.particle_blocks] == [{"y": run["y"]}], context


def test_a_particle_that_fails_weighs_nothing(tiny: TransformersBackend) -> None:
    # After " b" comes a hole whose value cannot fit its max_tokens: those particles fail, the
    # block goes on with the others; when all fail the block fails with the first one's error.
    hopeless = '{{ gen y regex=" bqzxjvbqzxjv" max_tokens=2 heal=false }}'
    body = '{{ gen x regex=" (a|b)" heal=false }}{% if x == " b" %}' + hopeless + "{% endif %}"
    failed = 0
    for result in qrun.Query(block(6, body)).run_many([{}] * 6, model=tiny, temperature=1.0,
                                                      seed=2):
        assert result["x"] == " a"
        record = result.particle_blocks[0]
        failed += sum(error is not None for error in record.errors)
        assert all(w == 0.0 and "within 2 token" in error
                   for w, error in zip(record.weights, record.errors, strict=True)
                   if error is not None)
    assert failed > 0
    with pytest.raises(GenerationError, match="within 2 token") as caught:
        qrun.Query(block(3, hopeless)).run(model=tiny, temperature=1.0, seed=1)
    assert caught.value.span.column == 21


def test_a_hole_in_a_block_cannot_be_filled(tiny: TransformersBackend) -> None:
    with pytest.raises(qrun.errors.UsageError, match="inside a fork or a particles block"):
        qrun.Query(block(3, BOTH.removeprefix("Go:"))).run(model=tiny, fill={"a": " b"})


@pytest.mark.parametrize(("body", "message"), [
    ('{{ gen x regex="a" temperature=0.5 }}', "samples at temperature 1"),
    ('{{ select x options=["a", "b"] temperature=0 }}', "samples at temperature 1"),
    ('{{ select x options=["a", "b"] normalize="mean" }}', "normalize= cannot be used"),
    ('{{ gen x regex="a" sampler="mask" }}', 'sampler="mask" cannot be used'),
    ('{{ gen x regex="a" stop="b" }}', "stop= cannot be used"),
    ('{{ gen x top_k=3 }}', "top_k= cannot be used"),
    ('{{ gen x regex="[a-z]{3,8}" seed=3 }}', "every particle would draw the same value"),
    ('{{ gen x max_tokens=3 seed=3 }}', "seed= cannot be used on a hole"),
    ("{% particles 2 %}{% endparticles %}", "cannot be inside another"),
    ("{% for i in [1] %}{% break %}{% endfor %}{% break %}", "cannot leave a '{% particles"),
])
def test_what_a_block_refuses_at_compile_time(body: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message) as caught:
        qrun.Query(block(4, body))
    assert caught.value.errors[0].span.line == 1  # type: ignore[attr-defined]


def test_a_return_cannot_leave_a_block() -> None:
    with pytest.raises(TemplateError, match="'{% return %}' cannot leave a '{% particles"):
        qrun.Query("{% macro m() %}{% particles 2 %}{% return 1 %}{% endparticles %}"
                   "{% endmacro %}{{ m() }}")


@pytest.mark.parametrize(("count", "got"), [
    ("0", "0 (int)"), ("65", "65 (int)"), ('"x"', "'x' (string)"), ("2.5", "2.5 (float)"),
    ("true", "True (bool)"), ("n", "'four' (string)")])
def test_the_count_is_checked_where_it_is(tiny: TransformersBackend, count: str,
                                          got: str) -> None:
    # A literal count when the template compiles (as a hole's particles=), a computed one
    # when the block runs; the same message either way.
    template = f'Go:{{% particles {count} %}}{{{{ gen x regex=" [ab]" }}}}{{% endparticles %}}'
    message = f"the number of particles must be an integer from 1 to 64, got {got}"
    if count != "n":
        with pytest.raises(TemplateErrors, match=re.escape(message)) as compiled:
            qrun.Query(template)
        assert compiled.value.errors[0].span.column == 17
        return
    with pytest.raises(EvaluationError, match=re.escape(message)) as caught:
        qrun.Query(template).run(model=tiny, n="four")
    assert caught.value.span.column == 17


def test_what_a_block_refuses_when_it_runs(tiny: TransformersBackend) -> None:
    with pytest.raises(EvaluationError, match="cannot be used with the run's top_k") as caught:
        qrun.Query(block(3, '{{ gen x regex=" [ab]" }}')).run(model=tiny, top_k=5)
    assert caught.value.span.column == 4
    hot = ('{% macro m() %}{{ gen y regex=" [ab]" temperature=0.5 }}{% endmacro %}'
           '{% particles 2 %}{{ m() }}{% endparticles %}')
    with pytest.raises(EvaluationError, match="samples at temperature 1") as caught:
        qrun.Query(hot).run(model=tiny)
    assert caught.value.span.column == 51  # the value of the macro's temperature=
    nested = ('{% macro m() %}{% particles 2 %}{{ gen y regex=" [ab]" }}{% endparticles %}'
              '{% endmacro %}{% particles 2 %}{{ m() }}{% endparticles %}')
    with pytest.raises(EvaluationError, match="cannot run inside another"):
        qrun.Query(nested).run(model=tiny)


def test_a_variable_may_be_named_particles(tiny: TransformersBackend) -> None:
    result: Any = qrun.Query('{{ particles }}{{ gen x regex="[ab]" particles=2 }}').run(
        {"particles": "P"}, model=tiny, seed=1)
    assert result.text[0] == "P" and result["x"] in ("a", "b")


def test_particles_ask_a_shared_question_once(tiny: TransformersBackend) -> None:
    # Every particle scores the select from the same context: the first scores the tree, the
    # others take its answer (each still draws its own option, fed with what follows).
    options = '[" alpha beta gamma delta", " epsilon zeta eta theta"]'
    body = f"{{{{ select s options={options} }}}} then{{{{ gen x regex=\" [ab]\" }}}}"
    result = qrun.Query(block(8, body)).run(model=tiny, temperature=1.0, seed=3)
    tree = sum(len(tiny.encode(o)) for o in (" alpha beta gamma delta",
                                             " epsilon zeta eta theta"))
    prompt = len(tiny.encode("Go:"))
    # One tree, then at most each particle feeding its own option and " then" (8 rows of
    # about 6 tokens); 8 trees (80 positions) without the memo.
    assert result.stats.forward_tokens < prompt + tree + 8 * (tree // 2 + 3)
    assert result.stats.forward_tokens >= prompt + tree  # the one tree
    (record,) = result.particle_blocks
    assert all(v["s"] in (" alpha beta gamma delta", " epsilon zeta eta theta")
               for v in record.values)


def test_a_backend_failure_in_a_particle_fails_the_run(tiny: TransformersBackend,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Out of llama.cpp sequences (here: the third fork of the context refused) is not a dead
    # end to weigh 0 but a failure of the run, at the block (and at a fork's tag likewise).
    forks = {"count": 0}
    original = Session.fork

    def refusing(self: Session, *args: Any, **kwargs: Any) -> Session:
        forks["count"] += 1
        if forks["count"] == 3:
            raise BackendError("all 256 llama.cpp sequences are in use")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Session, "fork", refusing)
    with pytest.raises(GenerationError, match="sequences are in use") as caught:
        qrun.Query(block(4, '{{ gen x regex=" [ab]" }}')).run(model=tiny, temperature=1.0,
                                                            seed=1)
    assert (caught.value.span.line, caught.value.span.column) == (1, 4)
    forks["count"] = 0
    with pytest.raises(GenerationError, match="sequences are in use") as caught:
        qrun.Query('Go:{% fork w in [1, 2, 3] %}{{ gen x regex=" [ab]" }}{% endfork %}').run(
            model=tiny, temperature=1.0, seed=1)
    assert caught.value.span.column == 4


# A first value that p makes rare but the second hole needs: after " w" (0.994 of the first
# hole alone on the tiny model) the second hole allows only a long string the model does not
# write, after the others a likely letter, so the conditional over both holes all but rules
# " w" out (the bench's city-2 task, tests' size).
RARE_FIRST = 'Go:{{ gen a regex=" (x|y|z|w)" heal=false }}'
RARE_BOTH = RARE_FIRST + '.{{ gen b regex=(" qqqqqqqqqq" if a == " w" else " (c|d)") heal=false }}'


def test_the_particles_try_every_value_of_a_small_hole(tiny: TransformersBackend) -> None:
    first = qrun.Query(RARE_FIRST.replace("heal=false", 'heal=false sampler="exact"')).run(
        model=tiny).holes["a"].value_probs
    assert first is not None and first[" w"] > 0.99
    weights = {}
    for value, prob in first.items():
        evidence = qrun.Query(RARE_BOTH.replace(') heal=false }}', ') heal=false sampler='
                                                '"exact" }}')).run(
            model=tiny, fill={"a": value}).holes["b"].log_evidence
        assert evidence is not None
        weights[value] = prob * math.exp(evidence)
    exact = {value: w / sum(weights.values()) for value, w in weights.items()}
    assert exact[" w"] < 0.01
    # 8 particles, 4 values: the block's proposal gives each value a particle in every run
    # (drawn from p, 8 particles all say " w" 95 % of the time), and their weights carry the
    # proposal's correction, so the weighted estimate is the conditional's.
    results = qrun.Query(block(8, RARE_BOTH.removeprefix("Go:"))).run_many(
        [{}] * 6, model=tiny, temperature=1.0, seed=7)
    estimate: collections.Counter[str] = collections.Counter()
    for result in results:
        (record,) = result.particle_blocks
        assert {values["a"] for values in record.values} == set(first)
        for values, weight in zip(record.values, record.weights, strict=True):
            estimate[values["a"]] += weight / len(results)
        assert result["a"] != " w"
    for value, prob in exact.items():
        assert estimate[value] == pytest.approx(prob, abs=0.03), (estimate, exact)


def test_the_block_proposal_draws_systematically_and_weighs_its_draw() -> None:
    scores = [math.log(0.9), math.log(0.06), math.log(0.04)]
    for seed in range(20):
        draws = [Strata(seed, index, 8).draw(scores) for index in range(8)]
        # q = 5/8·p + 1/8 each: 0.6875, 0.1625, 0.15 of 8 particles is 5.5, 1.3, 1.2
        counts = collections.Counter(index for index, _ in draws)
        assert counts[0] in (5, 6) and counts[1] >= 1 and counts[2] >= 1
        for index, log_importance in draws:
            q = 5 / 8 * math.exp(scores[index]) + 1 / 8
            assert log_importance == pytest.approx(scores[index] - math.log(q))
    # Past N/2 values no value is owed a particle: the proposal is p itself (weight 1).
    many = [math.log(0.5)] + [math.log(0.1)] * 5
    assert all(Strata(1, index, 8).draw(many)[1] == pytest.approx(0.0) for index in range(8))
    # Each particle's k-th draw is marginally q's: over seeds, particle 0 alone follows q.
    firsts = collections.Counter(Strata(seed, 0, 8).draw(scores)[0] for seed in range(4000))
    assert firsts[1] / 4000 == pytest.approx(0.1625, abs=0.02)
