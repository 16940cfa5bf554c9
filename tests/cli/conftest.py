"""Fixtures of the command-line suites: the tiny model saved as a Hugging Face folder (what
`--model` takes)."""

from __future__ import annotations

import pytest

from qrun.backends.transformers import TransformersBackend


@pytest.fixture(scope="session")
def tiny_folder(tiny: TransformersBackend, tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("tiny-model")
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    return str(folder)

