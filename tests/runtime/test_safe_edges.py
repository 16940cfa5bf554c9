"""Issue #12's reproductions through the Python API on the tiny model: inputs that hold a host
callable are refused before any model work (and nothing is called), and runaway templates
end fast with a positioned EvaluationError, within limits the caller can raise."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import EvaluationError, UsageError
from qrun.limits import Limits

FAST_CPU_S = 3.0
"""CPU seconds a refused runaway template may take (about 1 s on the 2-core CI machine)."""


class Spy:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> int:
        self.calls.append(args)
        return 0


@contextmanager
def fast() -> Iterator[None]:
    start = time.process_time()
    yield
    assert time.process_time() - start < FAST_CPU_S


def fails(tiny: TransformersBackend, template: str, limits: Limits | None = None,
          **inputs: Any) -> EvaluationError:
    with fast(), pytest.raises(EvaluationError) as info:
        qrun.Query(template).run(model=tiny, limits=limits, **inputs)
    return info.value


# ---- host callables ------------------------------------------------------------------------------


@pytest.mark.parametrize("template", [
    "{{ max(['touch pwned.txt'], t.run) }}",
    "{{ t.run }}",
    "{% if t.run == 1 %}{% endif %}",
    "{{ [t] | join }}",
    "{{ gen x max_tokens=t.run }}",
])
def test_a_host_callable_in_the_inputs_is_refused_and_never_called(
        tiny: TransformersBackend, template: str) -> None:
    spy = Spy()
    with pytest.raises(UsageError, match=r"input 't' at \['run'\]: a Spy is not plain data"):
        qrun.Query(template).run(model=tiny, t={"run": spy})
    assert spy.calls == []


def test_the_key_reproduction_never_compiles() -> None:
    with pytest.raises(qrun.TemplateError, match="max\\(\\) has no keyword argument 'key'"):
        qrun.Query("{{ max(['touch pwned.txt'], key=t.run) }}")


def test_run_many_refuses_only_the_bad_row(tiny: TransformersBackend) -> None:
    spy = Spy()
    results = qrun.Query("{{ t.name }}:").run_many(
        [{"t": {"name": "a"}}, {"t": {"name": spy}}, {"t": {"name": "c"}}], model=tiny)
    assert isinstance(results[0], qrun.Result) and results[0].text == "a:"
    assert isinstance(results[1], UsageError) and "input 't' at ['name']" in str(results[1])
    assert isinstance(results[2], qrun.Result) and results[2].text == "c:"
    assert spy.calls == []


def test_inputs_the_template_does_not_read_are_ignored(tiny: TransformersBackend) -> None:
    r = qrun.Query("{{ a }}").run(model=tiny, a=(1, 2), unused=object())
    assert r.text == "[1, 2]"  # the tuple became a list


# ---- unbounded work --------------------------------------------------------------------------


def test_nested_loops_emitting_text_end_fast(tiny: TransformersBackend) -> None:
    # The emitted text fills the tiny model's 4096-token context long before the steps run
    # out; either way the run ends at once, at the `x` being emitted.
    with fast(), pytest.raises(qrun.GenerationError) as info:
        qrun.Query("{% for i in range(100000) %}{% for j in range(100000) %}x"
                   "{% endfor %}{% endfor %}").run(model=tiny)
    # (The text is read as one stretch, counted exactly each time it doubles: the count is
    # where the check saw it pass the model's 4096.)
    assert re.fullmatch(r"the context would hold \d{4,5} tokens, more than model "
                        r"'tiny-llama-seed0' takes \(4096\)", info.value.message)
    assert (info.value.span.line, info.value.span.column) == (1, 57)
    longer = qrun.Limits(steps=100_000)
    err = fails(tiny, "{% for i in range(100000) %}{% for j in range(100000) %}x"
                "{% endfor %}{% endfor %}", longer)
    assert "steps left" in err.message and err.span.line == 1
    assert any("Limits(steps=...)" in note for note in err.notes)


def test_nested_empty_loops_end_fast(tiny: TransformersBackend) -> None:
    err = fails(tiny, "{% for i in range(100000) %}\n{% for j in range(100000) %}{% endfor %}"
                "{% endfor %}")
    assert "evaluation steps" in err.message and err.span.line == 2


def test_a_huge_string_before_a_hole_fails_before_any_forward(
        tiny: TransformersBackend) -> None:
    err = fails(tiny, "Intro\n{{ 'a' * 10000000 }}{{ gen x }}")
    assert "would emit more than 1,000,000 characters" in err.message
    assert (err.span.line, err.span.column) == (2, 1)
    assert any("Limits(output_chars=...)" in note for note in err.notes)


def test_big_integers_grown_by_addition_end_fast(tiny: TransformersBackend) -> None:
    # A while body's sets persist (a for body's are local to its round, as in Jinja).
    template = ("{% set n = 1 %}{% while n > 0 %}{% set n = n + n %}{% endwhile %}{{ n }}")
    err = fails(tiny, template)
    assert err.message == "integer too large (more than 10000 bits)"
    assert err.span.column == template.index("n + n") + 1


def test_a_loop_that_cannot_finish_is_refused_before_it_starts(
        tiny: TransformersBackend) -> None:
    err = fails(tiny, "{% for c in s %}{% endfor %}", s="z" * 5_000_000)
    assert "this loop has 5,000,000 iterations" in err.message and err.span.column == 1


def test_a_big_value_is_not_printed_past_the_output_budget(tiny: TransformersBackend) -> None:
    # 2,002,000 items as printed, in two lists of memory: refused before str() runs.
    err = fails(tiny, "{{ [range(1000)] * 1000 }}")
    assert "too large to print" in err.message and err.span.column == 4


def test_limits_can_be_raised_and_lowered(tiny: TransformersBackend) -> None:
    template = "{% for i in range(50) %}{{ i }},{% endfor %}"
    q = qrun.Query(template)
    assert q.run(model=tiny).text.startswith("0,1,2,")
    with pytest.raises(EvaluationError, match="more than 100 evaluation steps"):
        q.run(model=tiny, limits=Limits(steps=100))
    with pytest.raises(EvaluationError, match="emit more than 20 characters"):
        q.run(model=tiny, limits=Limits(output_chars=20))
    results = q.run_many([{}, {}], model=tiny, limits=Limits(steps=100))
    assert all(isinstance(r, EvaluationError) for r in results)
    big = qrun.Query("{% set n = 2 ** 12000 %}{{ n % 7 }}")
    with pytest.raises(EvaluationError, match="power would exceed"):
        big.run(model=tiny)
    assert big.run(model=tiny, limits=Limits(int_bits=12_001)).text == str(2 ** 12000 % 7)


def test_each_run_has_its_own_budget(tiny: TransformersBackend) -> None:
    q = qrun.Query("{% for i in range(20) %}{{ i }}{% endfor %}")
    limits = Limits(steps=1_000)
    for _ in range(3):  # would fail by the third run if the budget were shared
        assert q.run(model=tiny, limits=limits).text.startswith("0123")
