"""ViT and DeiT: separate q, k, v and o projections over the picture's tokens (CLS, DeiT's
distillation token, then the patches); their positions are added to the patch embeddings, so
the scores have no position term."""

from __future__ import annotations

from typing import Any

from attnviz.core.families.base import separate
from attnviz.core.layer_map.base import LayerModules
from attnviz.core.mha import LayerWeights


def weights(model: Any, layer: int, mods: LayerModules) -> LayerWeights:
    own = mods.attention
    return separate(own.num_attention_heads, own.q_proj, own.k_proj, own.v_proj, own.o_proj)
