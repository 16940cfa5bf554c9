"""Model options (qrun/options.py's ModelOptions): checked once where they are built, with the
messages each surface shows; equal options are one value (hashable: Query's model cache keys
on them); the caller's choice, then the front matter's, then the defaults, merged in one place
(Query.model_options)."""

from __future__ import annotations

import re
from typing import Any

import pytest

import qrun
from qrun.backends import load_model
from qrun.backends.tokenizer_only import TokenizerBackend
from qrun.backends.transformers import TransformersBackend
from qrun.errors import TemplateErrors, UsageError
from qrun.options import DEFAULT_CACHE_MB, DEFAULT_MODEL, ModelOptions, RunOptions

BAD: list[tuple[dict[str, Any], str]] = [
    ({"model": ""}, "model must be a model name or path, got ''"),
    ({"backend": "vllm-x"}, "backend must be one of transformers, vllm, llamacpp, got 'vllm-x'"),
    ({"device": "gpu"}, "device must be cpu, cuda, cuda:N, mps or auto, got 'gpu'"),
    ({"dtype": "int3"}, "dtype must be float32, float16, bfloat16, q8_0 or auto, got 'int3'"),
    ({"cache_mb": -1}, "cache_mb must be ≥ 0, got -1"),
    ({"cache_mb": 1.5}, "cache_mb must be an integer ≥ 0, got 1.5"),
    ({"cache_mb": True}, "cache_mb must be an integer ≥ 0, got True"),
    ({"url": ""}, "url must be a server address (http://HOST:PORT), got ''"),
    ({"backend": "vllm", "url": "http://h:1", "timeout": 0}, "timeout must be > 0 seconds, got 0"),
    ({"backend": "vllm", "url": "http://h:1", "timeout": -1.5},
     "timeout must be > 0 seconds, got -1.5"),
    ({"backend": "vllm", "url": "http://h:1", "timeout": float("nan")},
     "timeout must be a finite number of seconds > 0, got nan"),
    ({"backend": "vllm", "url": "http://h:1", "timeout": float("inf")},
     "timeout must be a finite number of seconds > 0, got inf"),
    ({"backend": "vllm", "url": "http://h:1", "timeout": "5"},
     "timeout must be a finite number of seconds > 0, got '5'"),
    ({"weights": "no"}, "weights must be true or false, got 'no'"),
    # Options that mean something only beside another: refused alone, never ignored.
    ({"timeout": 5}, "timeout is how long a request waits for a vLLM server: it needs url (a "
                     "local run has no time limit; bound it with max_tokens)"),
    ({"url": "http://h:1"}, "url needs backend vllm (a vLLM server)"),
    ({"url": "http://h:1", "backend": "llamacpp"}, "url needs backend vllm (a vLLM server)"),
    ({"backend": "llamacpp", "device": "cuda:1"},
     "device cuda:1 was asked for, but the llamacpp backend runs on the CPU"),
    ({"backend": "llamacpp", "dtype": "float32"},
     "dtype float32 does not apply to the llamacpp backend: it runs the GGUF file's own "
     "quantisation (auto) or a copy re-quantized to q8_0"),
    ({"dtype": "q8_0"}, "dtype q8_0 is a GGUF weight type: it needs backend llamacpp"),
    ({"dtype": "q4_0"}, "dtype must be float32, float16, bfloat16, q8_0 or auto, got 'q4_0'"),
]


