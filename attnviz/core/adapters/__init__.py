"""Reading attention layers out of loaded Hugging Face models, one adapter per architecture.

Each adapter (a module here, see `base` for what it provides) names a layer's attention
module, its input and output projections, and turns its weights into the `X @ W + b`
convention of `attnviz.core.mha`. A new architecture is one new module plus one line in
FAMILIES. Encoder-decoder families (T5, BART) name three attention stacks (`STACKS`); every
other family has one, named None.
`attnviz.core.capture` uses the adapters' modules to hook a forward pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from attnviz.core.adapters import (
    albert,
    bart,
    bert,
    dinov2,
    distilbert,
    generic,
    gpt2,
    gpt_neox,
    llama,
    modernbert,
    opt,
    phi3,
    t5,
    vit,
)
from attnviz.core.adapters.base import STACKS as STACKS
from attnviz.core.adapters.base import LayerModules, Norm, norm_of, onloaded
from attnviz.core.mha import LayerWeights
from attnviz.errors import UnsupportedModelError

FAMILIES = (bert, albert, distilbert, modernbert, gpt2, gpt_neox, opt, llama, phi3, t5, bart, vit,
            dinov2)  # fmt: skip
BY_TYPE = {kind: family for family in FAMILIES for kind in family.TYPES}
SUPPORTED = tuple(BY_TYPE)
DECODER_TYPES = tuple(kind for kind, family in BY_TYPE.items() if family.CAUSAL)
# What each stack is, as the terminal, the report and the figures title it.
STACK_TITLES = {
    "encoder": "Encoder self-attention (source × source)",
    "decoder": "Decoder self-attention (target × target, causal)",
    "cross": "Cross-attention (target × source)",
}


def _family(model: Any) -> Any:
    kind = model.config.model_type
    if kind not in BY_TYPE:
        raise UnsupportedModelError(
            f"attnviz's from-scratch attention does not know '{kind}'; it knows: "
            f"{', '.join(SUPPORTED)} (docs/models.md: one file and one line add a family)"
        )
    return BY_TYPE[kind]


def knows(model: Any) -> bool:
    """Whether attnviz has an adapter for `model`'s family (X, W_O and the norms by name)."""
    return model.config.model_type in BY_TYPE


def stacks_of(model: Any) -> tuple[str | None, ...]:
    """The model's attention stacks: ("encoder", "decoder", "cross"), or (None,): one."""
    if model.config.model_type not in BY_TYPE:
        return generic.stacks(model)
    return getattr(_family(model), "STACKS", (None,))


def n_layers(model: Any, stack: str | None = None) -> int:
    """How many layers `stack` has (cross-attention sits in each decoder layer)."""
    config = model.config
    if config.model_type not in BY_TYPE:
        return len(generic.callers(model, stack))
    if stack is None:
        return config.num_hidden_layers
    if stack == "encoder":
        return getattr(config, "encoder_layers", None) or config.num_layers
    return getattr(config, "decoder_layers", None) or config.num_decoder_layers


def _with_stack(family: Any, stack: str | None) -> tuple:
    if hasattr(family, "STACKS") != (stack is not None):
        raise ValueError(
            f"stack {stack!r} for a model whose stacks are {getattr(family, 'STACKS', None)}"
        )
    return () if stack is None else (stack,)


def layer_modules(model: Any, layer: int, stack: str | None = None) -> LayerModules:
    """The attention modules of `layer` (of `stack`, in an encoder-decoder model): the
    family's where attnviz has an adapter, else the attention module alone (`generic`)."""
    if model.config.model_type not in BY_TYPE:
        return generic.modules(model, layer, stack)
    family = _family(model)
    return family.modules(model, layer, *_with_stack(family, stack))


def caller(mods: LayerModules) -> Any:
    """The module of a layer that calls transformers' attention function (its
    `AttentionInterface`): the layer's attention module or the one inside it that does
    (BERT's `attention.self`); None where the layer's attention bypasses the interface."""
    return next((m for m in mods.attention.modules() if generic.calls_interface(m)), None)


def norm_after(model: Any, layer: int, stack: str | None = None) -> Norm | None:
    """The normalisation that follows `layer`'s attention block, as numbers on the CPU, in
    float32 at least; None where the block's output is added to the residual stream as it is
    (pre-LN decoders). Any model's: `core.residual.norm_after`."""
    mods = layer_modules(model, layer, stack)
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
    at = _with_stack(family, stack)
    mods = family.modules(model, layer, *at)
    # T5 reads its stack's relative position bias from the stack's first layer
    first = family.modules(model, 0, *at) if at else mods
    with onloaded(model, mods.attention, mods.q, mods.o, first.attention):
        return family.weights(model, layer, *at).to_cpu()


class EachLayer(Mapping):
    """{layer: `layer_weights`} of one stack, each read when it is asked for and not kept: a
    model's weights may sit on a GPU or on the disk, and a copy of every layer's at once (on
    the CPU, in float32) would cost as much memory as the model's attention. Made, it has read
    layer 0, so an architecture the from-scratch attention cannot read refuses here."""

    def __init__(self, model: Any, stack: str | None = None) -> None:
        self.model, self.stack = model, stack
        self.count = n_layers(model, stack)
        self.first = layer_weights(model, 0, stack)

    def __getitem__(self, layer: int) -> LayerWeights:
        if not 0 <= layer < self.count:
            raise KeyError(layer)
        return layer_weights(self.model, layer, self.stack)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.count))

    def __len__(self) -> int:
        return self.count
