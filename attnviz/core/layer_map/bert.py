"""BERT-style encoders: BERT, RoBERTa, XLM-RoBERTa, ELECTRA (post-LN)."""

from __future__ import annotations

from typing import Any

from attnviz.core.layer_map.base import LayerModules

TYPES = ("bert", "roberta", "xlm-roberta", "electra")
CAUSAL = False


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.encoder.layer[layer].attention
    return LayerModules(
        block.self, block.self.query, block.output.dense, norm=block.output.LayerNorm
    )