@pytest.mark.parametrize(("values", "message"), BAD)
def test_a_bad_option_is_a_usage_error_naming_it(values: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        ModelOptions(**values)
    assert str(caught.value) == message


@pytest.mark.parametrize(("values", "message"), BAD)
def test_load_model_refuses_them_before_looking_for_the_model(values: dict[str, Any],
                                                              message: str) -> None:
    # A name that is no model: the options are checked first, so the error is theirs.
    keywords = {("name_or_path" if k == "model" else k): v for k, v in values.items()}
    with pytest.raises(UsageError) as caught:
        load_model(**{"name_or_path": "no-such-model", **keywords})
    assert str(caught.value) == message


def test_checked_names_the_options_as_the_caller_spells_them() -> None:
    flag = {"cache_mb": "--cache-mb", "url": "--url", "backend": "--backend",
            "timeout": "--timeout", "device": "--device", "dtype": "--dtype"}.__getitem__
    cases: list[tuple[dict[str, Any], str]] = [
        ({"cache_mb": -1}, "--cache-mb must be ≥ 0, got -1"),
        ({"url": "http://h:1", "backend": "transformers"},
         "--url needs --backend vllm (a vLLM server)"),
        ({"timeout": 5.0}, "--timeout is how long a request waits for a vLLM server: it needs "
                           "--url (a local run has no time limit; bound it with max_tokens)"),
        ({"backend": "llamacpp", "device": "cuda"},
         "--device cuda was asked for, but the llamacpp backend runs on the CPU"),
    ]
    for values, message in cases:
        with pytest.raises(UsageError) as caught:
            ModelOptions.checked(values, flag)
        assert str(caught.value) == message
    assert ModelOptions.checked({"cache_mb": 0}, flag) == ModelOptions(cache_mb=0)


def test_equal_options_are_one_value() -> None:
    server = ModelOptions(backend="vllm", url="http://h:1", timeout=5)
    same = ModelOptions(backend="vllm", url="http://h:1", timeout=5.0)
    assert server == same and hash(server) == hash(same)
    assert isinstance(server.timeout, float)  # one type per field: 5 -> 5.0
    assert ModelOptions(device="cpu") != ModelOptions(device="cuda")
    assert len({ModelOptions(), ModelOptions(), ModelOptions(cache_mb=0)}) == 2
    with pytest.raises(AttributeError):
        server.url = "http://other:2"  # type: ignore[misc]
    assert ModelOptions.names() == ("model", "backend", "device", "dtype", "cache_mb", "url",
                                    "timeout", "weights")


def test_over_and_resolved() -> None:
    given = ModelOptions(device="cpu")
    front = ModelOptions(model="org/name", device="cuda", dtype="bfloat16")
    merged = given.over(front)
    assert merged == ModelOptions(model="org/name", device="cpu", dtype="bfloat16")
    assert merged.resolved() == ModelOptions(model="org/name", backend="transformers",
                                             device="cpu", dtype="bfloat16",
                                             cache_mb=DEFAULT_CACHE_MB, weights=True)
    # The defaults are filled in one place: naming the default changes nothing.
    assert ModelOptions().resolved() == ModelOptions(model=DEFAULT_MODEL,
                                                     cache_mb=DEFAULT_CACHE_MB).resolved()
    assert ModelOptions(cache_mb=0, weights=False).resolved().cache_mb == 0
    assert ModelOptions(weights=False).resolved().weights is False
    # A merge that puts together options each fine alone is checked too.
    with pytest.raises(UsageError, match="device cuda was asked for, but the llamacpp"):
        ModelOptions(backend="llamacpp").over(front)


def test_a_query_merges_the_front_matter_in_one_place() -> None:
    query = qrun.Query("---\nmodel: org/name\ndevice: cuda:1\n---\nA: {{ gen a }}")
    assert query.program.model == ModelOptions(model="org/name", device="cuda:1")
    assert query.model_options() == ModelOptions(
        model="org/name", backend="transformers", device="cuda:1", cache_mb=DEFAULT_CACHE_MB,
        weights=True)
    assert query.model_options(ModelOptions(model="other", device="cpu")).model == "other"
    assert query.model_options(ModelOptions(model="other", device="cpu")).device == "cpu"
    # No holes: the tokenizer alone, unless the caller asks for the weights.
    plain = qrun.Query("Hi {{ x }}")
    assert plain.model_options().weights is False
    assert plain.model_options(ModelOptions(weights=True)).weights is True
    assert plain.model_options().model == DEFAULT_MODEL
    with pytest.raises(UsageError, match="device cuda:1 was asked for, but the llamacpp"):
        query.model_options(ModelOptions(backend="llamacpp"))


def test_the_front_matter_checks_model_options_with_the_same_table() -> None:
    with pytest.raises(TemplateErrors) as caught:
        qrun.Query("---\ndevice: gpu\ndtype: int3\nmodel: ''\n---\nHi")
    messages = [e.message for e in caught.value.errors]
    assert messages == [
        "front matter 'device' must be cpu, cuda, cuda:N, mps or auto, got \"gpu\"",
        "front matter 'dtype' must be float32, float16, bfloat16, q8_0 or auto, got \"int3\"",
        "front matter 'model' must be a model name or path, got \"\""]


def test_the_model_cache_is_keyed_on_the_resolved_options(tiny_folder: str) -> None:
    query = qrun.Query("A: {{ gen a max_tokens=2 }}")
    first = query.load(tiny_folder)
    assert isinstance(first, TransformersBackend)
    # Equal once resolved: one model, whichever way the options were given.
    assert query.load(tiny_folder) is first
    assert query.load(options=ModelOptions(model=tiny_folder)) is first
    assert query.load(tiny_folder, cache_mb=DEFAULT_CACHE_MB, backend="transformers") is first
    assert query.load(options=query.model_options(ModelOptions(model=tiny_folder))) is first
    # Another budget is another model.
    other = query.load(tiny_folder, cache_mb=0)
    assert isinstance(other, TransformersBackend) and other is not first
    assert other.prefix_cache is None and first.prefix_cache is not None
    # Keywords override `options`, as Query.run's do over RunOptions.
    assert query.load(tiny_folder, options=ModelOptions(model="not-loaded")) is first
    # A run takes the options whole too, and uses the same cached model.
    result = query.run(model=ModelOptions(model=tiny_folder, cache_mb=0))
    assert result.stats.generated_tokens >= 1 and query.load(tiny_folder, cache_mb=0) is other


def test_load_model_takes_the_options_whole(tiny_folder: str) -> None:
    light = load_model(options=ModelOptions(model=tiny_folder, weights=False))
    assert isinstance(light, TokenizerBackend)
    # Keywords override the options' fields.
    full = load_model(tiny_folder, weights=True, options=ModelOptions(model="x", weights=False))
    assert isinstance(full, TransformersBackend) and full.prefix_cache is not None


@pytest.mark.parametrize(("values", "message"), [
    ({"sampler": "exact", "particles": 8}, "particles applies to sampler 'smc' only, not 'exact'"),
    ({"sampler": "mask", "ess_threshold": 0.3},
     "ess_threshold applies to sampler 'smc' only, not 'mask'"),
])
def test_a_sampler_with_options_of_another_is_refused(values: dict[str, Any],
                                                      message: str) -> None:
    # As on a hole (lang/args.py sampler_conflict): one of the two would be dropped silently.
    with pytest.raises(UsageError, match=re.escape(message)):
        RunOptions(**values)
    assert RunOptions(sampler="smc", particles=8, ess_threshold=0.3).particles == 8
    assert RunOptions(particles=8).resolved().sampler == "smc"


def test_a_sampler_chosen_for_the_run_replaces_the_templates() -> None:
    # The caller's choice wins over the front matter's (Query.run: options over the
    # program's); only the template's values it contradicts are left out.
    smc = RunOptions(sampler="smc", particles=16, ess_threshold=0.3)
    assert RunOptions(sampler="mask").over(smc) == RunOptions(sampler="mask")
    assert RunOptions(sampler="exact").over(smc).particles is None
    assert RunOptions(particles=8).over(RunOptions(sampler="exact")) == RunOptions(particles=8)
    assert RunOptions(particles=8).over(smc) == RunOptions(sampler="smc", particles=8,
                                                           ess_threshold=0.3)
    query = qrun.Query('---\nparticles: 16\n---\nA{{ gen x regex=" (a|b)" }}')
    assert query.program.options.particles == 16
    assert query.request({}, options=RunOptions(sampler="mask")).options.sampler == "mask"
