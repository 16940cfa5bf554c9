"""Linear layers with oneDNN-prepacked weights, for float32 inference on a CPU.

Why: torch's CPU `linear` packs its weight for the GEMM kernel on every call when more than
one position goes through it, so a forward over 2-9 new tokens (a speculation draft being
verified, runtime/speculate.py) costs about twice a forward over one, and prefill pays the
packing too. Packing each weight once at load time, as torch.compile's CPU freezing pass
does, brings a 9-token forward down to ~1.4x a 1-token one (from ~1.9x). Measured on this project's
2-core CPU with SmolLM2 (float32, 400-token context, medians): a forward over 1 / 5 / 9 new
tokens 120 / 211 / 222 ms plain, 116 / 157 / 160 ms packed; a 400-token prefill 1.31 s plain,
0.90 s packed; the largest logit difference 7e-5 with the same argmax at every position
(bench/RESULTS.md has the suite-level figures).

The packed layers replace the model's `nn.Linear` modules in place and the original weights
are freed, so this costs no memory, except for an output layer tied to the input embedding,
whose weight the embedding still holds (SmolLM2: 113 MB more, on ~540 MB).
`QRUN_PACKED_LINEAR=0` keeps torch's own layers (to compare, or to rule this out)."""

from __future__ import annotations

import os
from typing import Any

import torch

BATCH_HINT = 8
"""Rows the packed layout is tuned for: a speculation draft plus one (runtime/speculate.py
MAX_DRAFT). Measured: hint 8 costs the same as hint 1 for one row and half as much for 5."""


class PackedLinear(torch.nn.Module):
    """`nn.Linear`'s forward on a weight packed once for oneDNN's GEMM (the bias as it was)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), BATCH_HINT)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, self.packed, self.bias, "none", [], "")
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def can_pack(model: Any) -> bool:
    """Whether packing applies: a float32 model on the CPU, a torch built with oneDNN, and not
    switched off by QRUN_PACKED_LINEAR=0."""
    if os.environ.get("QRUN_PACKED_LINEAR", "1").strip() == "0":
        return False
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return False
    parameter = next(model.parameters(), None)
    return (parameter is not None and parameter.device.type == "cpu"
            and parameter.dtype == torch.float32)


def pack_linear_layers(model: torch.nn.Module) -> int:
    """Replace every `nn.Linear` of `model` with a PackedLinear (see can_pack); returns how
    many were replaced. Must run after the model is on its device and in eval mode: the
    packed layers are for inference only (no gradients flow through them)."""
    replaced = 0
    for name, module in list(model.named_modules()):
        if type(module) is not torch.nn.Linear:
            continue
        parent_name, _, attribute = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attribute, PackedLinear(module))
        replaced += 1
    return replaced
