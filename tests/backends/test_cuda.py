"""The transformers backend on a CUDA device (`--device cuda`): the same runs as on the CPU.
Skipped where torch sees no CUDA device (CI has none); on a GPU machine without SmolLM2's GGUF,
run it from a folder the tiny model was saved to (tests/conftest.py):

    QRUN_TEST_TINY=FOLDER python -m pytest tests/backends/test_cuda.py

and the whole default tier on the GPU with QRUN_TEST_DEVICE=cuda beside it.

On CUDA in float32 a greedy run gives the CPU's text: the tiny model's logits are decisive
(backends/tiny.py), so kernel-order rounding (1e-6) does not change an argmax. In bfloat16
(CUDA's default dtype, backends/transformers.py default_dtype) the text may differ; what must
hold is that every constraint holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch

import qrun
from qrun.backends import load_model
from qrun.backends.transformers import TransformersBackend

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"], "additionalProperties": False}

TEMPLATE = """{% set schema = SCHEMA %}A person: {{ gen person json=schema max_tokens=40 }}
Age: {{ gen age regex=INT max_tokens=4 }}
Colour: {{ select colour options=["red", "green", "blue", "dark red"] }}
{% hidden %}Scratch: {{ gen scratch max_tokens=5 }}{% endhidden %}
{% fork x in ["a", "b"] %}Branch {{ x }}: {{ gen branch max_tokens=4 stop="\\n" }}{% endfork %}
Note: {{ gen note max_tokens=8 stop="\\n" }}""".replace("SCHEMA", json.dumps(SCHEMA))


def folder_model(folder: str, device: str, dtype: str) -> TransformersBackend:
    backend = load_model(folder, device=device, dtype=dtype)
    assert isinstance(backend, TransformersBackend)
    return backend


@pytest.fixture(scope="module")
def on_cpu(tiny_folder: str) -> TransformersBackend:
    return folder_model(tiny_folder, "cpu", "float32")


@pytest.fixture(scope="module")
def on_cuda(tiny_folder: str) -> TransformersBackend:
    return folder_model(tiny_folder, "cuda", "float32")


def check_constraints(vars: dict[str, Any]) -> None:
    jsonschema.validate(vars["person"], SCHEMA)
    assert isinstance(vars["age"], int)
    assert vars["colour"] in ["red", "green", "blue", "dark red"]
    assert len(vars["branch"]) == 2


def test_the_model_is_on_the_gpu_and_gives_the_cpu_logits(on_cpu: TransformersBackend,
                                                           on_cuda: TransformersBackend) -> None:
    assert on_cuda.device.startswith("cuda")
    assert all(p.device.type == "cuda" for p in on_cuda.model.parameters())
    there, here = on_cuda.new_cache(), on_cpu.new_cache()
    logits = on_cuda.forward([1, 2, 3], there, logits_for=3)
    assert isinstance(logits, np.ndarray) and logits.dtype == np.float32  # on the host, base.py
    np.testing.assert_allclose(logits, on_cpu.forward([1, 2, 3], here, logits_for=3), atol=1e-4)
    assert there.length() == 3


def test_a_greedy_run_on_cuda_gives_the_cpu_text(on_cpu: TransformersBackend,
                                                 on_cuda: TransformersBackend) -> None:
    query = qrun.Query(TEMPLATE)
    there = query.run(model=on_cuda, temperature=0)
    here = query.run(model=on_cpu, temperature=0)
    check_constraints(there.vars)
    assert there.text == here.text
    assert there.vars == here.vars


def test_sampled_runs_keep_every_constraint_in_bfloat16(tiny_folder: str) -> None:
    backend = load_model(tiny_folder, device="cuda")  # CUDA's default dtype: bfloat16
    assert next(backend.model.parameters()).dtype == torch.bfloat16  # type: ignore[attr-defined]
    query = qrun.Query(TEMPLATE)
    for seed in range(4):
        check_constraints(query.run(model=backend, temperature=1.0, seed=seed).vars)


def test_batched_runs_on_cuda_match_runs_one_at_a_time(on_cuda: TransformersBackend) -> None:
    query = qrun.Query("Q: {{ topic }}? A: {{ gen a max_tokens=6 }} N: {{ gen n regex=INT }}")
    inputs = [{"topic": t} for t in ["cats", "the sea", "a long winding road", "tea"]]
    alone = query.run_many(inputs, model=on_cuda, temperature=0)
    together = query.run_many(inputs, model=on_cuda, temperature=0, batch_size=4)
    assert [r.text for r in together] == [r.text for r in alone]  # type: ignore[union-attr]


def test_the_cli_runs_with_device_cuda(tiny_folder: str, tmp_path: Path) -> None:
    template = tmp_path / "t.tmpl"
    template.write_text(TEMPLATE)
    proc = subprocess.run([sys.executable, "-m", "qrun.cli", str(template), "--model",
                           tiny_folder, "--device", "cuda", "--json", "--seed", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    check_constraints(json.loads(proc.stdout)["vars"])
