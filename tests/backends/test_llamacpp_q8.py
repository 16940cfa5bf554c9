"""`--backend llamacpp --dtype q8_0` (tests marked `llamacpp`): the shipped GGUF re-quantized
once into the model cache (qrun/backends/requantize.py), checked on every load as the HF
conversions are, and run with every constraint holding; its next-token distributions stay
near the shipped weights' (they are not the same file)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_examples import CONSTRAINED, check_constrained
from tiers import require_llama_cpp

import qrun
from qrun.errors import UsageError
from qrun.runtime.sampler import log_softmax

pytestmark = pytest.mark.llamacpp

require_llama_cpp()

from qrun.backends.llamacpp import LlamaCppBackend  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent
TEXT = ("The river town of Emberwick was founded by fishermen in 1412. Its bridge is made of "
        "red stone, and its market opens at dawn. Today the town is known for its festival of "
        "lanterns, held every autumn, when the boats on the river carry lights to the sea.")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("qrun-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QRUN_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="module")
def q8(cache: Path) -> Iterator[LlamaCppBackend]:
    backend = qrun.load_model("smollm2", backend="llamacpp", dtype="q8_0")
    assert isinstance(backend, LlamaCppBackend)
    yield backend
    backend.close()


def copies(cache: Path) -> list[Path]:
    return sorted((cache / "models").glob("*-q8_0-*/model.gguf"))


def test_the_copy_is_made_once_and_loaded_as_q8_0(q8: LlamaCppBackend, cache: Path) -> None:
    assert q8.dtype == "Q8_0"
    made = copies(cache)
    assert len(made) == 1 and (made[0].parent / "qrun-manifest.json").is_file()
    written = made[0].stat().st_mtime_ns
    again = qrun.load_model("smollm2", backend="llamacpp", dtype="q8_0", cache_mb=0)
    again.close()
    assert copies(cache) == made and made[0].stat().st_mtime_ns == written


def test_a_damaged_copy_is_made_again(q8: LlamaCppBackend, cache: Path,
                                      caplog: pytest.LogCaptureFixture) -> None:
    (path,) = copies(cache)
    with path.open("r+b") as f:  # bytes flipped in the middle: only a whole-file hash sees it
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with caplog.at_level(logging.WARNING, logger="qrun"):
        backend = qrun.load_model("smollm2", backend="llamacpp", dtype="q8_0", cache_mb=0)
    backend.close()
    assert "is damaged" in caplog.text and "re-quantizing it again" in caplog.text
    (remade,) = copies(cache)
    with remade.open("rb") as f:
        f.seek(remade.stat().st_size // 2)
        assert f.read(1) == byte


def test_next_token_distributions_stay_near_the_shipped_weights(q8: LlamaCppBackend) -> None:
    shipped = qrun.load_model("smollm2", backend="llamacpp", cache_mb=0)
    assert isinstance(shipped, LlamaCppBackend)
    ids = [shipped.start_token_id, *shipped.encode(TEXT)]
    assert q8.encode(TEXT) == ids[1:]
    p = log_softmax(shipped.forward(ids, shipped.new_cache(), len(ids)))
    q = log_softmax(q8.forward(ids, q8.new_cache(), len(ids)))
    shipped.close()
    kl = (np.exp(p) * (p - q)).sum(-1)
    # bench/quant_fidelity.py measured 0.004 nats on average over 2,048 tokens of
    # docs/language.md; a context with a sentence left out is off by nats.
    assert 0 < float(kl.mean()) < 0.02, kl.mean()


def test_every_constraint_holds_on_q8_0(q8: LlamaCppBackend) -> None:
    r = qrun.Query(CONSTRAINED).run(model=q8)
    check_constrained(r)


def test_the_tokenizer_alone_makes_no_copy(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QRUN_CACHE", str(tmp_path))
    backend = qrun.load_model("smollm2", backend="llamacpp", dtype="q8_0", weights=False)
    assert backend.encode("Hello") and not copies(tmp_path)


@pytest.mark.parametrize(("backend", "dtype", "message"), [
    ("transformers", "q8_0", "dtype q8_0 is a GGUF weight type: it needs backend llamacpp"),
    ("llamacpp", "bfloat16", "dtype bfloat16 does not apply to the llamacpp backend"),
])
def test_a_dtype_of_the_other_kind_is_refused(backend: str, dtype: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        qrun.load_model("smollm2", backend=backend, dtype=dtype)


def test_the_command_line_takes_dtype_q8_0(cache: Path, tmp_path: Path) -> None:
    template = tmp_path / "hi.tmpl"
    template.write_text('Count: {{ gen n regex="[0-9]{1,3}" }}')
    done = subprocess.run(
        [sys.executable, "-m", "qrun.cli", str(template), "--backend", "llamacpp", "--dtype",
         "q8_0", "--json"], capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "QRUN_CACHE": str(cache)})
    assert done.returncode == 0, done.stderr
    assert '"n"' in done.stdout and done.stderr.strip() == ""
