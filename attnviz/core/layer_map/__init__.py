"""The layer map: where each layer's attention modules are in any loaded model, which
`core.capture` hooks and hands the attention function's calls to.

A family attnviz names (a module here, see `base`) says where its layers' attention module,
X's projection, W_O, the residual stream and the normalisation after the block are; a new
family is one new module plus one line in NAMED. Any other model is mapped by what it does
(`generic`): its layers are the modules that call transformers' attention interface, W_O is
found by name. Encoder-decoder families (T5, BART) have three attention stacks (`STACKS`);
every other model has one, named None (a vision-language model's vision tower is a second,
`generic.VISION`). `of(model)` is the whole map of a model, made once a pass; the functions
below answer for one layer. Each family's weights, for the from-scratch attention, are
`core.families`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnviz.core.layer_map import (
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
from attnviz.core.layer_map.base import STACKS as STACKS
from attnviz.core.layer_map.base import LayerModules as LayerModules

NAMED = (bert, albert, distilbert, modernbert, gpt2, gpt_neox, opt, llama, phi3, t5, bart, vit,
         dinov2)  # fmt: skip
BY_TYPE = {kind: family for family in NAMED for kind in family.TYPES}
SUPPORTED = tuple(BY_TYPE)
DECODER_TYPES = tuple(kind for kind, family in BY_TYPE.items() if family.CAUSAL)
# What each stack is, as the terminal, the report and the figures title it.
STACK_TITLES = {
    "encoder": "Encoder self-attention (source × source)",
    "decoder": "Decoder self-attention (target × target, causal)",
    "cross": "Cross-attention (target × source)",
}

Site = tuple  # (stack, layer): a layer of one attention stack (stack None: the only one)


def family_of(model: Any) -> Any:
    """The module of NAMED that maps `model`'s layers, or None (`generic` maps them)."""
    return BY_TYPE.get(model.config.model_type)


def stacks_of(model: Any) -> tuple[str | None, ...]:
    """The model's attention stacks: ("encoder", "decoder", "cross"), or (None,): one."""
    family = family_of(model)
    if family is None:
        return generic.stacks(model)
    return getattr(family, "STACKS", (None,))


def n_layers(model: Any, stack: str | None = None) -> int:
    """How many layers `stack` has (cross-attention sits in each decoder layer)."""
    config = model.config
    if family_of(model) is None:
        return len(generic.callers(model, stack))
    if stack is None:
        return config.num_hidden_layers
    if stack == "encoder":
        return getattr(config, "encoder_layers", None) or config.num_layers
    return getattr(config, "decoder_layers", None) or config.num_decoder_layers


def layer_modules(model: Any, layer: int, stack: str | None = None) -> LayerModules:
    """The attention modules of `layer` (of `stack`, in an encoder-decoder model): the
    family's where attnviz names it, else the attention module alone (`generic`)."""
    family = family_of(model)
    if family is None:
        return generic.modules(model, layer, stack)
    if hasattr(family, "STACKS") != (stack is not None):
        raise ValueError(
            f"stack {stack!r} for a model whose stacks are {getattr(family, 'STACKS', None)}"
        )
    return family.modules(model, layer, *(() if stack is None else (stack,)))


def caller(mods: LayerModules) -> Any:
    """The module of a layer that calls transformers' attention function (its
    `AttentionInterface`): the layer's attention module or the one inside it that does
    (BERT's `attention.self`); None where the layer's attention bypasses the interface."""
    return next((m for m in mods.attention.modules() if generic.calls_interface(m)), None)


@dataclass(frozen=True, eq=False)
class LayerMap:
    """Where every layer's attention is in one model, found at once: what a pass hooks and
    what the attention function's calls are.

    `stacks` are the model's attention stacks; `modules` each site's (stack, layer) modules,
    stack by stack, layer 0 first; `callers` which sites each module that calls the
    attention function serves, in the order it is called (a module shared by several layers,
    ALBERT's, is called once per layer); `own` whether the model's attention bypasses the
    interface (`generic.own`: it runs eager and hands its probabilities out when asked)."""

    stacks: tuple[str | None, ...]
    modules: dict[Site, LayerModules]
    callers: dict[int, list[Site]]
    own: bool


def of(model: Any) -> LayerMap:
    """The layer map of `model` (see `LayerMap`)."""
    stacks = stacks_of(model)
    modules = {
        (stack, layer): layer_modules(model, layer, stack)
        for stack in stacks
        for layer in range(n_layers(model, stack))
    }
    callers: dict[int, list[Site]] = {}
    for site, mods in modules.items():
        module = caller(mods)
        if module is not None:
            callers.setdefault(id(module), []).append(site)
    return LayerMap(stacks, modules, callers, generic.own(model))
