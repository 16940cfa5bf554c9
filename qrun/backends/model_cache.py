"""The model cache's bookkeeping, below backends/loading.py and backends/requantize.py: a
folder made once from a source (build_once: atomically, with a manifest of what it was made
from and each file's size and BLAKE3 checksum), the checks run on every load, structural
checks of a safetensors file, clearing the leftovers of killed builds, and one-line messages
for a cache that cannot be written. Whole files are hashed:
a weights file with bytes flipped in its middle loaded silently and changed the output when
only its first and last MiB were (BLAKE3 over SmolLM2's 538 MB file: 0.09 s on this 2-core
machine from the page cache, 0.40 s on one thread; SHA-256 took 0.53 s)."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3

from qrun.errors import ModelLoadError

MANIFEST = "qrun-manifest.json"
MANIFEST_VERSION = 2  # 1: SHA-256 of each file's first and last MiB only
# A temporary folder of a conversion whose process is gone is a leftover; one whose name
# carries no process id (older qrun) is a leftover once it is this old.
STALE_AFTER_S = 3600.0
TEMP_NAME = re.compile(r".+\.(?:tmp|discard)-(?:(?P<pid>\d+)-)?[^/]*")
log = logging.getLogger("qrun")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json",
                   "vocab.txt", "sentencepiece.bpe.model")


def source_of(gguf: Path, conversion_version: int) -> dict[str, Any]:
    """What a conversion is made from: the GGUF's path, size and modification time, and the
    version of the conversion code."""
    stat = gguf.stat()
    return {"path": str(gguf.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "conversion_version": conversion_version}


def write_manifest(folder: Path, source: dict[str, Any], adopted: bool = False) -> None:
    """Record `source` and every file of `folder` (size and checksum) in its manifest.
    `adopted`: the folder was made by a qrun that wrote no manifest."""
    files = {p.name: _fingerprint(p) for p in sorted(folder.iterdir())
             if p.is_file() and p.name != MANIFEST}
    manifest = {"manifest_version": MANIFEST_VERSION, "source": source, "files": files,
                "adopted": adopted}
    partial = folder / f".{MANIFEST}.{os.getpid()}"
    partial.write_text(json.dumps(manifest, indent=2))
    os.replace(partial, folder / MANIFEST)


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest, or None when it has none or it cannot be read."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def manifest_problem(folder: Path, source: dict[str, Any], main_file: str = "config.json",
                     adopt: bool = True) -> str | None:
    """None when `folder` is a complete conversion of `source` (its manifest lists
    `main_file`); else what is wrong with it.

    With `adopt`, a HF folder with no manifest (converted by an older qrun) is adopted when
    its files are whole (a manifest is then written, if the cache can be written)."""
    if not folder.is_dir():
        return f"{folder} is not made yet"
    manifest = read_manifest(folder)
    if manifest is None and not adopt:
        return f"{folder} has no manifest"
    if manifest is None:
        problem = folder_problem(folder)
        if problem is None:
            with contextlib.suppress(OSError):
                write_manifest(folder, source, adopted=True)
        return problem
    if manifest.get("manifest_version") != MANIFEST_VERSION or manifest.get("source") != source:
        return f"{folder} was made from another source or by another qrun"
    files = manifest.get("files")
    if not isinstance(files, dict) or main_file not in files:
        return f"{folder / MANIFEST} is incomplete"
    for name, recorded in files.items():
        path = folder / str(name)
        if not path.is_file():
            return f"{path} is missing"
        if _fingerprint(path) != recorded:
            return f"{path} is damaged (its size or checksum changed since it was written)"
    return None


def build_once(target: Path, source: dict[str, Any], build: Callable[[Path], None],
               main_file: str = "config.json", adopt: bool = True, doing: str = "converting"
               ) -> Path:
    """`target`, a cache folder made from `source` by `build` (which fills the folder it is
    given), made now unless it is whole already, and made again when its manifest check
    fails (damaged, or made from another source): the conversion of a GGUF into a HF folder
    (loading.py), a GGUF re-quantized (requantize.py). `doing` names the work in the warning
    that a broken copy is made again.

    `build` writes into a temporary folder beside the target, which is renamed into place
    with its manifest, so an interrupted build never leaves a folder that looks complete;
    leftovers of killed builds are removed before the next one.

    Raises:
        ModelLoadError: the cache cannot be written (read-only, full, not a folder); `build`'s
            own ModelLoadError (a source that cannot be read).
    """
    problem = manifest_problem(target, source, main_file, adopt)
    if problem is None:
        return target
    models = target.parent
    try:
        models.mkdir(parents=True, exist_ok=True)
        remove_leftovers(models)
        if target.exists():
            log.warning("qrun: %s; %s it again", problem, doing)
            _discard(target)
        tmp = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-{os.getpid()}-", dir=models))
    except OSError as exc:
        damaged = f"{problem}, and " if target.exists() else ""
        raise ModelLoadError(f"{damaged}{cache_error(exc, models)}") from exc
    try:
        build(tmp)
        write_manifest(tmp, source)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process finished the same build first; keep theirs.
            if manifest_problem(target, source, main_file, adopt) is not None:
                raise
    except OSError as exc:
        raise ModelLoadError(cache_error(exc, models)) from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _discard(folder: Path) -> None:
    """Move a damaged folder out of the way first (a rename is atomic: no process sees it
    half deleted), then delete it."""
    trash = Path(tempfile.mkdtemp(prefix=f"{folder.name}.discard-{os.getpid()}-",
                                  dir=folder.parent))
    os.replace(folder, trash / folder.name)
    shutil.rmtree(trash, ignore_errors=True)


def folder_problem(folder: Path) -> str | None:
    """None when a HF model folder looks whole: its config.json parses, a tokenizer file is
    there, and every safetensors file has the length its header declares; else the first
    problem found, naming the file."""
    config = folder / "config.json"
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{config} cannot be read ({type(exc).__name__}: {exc})"
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return f"{folder} has no tokenizer file ({', '.join(TOKENIZER_FILES[:2])}, ...)"
    for weights in sorted(folder.glob("*.safetensors")):
        problem = safetensors_problem(weights)
        if problem is not None:
            return problem
    return None


def safetensors_problem(path: Path) -> str | None:
    """None when `path` is a structurally whole safetensors file: an 8-byte little-endian
    header length, a JSON header, then exactly the data its offsets cover (the format,
    huggingface/safetensors README); else what is wrong, naming the file."""
    size = path.stat().st_size
    with path.open("rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if size < 8 or length == 0 or length > size - 8:
            return f"{path} is damaged ({size} bytes, not a safetensors file)"
        try:
            header = json.loads(f.read(length))
        except (ValueError, MemoryError):
            return f"{path} is damaged (its header is not JSON)"
    if not isinstance(header, dict):
        return f"{path} is damaged (its header is not a JSON object)"
    end = 0
    for name, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if name != "__metadata__" and (not isinstance(offsets, list) or len(offsets) != 2):
            return f"{path} is damaged (tensor {name!r} has no data offsets)"
        if offsets is not None:
            end = max(end, int(offsets[1]))
    expected = 8 + length + end
    if expected != size:
        return f"{path} is damaged ({size} bytes where its header describes {expected})"
    return None


def _fingerprint(path: Path) -> dict[str, Any]:
    size = path.stat().st_size
    digest = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if size:
        digest.update_mmap(str(path))  # memory-mapped, hashed on every core
    return {"size": size, "blake3": digest.hexdigest()}


def remove_leftovers(models: Path) -> None:
    """Delete the temporary folders of conversions whose process is gone (killed, or out of
    space). Best effort: a folder that cannot be removed is left alone."""
    with contextlib.suppress(OSError):
        for entry in models.iterdir():
            match = TEMP_NAME.fullmatch(entry.name)
            if match is None or not entry.is_dir():
                continue
            pid = match.group("pid")
            stale = (not _alive(int(pid)) if pid is not None
                     else time.time() - entry.stat().st_mtime > STALE_AFTER_S)
            if stale:
                shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by someone else
        return True
    return True


READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)
FULL = (errno.ENOSPC, errno.EDQUOT)
NOT_A_FOLDER = (errno.ENOTDIR, errno.EEXIST)


def is_full(exc: BaseException) -> bool:
    """A write failed for lack of space: an OSError, or safetensors' own error type, whose
    message carries Rust's "(os error 28)"."""
    if isinstance(exc, OSError):
        return exc.errno in FULL
    return f"(os error {errno.ENOSPC})" in str(exc) or f"(os error {errno.EDQUOT})" in str(exc)


def cache_error(exc: BaseException, models: Path) -> str:
    """One line for a model cache that cannot be written, naming the folder and the fix."""
    fix = "or set QRUN_CACHE to another folder"
    if is_full(exc):
        return f"no space left for the converted model in {models}; free some space {fix}"
    code = exc.errno if isinstance(exc, OSError) else None
    if code in READ_ONLY:
        return f"the model cache {models} is read-only ({exc}); make it writable {fix}"
    if code in NOT_A_FOLDER:
        return f"the model cache {models} is not a folder ({exc}); remove what is there {fix}"
    return f"cannot write the model cache {models} ({exc}); {fix.removeprefix('or ')}"
