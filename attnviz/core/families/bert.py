"""BERT-style encoders: BERT, RoBERTa, XLM-RoBERTa, ELECTRA."""

from __future__ import annotations

from typing import Any

from attnviz.core.families.base import separate
from attnviz.core.layer_map.base import LayerModules
from attnviz.core.mha import LayerWeights
from attnviz.errors import UnsupportedModelError


def weights(model: Any, layer: int, mods: LayerModules) -> LayerWeights:
    config = model.config
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise UnsupportedModelError(
            f"{config.model_type} with {config.position_embedding_type} position embeddings adds "
            "position terms to the scores; the from-scratch check supports absolute positions only"
        )
    own = mods.attention
    return separate(config.num_attention_heads, own.query, own.key, own.value, mods.o)
