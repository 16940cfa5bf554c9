"""The model cache repairs itself or says what to do (issue #12 item 9): a converted folder
records what it was made from and is checked cheaply on every load; damaged copies and
leftovers of killed conversions are replaced or removed, and a cache that cannot be written
is one line naming the path and the fix. Conversions are faked with a small stand-in
(tests/backends/backend_helpers.py) except in the one real-model test."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from backend_helpers import safetensors_bytes, write_stand_in

from qrun.backends import load_model, loading, model_cache
from qrun.backends.loading import ModelLocation, ensure_converted, locate_model
from qrun.errors import ModelLoadError


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("QRUN_CACHE", str(folder))
    return folder


@pytest.fixture
def gguf(tmp_path: Path) -> ModelLocation:
    (tmp_path / "m.gguf").write_bytes(b"GGUF stand-in")
    return ModelLocation("m", str(tmp_path), "m.gguf")


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The stand-in conversion; each call's output folder is recorded."""
    calls: list[Path] = []

    def convert(_: ModelLocation, out: Path) -> None:
        calls.append(out)
        write_stand_in(out)

    monkeypatch.setattr(loading, "_convert_gguf", convert)
    return calls


def test_a_conversion_records_what_it_was_made_from(
    cache: Path, gguf: ModelLocation, conversions: list[Path]
) -> None:
    folder = ensure_converted(gguf)
    manifest = json.loads((folder / model_cache.MANIFEST).read_text())
    source = Path(gguf.path) / "m.gguf"
    assert manifest["source"] == {"path": str(source.resolve()), "size": source.stat().st_size,
                                  "mtime_ns": source.stat().st_mtime_ns,
                                  "conversion_version": loading.CONVERSION_VERSION}
    assert manifest["files"]["model.safetensors"]["size"] == len(safetensors_bytes())
    assert set(manifest["files"]) == {"config.json", "tokenizer.json", "model.safetensors"}
    assert manifest["adopted"] is False


def truncate(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-3])


def zero(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(bytes(weights.stat().st_size))


def drop(name: str) -> Callable[[Path], None]:
    return lambda folder: (folder / name).unlink()


def unmanifested_without_config(folder: Path) -> None:
    # An older qrun's folder (no manifest) that is not whole: not adoptable.
    (folder / model_cache.MANIFEST).unlink()
    (folder / "config.json").unlink()


@pytest.mark.parametrize("damage", [truncate, zero, drop("config.json"),
                                    drop("tokenizer.json"), unmanifested_without_config],
                         ids=["truncated", "zeroed", "no-config", "no-tokenizer", "old-no-config"])
def test_a_damaged_copy_is_converted_again(
    cache: Path, gguf: ModelLocation, conversions: list[Path], damage: Callable[[Path], None],
    caplog: pytest.LogCaptureFixture
) -> None:
    folder = ensure_converted(gguf)
    damage(folder)
    with caplog.at_level(logging.WARNING, logger="qrun"):
        again = ensure_converted(gguf)
    assert again == folder and len(conversions) == 2
    assert model_cache.manifest_problem(folder, json.loads(
        (folder / model_cache.MANIFEST).read_text())["source"]) is None
    assert str(folder) in caplog.text and "converting it again" in caplog.text
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # nothing left


def test_a_folder_without_a_manifest_is_adopted_when_whole(
    cache: Path, gguf: ModelLocation, conversions: list[Path]
) -> None:
    folder = ensure_converted(gguf)
    (folder / model_cache.MANIFEST).unlink()  # as an older qrun left it
    assert ensure_converted(gguf) == folder
    assert len(conversions) == 1
    assert json.loads((folder / model_cache.MANIFEST).read_text())["adopted"] is True


def flip_middle(folder: Path) -> None:
    # Bytes changed in the middle of the weights, where no header or length tells: the
    # manifest of an older qrun hashed only a file's first and last MiB, so this loaded
    # silently and changed the output.
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4] = bytes(b ^ 0xFF for b in data[middle:middle + 4])
    weights.write_bytes(bytes(data))


