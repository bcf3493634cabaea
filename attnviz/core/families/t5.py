"""T5 (and v1.1, Flan-T5, mT5): a relative position bias computed in each stack's first layer
and shared by the others, and unscaled scores, in each of the three stacks (encoder self,
decoder self, cross-attention)."""

from __future__ import annotations

from typing import Any

from attnviz.core.families.base import separate
from attnviz.core.layer_map import layer_modules
from attnviz.core.layer_map.base import LayerModules
from attnviz.core.mha import LayerWeights, RelativeBias


def weights(model: Any, layer: int, mods: LayerModules, stack: str) -> LayerWeights:
    """Unscaled scores (T5 folds 1/√d_k into its initialisation); in self-attention, the
    relative position bias of the stack's first layer, which every layer of the stack
    shares (bidirectional in the encoder, causal in the decoder); none in cross-attention."""
    from dataclasses import replace

    own = mods.attention
    plain = replace(separate(own.n_heads, own.q, own.k, own.v, own.o), scale=1.0)
    if stack == "cross":
        return plain
    first = layer_modules(model, 0, stack).attention
    relative = RelativeBias(
        table=first.relative_attention_bias.weight.detach(),  # (num_buckets, H)
        bidirectional=stack == "encoder",
        max_distance=first.relative_attention_max_distance,
    )
    return replace(plain, relative=relative)
