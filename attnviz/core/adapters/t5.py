"""T5 (and v1.1, Flan-T5, mT5): an encoder and a decoder stack of pre-LN blocks (RMSNorm), a
relative position bias computed in each stack's first layer and shared by the others, and
unscaled scores. Three attention stacks: encoder self, decoder self (causal), and
cross-attention (decoder queries over the encoder's last hidden states)."""

from __future__ import annotations

from typing import Any

from attnviz.core.adapters.base import LayerModules, separate
from attnviz.core.mha import LayerWeights

TYPES = ("t5", "mt5")
CAUSAL = False
STACKS = ("encoder", "decoder", "cross")


def _sublayer(model: Any, layer: int, stack: str) -> Any:
    """The T5LayerSelfAttention or T5LayerCrossAttention of `layer` in `stack`."""
    blocks = (model.encoder if stack == "encoder" else model.decoder).block
    return blocks[layer].layer[1 if stack == "cross" else 0]


def modules(model: Any, layer: int, stack: str) -> LayerModules:
    sub = _sublayer(model, layer, stack)
    own = sub.EncDecAttention if stack == "cross" else sub.SelfAttention
    # T5Attention returns (output, position_bias, probabilities).
    return LayerModules(own, own.q, own.o, residual=sub.layer_norm, probs_at=2, source=own.v)


def weights(model: Any, layer: int, stack: str) -> LayerWeights:
    own = modules(model, layer, stack).attention
    return separate(own.n_heads, own.q, own.k, own.v, own.o)
