"""Helpers of the backend suites (imported by name: tests/ folders are not packages)."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def safetensors_bytes(values: int = 4) -> bytes:
    """A whole safetensors file holding one float32 tensor of `values` zeros (the format:
    an 8-byte little-endian header length, the JSON header, then the data)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [values],
                               "data_offsets": [0, 4 * values]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(4 * values)


def write_stand_in(out: Path, values: int = 4) -> None:
    """What a conversion writes, in small: config, tokenizer, weights. A stand-in for the
    ~20 s conversion of a real GGUF in tests about the cache around it."""
    (out / "config.json").write_text('{"model_type": "llama"}')
    (out / "tokenizer.json").write_text("{}")
    (out / "model.safetensors").write_bytes(safetensors_bytes(values))
