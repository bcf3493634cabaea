"""DINOv2 (with or without registers): a ViT whose pre-LN blocks (norm1) scale the attention's
output by a learned layer scale before adding it to the stream. The block's output here is
W_O's (o_proj), before that scale, as the other families' is before residual and norm."""

from __future__ import annotations

from typing import Any

from attnviz.core.layer_map.base import LayerModules

TYPES = ("dinov2", "dinov2_with_registers")
CAUSAL = False


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.encoder.layer[layer]
    own = block.attention
    return LayerModules(own, own.q_proj, own.o_proj, residual=block.norm1)
