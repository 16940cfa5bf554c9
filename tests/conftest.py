"""Shared fixtures: the tiny random Llama (fast, default tier) and the real SmolLM2 model
(tests marked `real`, run by `make test` and CI).

Two environment variables move the tiny model for a run on another machine (a GPU machine
without SmolLM2's GGUF, tests/backends/test_cuda.py's docstring): QRUN_TEST_TINY, a folder the
tiny model was saved to (`tiny_folder`), is loaded instead of building the model from the
GGUF's tokenizer; QRUN_TEST_DEVICE (cpu unless given) is the device the tiny model runs on."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import torch

import qrun
from qrun.backends.hf_tokenizer import vocabulary_of
from qrun.backends.transformers import TransformersBackend
from qrun.constraint.vocab import Vocabulary

if TYPE_CHECKING:  # llama_cpp is imported only by the llamacpp tier's modules that need it
    from qrun.backends.llamacpp import LlamaCppBackend

# Every process the tests start (qrun's command line, `vllm serve`, vLLM's engine core) runs one
# OpenMP thread, unbound: two threads spin-waiting at each other's barriers while other
# processes hold the cores cost far more than they gain. Measured on the 2-core VM with a busy
# loop on each core, an extract run on a `vllm serve` took 12 s with vLLM's default (a thread
# bound to each core), 20-25 s with two unbound threads, and 5.6-7 s with one (5.3 s with two
# on an idle machine). The test process itself sets torch's threads (one_torch_thread, below).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def pytest_addoption(parser: pytest.Parser) -> None:
    # Registered here, not in tests/lang/conftest.py: pytest only reads command-line options
    # from the conftest files it loads before parsing, which are those of the paths it is given.
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden expectations (tests/lang/golden) from current output")


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for the whole session, the previous count restored at the end.
    The test models' ops are too small for the intra-op pool: on the busy 2-core CI machine
    one thread runs the tiny model ~8x faster and steadier (sampling a 49k-vocab step:
    0.3 ms instead of 5-15 ms per masked_fill/multinomial with the default pool)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _saved_tiny() -> str | None:
    """QRUN_TEST_TINY: a folder holding the tiny model as `tiny_folder` saves it, or None."""
    return os.environ.get("QRUN_TEST_TINY") or None


@pytest.fixture(scope="session")
def tiny() -> TransformersBackend:
    from qrun.backends.tiny import load_tiny

    device = os.environ.get("QRUN_TEST_DEVICE", "cpu")
    saved = _saved_tiny()
    if saved is None:
        return load_tiny(seed=0, device=device)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
    model.to(device).eval()
    return TransformersBackend(model, AutoTokenizer.from_pretrained(saved), "tiny-llama-seed0")


@pytest.fixture(scope="session")
def tiny_cached(tiny: TransformersBackend) -> TransformersBackend:
    """The tiny model with a prefix cache, as load_model gives every model by default."""
    from qrun.backends.prefix_cache import PrefixCache

    return TransformersBackend(tiny.model, tiny.tokenizer, "tiny-cached",
                               prefix_cache=PrefixCache())


@pytest.fixture(params=["uncached", "cached"])
def model(request: pytest.FixtureRequest, tiny: TransformersBackend,
          tiny_cached: TransformersBackend) -> TransformersBackend:
    """The tiny model without and with a prefix cache (shared by every test, as in
    production): suites that use it run on both."""
    return tiny if request.param == "uncached" else tiny_cached


@pytest.fixture(scope="session")
def tiny_folder(tiny: TransformersBackend, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model saved as a Hugging Face folder, for `--model` on the command line."""
    saved = _saved_tiny()
    if saved is not None:
        return saved
    folder = tmp_path_factory.mktemp("tiny-model")
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def smollm2() -> TransformersBackend:
    from qrun.backends import load_model

    backend = load_model("smollm2")
    assert isinstance(backend, TransformersBackend)
    return backend


@pytest.fixture(scope="session")
def smol_tokenizer() -> Any:
    """SmolLM2's tokenizer (no weights), loaded once per session."""
    from transformers import AutoTokenizer

    saved = _saved_tiny()
    if saved is not None:  # the tiny model's tokenizer is SmolLM2's (backends/tiny.py)
        return AutoTokenizer.from_pretrained(saved)

    from qrun.backends.loading import ensure_converted, locate_model

    return AutoTokenizer.from_pretrained(ensure_converted(locate_model("smollm2")))


@pytest.fixture(scope="session")
def smol_vocab(smol_tokenizer: Any) -> Vocabulary:
    return vocabulary_of(smol_tokenizer)


# --- the vllm tier (tests marked `vllm`: their own pytest process, Makefile) ---------------------
# One in-process engine and one `vllm serve` for the whole tier, shared by every module that
# needs them: each start costs 15-40 s of CPU on this machine.

@pytest.fixture(scope="session")
def vllm_engine() -> Iterator[Any]:
    """The default model on vLLM's in-process engine."""
    import qrun

    backend = qrun.load_model("smollm2", backend="vllm")
    yield backend
    backend.close()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def vllm_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `vllm serve` of the default model on 127.0.0.1 (tests/vllm_serving.py)."""
    from tests.vllm_serving import vllm_serve

    with vllm_serve(tmp_path_factory.mktemp("vllm-serve")) as url:
        yield url


@pytest.fixture(scope="module")
def llama() -> Iterator[LlamaCppBackend]:
    """The default model on the llamacpp backend, for a llamacpp-tier module (which calls
    tiers.require_llama_cpp first), closed when the module is done."""
    from qrun.backends.llamacpp import LlamaCppBackend

    backend = qrun.load_model("smollm2", backend="llamacpp")
    assert isinstance(backend, LlamaCppBackend)
    yield backend
    backend.close()
