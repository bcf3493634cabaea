"""T5 (and v1.1, Flan-T5, mT5): an encoder and a decoder stack of pre-LN blocks (RMSNorm), a
relative position bias computed in each stack's first layer and shared by the others, and
unscaled scores. Three attention stacks: encoder self, decoder self (causal), and
cross-attention (decoder queries over the encoder's last hidden states)."""

from __future__ import annotations

from typing import Any

from attnviz.core.adapters.base import LayerModules, separate
from attnviz.core.mha import LayerWeights, RelativeBias

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
    return LayerModules(own, own.q, own.o, residual=sub.layer_norm, probs_at=2, kv_input=own.v)


def weights(model: Any, layer: int, stack: str) -> LayerWeights:
    """Unscaled scores (T5 folds 1/√d_k into its initialisation); in self-attention, the
    relative position bias of the stack's first layer, which every layer of the stack
    shares (bidirectional in the encoder, causal in the decoder); none in cross-attention."""
    from dataclasses import replace

    own = modules(model, layer, stack).attention
    plain = replace(separate(own.n_heads, own.q, own.k, own.v, own.o), scale=1.0)
    if stack == "cross":
        return plain
    first = modules(model, 0, stack).attention
    relative = RelativeBias(
        table=first.relative_attention_bias.weight.detach(),  # (num_buckets, H)
        bidirectional=stack == "encoder",
        max_distance=first.relative_attention_max_distance,
    )
    return replace(plain, relative=relative)
