"""Llama-family decoders: Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2. Input X is read after
input_layernorm (they normalise first); Gemma2 also normalises the attention's output before
adding it to the stream."""

from __future__ import annotations

from typing import Any

from attnviz.core.layer_map.base import LayerModules

TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2")
CAUSAL = True


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.layers[layer]
    own = block.self_attn
    # Gemma2 normalises the attention's output before adding it to the stream (its
    # `post_attention_layernorm`; Llama's of that name is the feed-forward's input norm).
    sandwich = hasattr(block, "pre_feedforward_layernorm")
    return LayerModules(
        own,
        own.q_proj,
        own.o_proj,
        residual=block.input_layernorm,
        norm=block.post_attention_layernorm if sandwich else None,
        norm_covers_residual=False,
    )