def test_bytes_flipped_in_the_middle_of_big_weights_are_found(
    cache: Path, gguf: ModelLocation, conversions: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loading, "_convert_gguf",
                        lambda _, out: (conversions.append(out), write_stand_in(
                            out, values=16 << 20)))  # 64 MiB of weights
    folder = ensure_converted(gguf)
    assert model_cache.safetensors_problem(folder / "model.safetensors") is None
    flip_middle(folder)
    assert model_cache.safetensors_problem(folder / "model.safetensors") is None  # looks whole
    source = json.loads((folder / model_cache.MANIFEST).read_text())["source"]
    assert "model.safetensors is damaged" in str(model_cache.manifest_problem(folder, source))
    assert ensure_converted(gguf) == folder and len(conversions) == 2  # converted again
    assert model_cache.manifest_problem(folder, source) is None


def test_a_manifest_of_the_head_and_tail_checksums_is_replaced(
    cache: Path, gguf: ModelLocation, conversions: list[Path]
) -> None:
    # A folder an older qrun wrote (manifest version 1) is converted again, then checked whole.
    folder = ensure_converted(gguf)
    manifest = json.loads((folder / model_cache.MANIFEST).read_text())
    manifest["manifest_version"] = 1
    (folder / model_cache.MANIFEST).write_text(json.dumps(manifest))
    assert ensure_converted(gguf) == folder and len(conversions) == 2
    assert json.loads((folder / model_cache.MANIFEST).read_text())["manifest_version"] == 2


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_leftovers_of_killed_conversions_are_removed(
    cache: Path, gguf: ModelLocation, conversions: list[Path]
) -> None:
    models = cache / "models"
    models.mkdir(parents=True)
    killed = models / f"x-1.tmp-{dead_pid()}-abc"
    running = models / f"x-1.tmp-{os.getpid()}-def"
    old = models / "x-1.tmp-k3j2l1"  # an older qrun's name, without a process id
    recent = models / "x-1.tmp-q9w8e7"
    for folder in (killed, running, old, recent):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    os.utime(old, (0, 0))
    ensure_converted(gguf)
    left = {p.name for p in models.iterdir()}
    assert killed.name not in left and old.name not in left
    assert {running.name, recent.name} <= left


def refuse_writes(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    def refuse(*args: Any, **kwargs: Any) -> str:
        raise OSError(code, os.strerror(code), kwargs.get("dir"))

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)


