"""sampler="exact" and sampler="smc" on vLLM (tests marked `vllm`): in process both work and
the exact conditional is the transformers backend's; a vLLM server scores an exact hole
through its prompt log-probabilities and refuses particles at the hole."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import GenerationError

pytestmark = pytest.mark.vllm

CITY = ("{% user %}Name one city in France. The name only.{% enduser %}\n{% assistant %}"
        '{{ gen city regex="(Paris Hilton|Lyon|Marseille|Toulouse)" SAMPLER }}{% endassistant %}')
VALUES = {"Paris Hilton", "Lyon", "Marseille", "Toulouse"}


@pytest.fixture(scope="module")
def vllm_remote(vllm_server_url: str) -> Iterator[Any]:
    backend = qrun.load_model("smollm2", backend="vllm", url=vllm_server_url)
    yield backend
    backend.close()


def tv(p: dict[str, float], q: dict[str, float]) -> float:
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in {*p, *q})


def test_in_process(vllm_engine: Any, smollm2: TransformersBackend) -> None:
    query = qrun.Query(CITY.replace("SAMPLER", 'sampler="exact"'))
    here = query.run(model=vllm_engine).holes["city"].value_probs
    there = query.run(model=smollm2).holes["city"].value_probs
    assert here is not None and there is not None and tv(here, there) < 0.02
    smc = qrun.Query(CITY.replace("SAMPLER", 'sampler="smc" particles=4')).run(
        model=vllm_engine, temperature=1.0, seed=3)
    assert smc["city"] in VALUES and len(smc.holes["city"].particles or []) == 4


def test_on_a_server(vllm_remote: Any, smollm2: TransformersBackend) -> None:
    query = qrun.Query(CITY.replace("SAMPLER", 'sampler="exact"'))
    here = query.run(model=vllm_remote).holes["city"].value_probs
    there = query.run(model=smollm2).holes["city"].value_probs
    assert here is not None and there is not None and tv(here, there) < 0.02
    with pytest.raises(GenerationError, match="samples whole holes") as caught:
        qrun.Query(CITY.replace("SAMPLER", 'sampler="smc"')).run(model=vllm_remote)
    assert caught.value.span.line == 2


BLOCK = ("Animal:{% particles 4 %}{{ gen a regex=\" (cat|dog|bird)\" }} and"
         "{{ select s options=[\" one\", \" two\"] }}{% endparticles %}")


def test_a_particles_block_in_process_and_on_a_server(vllm_engine: Any, vllm_remote: Any
                                                      ) -> None:
    for model in (vllm_engine, vllm_remote):  # a small language is scored whole on both
        result = qrun.Query(BLOCK).run(model=model, temperature=1.0, seed=2)
        (record,) = result.particle_blocks
        assert len(record.values) == 4 and record.values[record.chosen]["a"] == result["a"]
        assert result.text == f"Animal:{result['a']} and{result['s']}"
        assert result.holes["a"].value_probs is not None
    # A server samples whole holes: a large language's hole cannot be drawn by a particle.
    large = BLOCK.replace('regex=\" (cat|dog|bird)\"', 'regex=\" [a-z]+\" max_tokens=3')
    with pytest.raises(GenerationError, match="samples whole holes"):
        qrun.Query(large).run(model=vllm_remote, temperature=1.0, seed=2)
