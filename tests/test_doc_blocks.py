"""The Python blocks of README.md, docs/language.md, docs/serve.md and docs/trace.md run as
written (docs/cookbook.md's have tests/test_cookbook.py), on the default model (the `real`
tier), each in a namespace of its own in a folder holding a copy of examples/; a block's closing
`# ...` lines are what it prints. A block loads the model as written, over the session's
weights (weights_shared_with)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qrun.backends import transformers as hf_backend
from qrun.backends.loading import ensure_converted, locate_model
from qrun.backends.prefix_cache import PrefixCache
from qrun.backends.transformers import TransformersBackend

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/language.md", "docs/serve.md", "docs/trace.md")
BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```", re.M | re.S)
# README's second block lists the API on every backend (vLLM and llama.cpp load there, each a
# tier of its own: tests/test_vllm.py, tests/backends/test_llamacpp.py run the same calls).
OVERVIEW = "vmodel = qrun.load_model"


def python_blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            if OVERVIEW not in m.group("code"):
                found.append((f"{page}:{text.count(chr(10), 0, m.start()) + 1}",
                              m.group("code")))
    return found


def promised(code: str) -> list[re.Pattern[str]]:
    """What a block says it prints: its closing `# ...` lines, each a pattern where `…` and
    `...` stand for any text, less a note after two spaces in brackets."""
    lines = code.rstrip("\n").split("\n")
    shown: list[str] = []
    while lines and lines[-1].startswith("# "):
        shown.insert(0, re.sub(r"\s{2,}\(.*\)$", "", lines.pop()[2:]))
    return [re.compile(".*".join(re.escape(part) for part in re.split(r"…|\.\.\.", line)))
            for line in shown]


@contextlib.contextmanager
def weights_shared_with(loaded: TransformersBackend) -> Iterator[None]:
    """Within the block, a load of `loaded`'s model (load_model's call of load_transformers
    with its folder, device and dtype) gives a new backend, with a prefix cache of its own as
    a fresh load has, over `loaded`'s weights and tokenizer instead of reading them again
    (2-8 s a load: 7 blocks here and 5 in docs/cookbook.md load it); everything else
    load_model does still runs. Other loads go through as they are."""
    real = hf_backend.load_transformers
    folder = str(ensure_converted(locate_model("smollm2")))
    weights = next(loaded.model.parameters())

    def load(name: str, path: str, device: str | None, dtype: str | None,
             cache_mb: int = 0) -> Any:
        device = device or "cpu"
        if (path, device, hf_backend.resolve_dtype(dtype, device)) != (
                folder, str(weights.device), weights.dtype):
            return real(name, path, device, dtype, cache_mb)
        return TransformersBackend(loaded.model, loaded.tokenizer, name, loaded.load_s,
                                   PrefixCache(cache_mb << 20) if cache_mb > 0 else None)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hf_backend, "load_transformers", load)
        yield


def test_the_pages_have_their_blocks() -> None:
    assert len(python_blocks()) >= 6


@pytest.mark.real
@pytest.mark.parametrize("where,code", python_blocks(), ids=[w for w, _ in python_blocks()])
def test_a_python_block_runs_as_written(where: str, code: str, tmp_path: Path,
                                        smollm2: TransformersBackend) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    here = Path.cwd()
    out = io.StringIO()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(out), weights_shared_with(smollm2):
            exec(compile(code, where, "exec"), {"__name__": "__main__"})
    finally:
        os.chdir(here)
    patterns = promised(code)
    if patterns:
        got = out.getvalue().rstrip("\n").split("\n")
        assert len(got) == len(patterns) and all(
            p.fullmatch(line) for p, line in zip(patterns, got, strict=True)), \
            f"{where} shows {[p.pattern for p in patterns]}, prints:\n{out.getvalue()}"