def test_a_read_only_cache_says_what_to_do(
    cache: Path, gguf: ModelLocation, conversions: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    (cache / "models").mkdir(parents=True)
    refuse_writes(monkeypatch, errno.EROFS)
    with pytest.raises(ModelLoadError) as caught:
        ensure_converted(gguf)
    message = str(caught.value)
    assert "\n" not in message
    assert f"the model cache {cache / 'models'} is read-only" in message
    assert "set QRUN_CACHE to another folder" in message


def test_a_read_only_cache_with_a_good_copy_still_loads(
    cache: Path, gguf: ModelLocation, conversions: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = ensure_converted(gguf)
    refuse_writes(monkeypatch, errno.EACCES)
    assert ensure_converted(gguf) == folder
    truncate(folder)
    with pytest.raises(ModelLoadError, match=r"model.safetensors is damaged .*, and the model "
                                             r"cache .* is read-only"):
        ensure_converted(gguf)


@pytest.mark.parametrize("failure", ["oserror", "safetensors", "silent"])
def test_a_full_cache_says_what_to_do(
    cache: Path, gguf: ModelLocation, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    from safetensors import SafetensorError

    def convert(_: ModelLocation, out: Path) -> None:
        write_stand_in(out)
        if failure == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device")
        if failure == "safetensors":  # what safetensors raises on a full disk, measured
            raise SafetensorError("Error while serializing: I/O error: No space left on "
                                  "device (os error 28)")
        truncate(out)  # a write that failed without an error

    monkeypatch.setattr(loading, "_convert_gguf", convert)
    with pytest.raises(ModelLoadError) as caught:
        ensure_converted(gguf)
    message = str(caught.value)
    if failure == "silent":
        assert "model.safetensors is damaged" in message and "free space" in message
    else:
        assert message == (f"no space left for the converted model in {cache / 'models'}; free "
                           "some space or set QRUN_CACHE to another folder")
    assert list((cache / "models").iterdir()) == []  # the partial conversion is gone


def test_qrun_cache_pointing_at_a_file(
    tmp_path: Path, gguf: ModelLocation, monkeypatch: pytest.MonkeyPatch,
    conversions: list[Path]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("QRUN_CACHE", str(afile))
    with pytest.raises(ModelLoadError, match=f"QRUN_CACHE={afile} is a file, not a folder"):
        ensure_converted(gguf)
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "models").write_text("")  # a file where the models folder goes
    monkeypatch.setenv("QRUN_CACHE", str(folder))
    with pytest.raises(ModelLoadError, match=f"the model cache {folder / 'models'} is not a "
                                             "folder"):
        ensure_converted(gguf)


def test_a_file_that_is_not_a_gguf_cannot_be_converted(
    cache: Path, gguf: ModelLocation
) -> None:
    with pytest.raises(ModelLoadError, match="cannot convert .*m.gguf: "):
        ensure_converted(gguf)  # the real conversion, on a file that only looks like one


@pytest.mark.parametrize(
    ("damage", "message"),
    [(truncate, r"model.safetensors is damaged \(\d+ bytes where its header describes \d+\)"),
     (zero, r"model.safetensors is damaged \(\d+ bytes, not a safetensors file\)"),
     (drop("tokenizer.json"), "has no tokenizer file"),
     (lambda f: (f / "config.json").write_text("{"), "config.json cannot be read")],
)
def test_a_damaged_model_folder_is_named_before_loading(
    tmp_path: Path, damage: Callable[[Path], None], message: str
) -> None:
    write_stand_in(tmp_path)
    assert locate_model(str(tmp_path)).path == str(tmp_path.resolve())
    damage(tmp_path)
    with pytest.raises(ModelLoadError, match=message) as caught:
        locate_model(str(tmp_path))
    assert "download or copy the model again" in str(caught.value)
    assert "sentencepiece" not in str(caught.value)


def test_unknown_names_list_the_local_models(
    cache: Path, gguf: ModelLocation, conversions: list[Path]
) -> None:
    ensure_converted(gguf)
    with pytest.raises(ModelLoadError) as caught:
        locate_model("smolm2")
    message = str(caught.value)
    assert "unknown model 'smolm2'; did you mean 'smollm2'?" in message
    assert f"local models: smollm2 (the default), {Path(gguf.path) / 'm.gguf'}" in message
    with pytest.raises(ModelLoadError, match="unknown model 'zzz'\nlocal models"):
        locate_model("zzz")


@pytest.mark.real
def test_a_damaged_copy_of_the_real_model_is_converted_again_quietly_and_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    import qrun

    original = ensure_converted(locate_model("smollm2"))  # the user's cache
    monkeypatch.setenv("QRUN_CACHE", str(tmp_path))
    copy = loading.converted_folder(locate_model("smollm2"))
    shutil.copytree(original, copy)  # a real copy: the user's cache is never touched
    with (copy / "model.safetensors").open("r+b") as f:
        f.write(bytes(1 << 16))  # zero the header
    capfd.readouterr()
    import gguf

    reads: list[str] = []

    class CountedReader(gguf.GGUFReader):
        def __init__(self, path: Any, mode: Any = "r") -> None:
            reads.append(str(path))
            super().__init__(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", CountedReader)
    assert ensure_converted(locate_model("smollm2")) == copy  # converts again (~20-50 s)
    # The file is parsed once (loading.py _gguf_read_once: four times before, 50 s -> 23 s).
    assert len(reads) == 1, reads
    # transformers draws a tqdm bar while it reads a GGUF; a conversion shows none (this is
    # the conversion a first run makes too: one test for both, each costs 20-50 s).
    assert capfd.readouterr().err == ""
    backend = load_model("smollm2", dtype="float32")
    assert model_cache.safetensors_problem(copy / "model.safetensors") is None
    result = qrun.Query("The capital of France is{{ gen c max_tokens=3 }}").run(model=backend)
    assert "Paris" in result["c"]
