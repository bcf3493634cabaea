"""Phi-3: a Llama-family decoder with one fused qkv_proj ([Q | K | V]) and partial RoPE."""

from __future__ import annotations

from typing import Any

from attnviz.core.families.base import linear
from attnviz.core.families.llama import decoder_weights
from attnviz.core.layer_map.base import LayerModules
from attnviz.core.mha import LayerWeights


def weights(model: Any, layer: int, mods: LayerModules) -> LayerWeights:
    config = model.config
    attn = mods.attention
    weight, bias = linear(attn.qkv_proj)  # (d_model, (H + 2·H_kv)·d_k): [Q | K | V]
    d_q = config.num_attention_heads * attn.head_dim
    d_kv = config.num_key_value_heads * attn.head_dim
    w_q, w_k, w_v = weight.split([d_q, d_kv, d_kv], dim=1)
    b_q, b_k, b_v = bias.split([d_q, d_kv, d_kv])
    return decoder_weights(model, attn, w_q, b_q, w_k, b_k, w_v, b_v)
