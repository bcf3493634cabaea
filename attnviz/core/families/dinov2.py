"""DINOv2 (with or without registers): separate q, k, v and o projections, as ViT's; the
learned layer scale after W_O is outside the block's output (`layer_map.dinov2`)."""

from __future__ import annotations

from typing import Any

from attnviz.core.families.base import separate
from attnviz.core.layer_map.base import LayerModules
from attnviz.core.mha import LayerWeights


def weights(model: Any, layer: int, mods: LayerModules) -> LayerWeights:
    own = mods.attention
    return separate(own.num_attention_heads, own.q_proj, own.k_proj, own.v_proj, own.o_proj)
