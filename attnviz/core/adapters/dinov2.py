"""DINOv2 (with or without registers): a ViT whose pre-LN blocks (norm1) scale the attention's
output by a learned layer scale before adding it to the stream. The block's output here is
W_O's (o_proj), before that scale, as the other families' is before residual and norm."""

from __future__ import annotations

from typing import Any

from attnviz.core.adapters.base import LayerModules, separate
from attnviz.core.mha import LayerWeights

TYPES = ("dinov2", "dinov2_with_registers")
CAUSAL = False


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.encoder.layer[layer]
    own = block.attention
    return LayerModules(own, own.q_proj, own.o_proj, residual=block.norm1)


def weights(model: Any, layer: int) -> LayerWeights:
    own = modules(model, layer).attention
    return separate(own.num_attention_heads, own.q_proj, own.k_proj, own.v_proj, own.o_proj)
