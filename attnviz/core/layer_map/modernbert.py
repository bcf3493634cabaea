"""ModernBERT: an encoder of pre-LN blocks (its first layer's norm an identity) with one fused
Wqkv."""

from __future__ import annotations

from typing import Any

from attnviz.core.layer_map.base import LayerModules

TYPES = ("modernbert",)
CAUSAL = False


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.layers[layer]
    own = block.attn
    return LayerModules(own, own.Wqkv, own.Wo, residual=block.attn_norm)
