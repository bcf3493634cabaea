"""ViT and DeiT: vision encoders of pre-LN blocks (layernorm_before) with separate q, k, v and
o projections over the picture's tokens (CLS, DeiT's distillation token, then the patches);
their positions are added to the patch embeddings, so the scores have no position term."""

from __future__ import annotations

from typing import Any

from attnviz.core.adapters.base import LayerModules, separate
from attnviz.core.mha import LayerWeights

TYPES = ("vit", "deit")
CAUSAL = False


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.layers[layer]
    own = block.attention
    return LayerModules(own, own.q_proj, own.o_proj, residual=block.layernorm_before)


def weights(model: Any, layer: int) -> LayerWeights:
    own = modules(model, layer).attention
    return separate(own.num_attention_heads, own.q_proj, own.k_proj, own.v_proj, own.o_proj)
