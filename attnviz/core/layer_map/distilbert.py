"""DistilBERT (post-LN)."""

from __future__ import annotations

from typing import Any

from attnviz.core.layer_map.base import LayerModules

TYPES = ("distilbert",)
CAUSAL = False


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.transformer.layer[layer]
    own = block.attention
    return LayerModules(own, own.q_lin, own.out_lin, norm=block.sa_layer_norm)
