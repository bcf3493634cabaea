"""DistilBERT."""

from __future__ import annotations

from typing import Any

from attnviz.core.families.base import separate
from attnviz.core.layer_map.base import LayerModules
from attnviz.core.mha import LayerWeights


def weights(model: Any, layer: int, mods: LayerModules) -> LayerWeights:
    own = mods.attention
    return separate(model.config.n_heads, own.q_lin, own.k_lin, own.v_lin, mods.o)
