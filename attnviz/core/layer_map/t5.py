"""T5 (and v1.1, Flan-T5, mT5): an encoder and a decoder stack of pre-LN blocks (RMSNorm). Three
attention stacks: encoder self, decoder self (causal), and cross-attention (decoder queries
over the encoder's last hidden states)."""

from __future__ import annotations

from typing import Any

from attnviz.core.layer_map.base import LayerModules

TYPES = ("t5", "mt5")
CAUSAL = False
STACKS = ("encoder", "decoder", "cross")


def modules(model: Any, layer: int, stack: str) -> LayerModules:
    blocks = (model.encoder if stack == "encoder" else model.decoder).block
    sub = blocks[layer].layer[1 if stack == "cross" else 0]  # T5Layer(Self|Cross)Attention
    own = sub.EncDecAttention if stack == "cross" else sub.SelfAttention
    # T5Attention returns (output, position_bias, probabilities).
    return LayerModules(own, own.q, own.o, residual=sub.layer_norm, probs_at=2, kv_input=own.v)
