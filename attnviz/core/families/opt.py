"""OPT: a decoder with separate q, k, v and out projections; its learned positions are added
to the embeddings, so the scores have no position term."""

from __future__ import annotations

from typing import Any

from attnviz.core.families.base import separate
from attnviz.core.layer_map.base import LayerModules
from attnviz.core.mha import LayerWeights


def weights(model: Any, layer: int, mods: LayerModules) -> LayerWeights:
    """The textbook's layer: OPT scales Q_h by 1/√d_k before Q_h K_hᵀ, which is the same
    score."""
    own = mods.attention
    return separate(own.num_heads, own.q_proj, own.k_proj, own.v_proj, own.out_proj)
