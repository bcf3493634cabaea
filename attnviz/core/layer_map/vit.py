"""ViT and DeiT: vision encoders of pre-LN blocks (layernorm_before) over the picture's tokens
(CLS, DeiT's distillation token, then the patches)."""

from __future__ import annotations

from typing import Any

from attnviz.core.layer_map.base import LayerModules

TYPES = ("vit", "deit")
CAUSAL = False


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.layers[layer]
    own = block.attention
    return LayerModules(own, own.q_proj, own.o_proj, residual=block.layernorm_before)
