"""Phi-3: a Llama-family decoder with one fused qkv_proj ([Q | K | V])."""

from __future__ import annotations

from typing import Any

from attnviz.core.layer_map.base import LayerModules

TYPES = ("phi3",)
CAUSAL = True


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.layers[layer]
    own = block.self_attn
    return LayerModules(own, own.qkv_proj, own.o_proj, residual=block.input_layernorm)
