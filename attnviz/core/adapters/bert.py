"""BERT-style encoders: BERT, RoBERTa, XLM-RoBERTa, ELECTRA."""

from __future__ import annotations

from typing import Any

from attnviz.core.adapters.base import LayerModules, separate
from attnviz.core.mha import LayerWeights
from attnviz.errors import UnsupportedModelError

TYPES = ("bert", "roberta", "xlm-roberta", "electra")
CAUSAL = False


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.encoder.layer[layer].attention
    return LayerModules(
        block.self, block.self.query, block.output.dense, norm=block.output.LayerNorm
    )


def weights(model: Any, layer: int) -> LayerWeights:
    config = model.config
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise UnsupportedModelError(
            f"{config.model_type} with {config.position_embedding_type} position embeddings adds "
            "position terms to the scores; the from-scratch check supports absolute positions only"
        )
    mods = modules(model, layer)
    own = mods.attention
    return separate(config.num_attention_heads, own.query, own.key, own.value, mods.o)
