"""Each family's weights for the from-scratch attention (`core.mha`), one module a family.

A family's module here gives `weights(model, layer, mods)` (and the stack, for an
encoder-decoder family): W_Q, W_K, W_V, W_O and biases in the `X @ W + b` convention of
`attnviz.core.mha`, with what the family adds (RoPE, a relative position bias, a sliding
window, …), read from the layer's modules as the layer map names them (`core.layer_map`), or
an UnsupportedModelError naming what the from-scratch attention does not compute. A new family
is one new module here plus one line in FAMILIES, beside its module in the layer map (one
module and one line there too).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from attnviz.core import layer_map
from attnviz.core.families import (
    albert,
    bart,
    bert,
    dinov2,
    distilbert,
    gpt2,
    gpt_neox,
    llama,
    modernbert,
    opt,
    phi3,
    t5,
    vit,
)
from attnviz.core.families.base import Norm, norm_of, onloaded
from attnviz.core.mha import LayerWeights
from attnviz.errors import UnsupportedModelError

# Each family's weights, by the layer map's family whose modules they are read from.
FAMILIES = {
    layer_map.bert: bert,
    layer_map.albert: albert,
    layer_map.distilbert: distilbert,
    layer_map.modernbert: modernbert,
    layer_map.gpt2: gpt2,
    layer_map.gpt_neox: gpt_neox,
    layer_map.opt: opt,
    layer_map.llama: llama,
    layer_map.phi3: phi3,
    layer_map.t5: t5,
    layer_map.bart: bart,
    layer_map.vit: vit,
    layer_map.dinov2: dinov2,
}
SUPPORTED = tuple(kind for kind, named in layer_map.BY_TYPE.items() if named in FAMILIES)


def knows(model: Any) -> bool:
    """Whether attnviz reads `model`'s family's weights (X, W_O and the norms by name)."""
    return layer_map.BY_TYPE.get(model.config.model_type) in FAMILIES


def _family(model: Any) -> Any:
    kind = model.config.model_type
    family = FAMILIES.get(layer_map.BY_TYPE.get(kind))
    if family is None:
        raise UnsupportedModelError(
            f"attnviz's from-scratch attention does not know '{kind}'; it knows: "
            f"{', '.join(SUPPORTED)} (docs/models.md: how to add a family)"
        )
    return family


def norm_after(model: Any, layer: int, stack: str | None = None) -> Norm | None:
    """The normalisation that follows `layer`'s attention block, as numbers on the CPU, in
    float32 at least; None where the block's output is added to the residual stream as it is
    (pre-LN decoders). Any model's: `core.residual.norm_after`."""
    mods = layer_map.layer_modules(model, layer, stack)
    if mods.norm is None:
        return None
    with onloaded(model, mods.norm):
        return norm_of(mods.norm, mods.norm_covers_residual).to_cpu()


def layer_weights(model: Any, layer: int, stack: str | None = None) -> LayerWeights:
    """The weights of `layer` as `X @ W + b` (see `attnviz.core.mha.LayerWeights`), on the CPU
    and in float32 at least (half precision upcast, bitsandbytes' 4 and 8 bits unpacked),
    wherever the model keeps them; or a one-line UnsupportedModelError naming what the
    from-scratch attention does not compute."""
    family = _family(model)
    mods = layer_map.layer_modules(model, layer, stack)
    # T5 reads its stack's relative position bias from the stack's first layer
    first = layer_map.layer_modules(model, 0, stack) if stack is not None else mods
    with onloaded(model, mods.attention, mods.q, mods.o, first.attention):
        return family.weights(model, layer, mods, *(() if stack is None else (stack,))).to_cpu()


class EachLayer(Mapping):
    """{layer: `layer_weights`} of one stack, each read when it is asked for and not kept: a
    model's weights may sit on a GPU or on the disk, and a copy of every layer's at once (on
    the CPU, in float32) would cost as much memory as the model's attention. Made, it has read
    layer 0, so an architecture the from-scratch attention cannot read refuses here."""

    def __init__(self, model: Any, stack: str | None = None) -> None:
        self.model, self.stack = model, stack
        self.count = layer_map.n_layers(model, stack)
        self.first = layer_weights(model, 0, stack)

    def __getitem__(self, layer: int) -> LayerWeights:
        if not 0 <= layer < self.count:
            raise KeyError(layer)
        return layer_weights(self.model, layer, self.stack)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.count))

    def __len__(self) -> int:
        return self.count
