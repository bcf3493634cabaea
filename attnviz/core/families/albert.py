"""ALBERT: one set of attention weights shared by groups of layers."""

from __future__ import annotations

from typing import Any

from attnviz.core.families.base import separate
from attnviz.core.layer_map.base import LayerModules
from attnviz.core.mha import LayerWeights
from attnviz.errors import UnsupportedModelError


def weights(model: Any, layer: int, mods: LayerModules) -> LayerWeights:
    config = model.config
    if config.inner_group_num != 1:
        raise UnsupportedModelError("ALBERT with inner_group_num > 1 is not supported by check")
    own = mods.attention
    return separate(config.num_attention_heads, own.query, own.key, own.value, mods.o)
