"""Reading attention layers out of loaded Hugging Face models, one adapter per architecture.

Each adapter (a module here, see `base` for what it provides) names a layer's attention
module, its input and output projections, and turns its weights into the `X @ W + b`
convention of `attnviz.core.mha`. A new architecture is one new module plus one line in FAMILIES.
`attnviz.core.capture` uses the adapters' modules to hook a forward pass.
"""

from __future__ import annotations

from typing import Any

from attnviz.core.adapters import albert, bert, distilbert, gpt2, llama, phi3
from attnviz.core.adapters.base import LayerModules, Norm, norm_of
from attnviz.core.mha import LayerWeights
from attnviz.errors import UnsupportedModelError

FAMILIES = (bert, albert, distilbert, gpt2, llama, phi3)
BY_TYPE = {kind: family for family in FAMILIES for kind in family.TYPES}
SUPPORTED = tuple(BY_TYPE)
DECODER_TYPES = tuple(kind for kind, family in BY_TYPE.items() if family.CAUSAL)


def _family(model: Any) -> Any:
    kind = model.config.model_type
    if kind not in BY_TYPE:
        raise UnsupportedModelError(
            f"attnviz does not know how to read '{kind}' attention; supported: "
            f"{', '.join(SUPPORTED)}"
        )
    return BY_TYPE[kind]


def layer_modules(model: Any, layer: int) -> LayerModules:
    """The attention modules of `layer`, or a one-line error naming the supported types."""
    return _family(model).modules(model, layer)


def norm_after(model: Any, layer: int) -> Norm | None:
    """The normalisation that follows `layer`'s attention block, as numbers; None where the
    block's output is added to the residual stream as it is (pre-LN decoders)."""
    mods = layer_modules(model, layer)
    return norm_of(mods.norm, mods.norm_covers_residual) if mods.norm is not None else None


def layer_weights(model: Any, layer: int) -> LayerWeights:
    """The weights of `layer` as `X @ W + b` (see `attnviz.core.mha.LayerWeights`), or a one-line
    UnsupportedModelError naming what the from-scratch attention does not compute."""
    return _family(model).weights(model, layer)
