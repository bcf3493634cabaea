"""ModernBERT: one fused Wqkv ([Q | K | V]) and RoPE in every layer. Its global layers
(full_attention) see every key; its local layers (sliding_attention, two of every three) only
the keys within local_attention / 2 positions of the query, before or after it, and turn Q_h
and K_h with a RoPE base of their own (local_rope_theta)."""

from __future__ import annotations

from typing import Any

from attnviz.core.families.base import linear, rope
from attnviz.core.layer_map.base import LayerModules
from attnviz.core.mha import LayerWeights


def weights(model: Any, layer: int, mods: LayerModules) -> LayerWeights:
    """The layer's kind (config.layer_types) picks its RoPE and, for a local layer, its band:
    config.sliding_window, which transformers' mask reads as |j − i| ≤ sliding_window."""
    config = model.config
    own = mods.attention
    weight, bias = linear(own.Wqkv)  # (d_model, 3·H·d_k): [Q | K | V]
    width = config.num_attention_heads * own.head_dim
    (w_q, w_k, w_v), (b_q, b_k, b_v) = weight.split(width, dim=1), bias.split(width)
    w_o, b_o = linear(own.Wo)
    kind = config.layer_types[layer]
    return LayerWeights(
        w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, config.num_attention_heads,
        rope=rope(config, own.head_dim, kind),
        band=config.sliding_window if kind == "sliding_attention" else None,
    )  # fmt: skip
