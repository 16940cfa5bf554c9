"""A tiny randomly initialised Llama with the real SmolLM2 tokenizer, for fast tests: the
same vocabulary, chat template and cache classes as the default model, at a fraction of the
cost. Deterministic for a given seed; never downloads anything."""

from __future__ import annotations

from typing import Any

import torch

from qrun.backends.loading import ensure_converted, locate_model
from qrun.backends.transformers import TransformersBackend


def load_tiny(seed: int = 0, hidden_size: int = 64, layers: int = 2,
              device: str = "cpu") -> TransformersBackend:
    """A tiny Llama (random weights from `seed`, drawn on the CPU so that every device gets
    the same model) behind the transformers adapter, in float32 on `device`."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = ensure_converted(locate_model("smollm2"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        # (untyped in some transformers releases, typed in others)
        model: Any = LlamaForCausalLM(config)  # type: ignore[no-untyped-call,unused-ignore]
        # The default init (std 0.02) gives near-uniform logits; std 0.25 on the output layer
        # gives logits of std ~2 (hidden 64 after RMSNorm), so samples vary with the context
        # but greedy choices are still decisive.
        with torch.no_grad():
            model.get_output_embeddings().weight.normal_(0.0, 0.25)
    finally:
        torch.random.set_rng_state(generator_state)
    model.to(device).eval()
    return TransformersBackend(model, tokenizer, f"tiny-llama-seed{seed}")
