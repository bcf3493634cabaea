"""BART, mBART and Marian (opus-mt): scaled scores and learned (BART, mBART) or sinusoidal
(Marian) positions added to the embeddings, in each of the three stacks (encoder self,
decoder self, cross-attention)."""

from __future__ import annotations

from typing import Any

from attnviz.core.families.base import separate
from attnviz.core.layer_map.base import LayerModules
from attnviz.core.mha import LayerWeights


def weights(model: Any, layer: int, mods: LayerModules, stack: str) -> LayerWeights:
    """The textbook's layer: scores scaled by 1/√d_k and no position term, since the
    positions are added to the embeddings; cross-attention's K and V read the source."""
    own = mods.attention
    return separate(own.num_heads, own.q_proj, own.k_proj, own.v_proj, own.out_proj)
