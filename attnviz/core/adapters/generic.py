"""Any model whose attention goes through transformers' `AttentionInterface`, without an
adapter: its layers are the modules that call the interface, in the order the model
registers them (layer 0 first). attnviz records their probabilities inside that call
(`core.recording`), and the values v it hands over there. Each head's output projection W_O
is found by name (OUTPUT_PROJECTIONS, TransformerLens-style), which is all the norm measure
needs beside v. How the block's output joins the residual stream (ALTI and the mixing ratios)
is read from the model itself (`core.residual`); `check` (X's projections by name) stays
with the adapters.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from attnviz.core.adapters.base import STACKS, LayerModules
from attnviz.core.model_info import language_config

# What a modelling code that calls the interface names: its attention modules look their
# function up in transformers' registry of attention functions.
INTERFACE = "ALL_ATTENTION_FUNCTIONS"


@functools.cache
def _calls(cls: type) -> bool:
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return INTERFACE in source


def type_calls_interface(model_type: str) -> bool:
    """Whether transformers' modelling code for `model_type` calls the interface at all
    (read before any weights load); ImportError where transformers has no model for it."""
    import importlib

    from transformers.models.auto.configuration_auto import model_type_to_module_name

    name = model_type_to_module_name(model_type)
    code = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    return INTERFACE in inspect.getsource(code)


def calls_interface(module: Any) -> bool:
    """Whether `module`'s forward calls the attention function its config names."""
    return _calls(type(module))


def callers(model: Any, stack: str | None = None) -> list[Any]:
    """`stack`'s attention modules that call the interface, layer 0 first (found once a
    model): every one in a model with one stack."""
    found = getattr(model, "_attnviz_callers", None)
    if found is None:
        found = {}
        for name, module in model.base_model.named_modules():
            if calls_interface(module):
                found.setdefault(_stack(model, name, module), []).append(module)
        model._attnviz_callers = found  # a plain attribute: a dict is no submodule
    return found.get(stack, [])


def stacks(model: Any) -> tuple[str | None, ...]:
    """("encoder", "decoder", "cross") for an encoder-decoder model; (None, "vision") for a
    vision-language model (its language model, and its vision tower); else (None,)."""
    if model.config.is_encoder_decoder:
        return STACKS
    return (None, VISION) if reading(model) is not model.base_model else (None,)


VISION = "vision"  # a vision-language model's vision tower, beside its language model (None)


def reading(model: Any) -> Any:
    """The modules that read a text: a vision-language model's language model (its
    `get_decoder()`; its vision tower's attention is not the text's), else the base model."""
    if language_config(model.config) is model.config:
        return model.base_model
    return model.get_decoder()


_CROSS = ("cross", "encoder_attn", "encdec")  # BART, NLLB-MoE, T5 call theirs so


def _stack(model: Any, name: str, module: Any) -> str | None:
    """Which stack the module at `name` is in: by its place (under the encoder or not) and,
    in the decoder, whether it reads the encoder's states (cross-attention); in a
    vision-language model, the language model's (None) or the vision tower's."""
    if not model.config.is_encoder_decoder:
        language = reading(model)
        if language is model.base_model:
            return None
        inside = getattr(model, "_attnviz_language", None)
        if inside is None:  # the language model's modules, found once a model
            inside = model._attnviz_language = {id(m) for m in language.modules()}
        return None if id(module) in inside else VISION
    parts = name.lower().split(".")
    if "encoder" in parts:
        return "encoder"
    cross = getattr(module, "is_cross_attention", False) or any(
        word in part for part in parts for word in _CROSS
    )
    return "cross" if cross else "decoder"


# Where an attention module's output projection W_O is, by attribute name: the first of these
# that is a linear map from the heads' outputs side by side (H · d_head) to the model's width,
# on the module that calls the interface or on its parent (BERT-style: the projection in a
# sibling "output" module). Llama-style o_proj, BART/OPT/GPT-J/Whisper out_proj, GPT-NeoX and
# Phi dense, GPT-2 c_proj, T5 o, ModernBERT Wo, DistilBERT out_lin.
OUTPUT_PROJECTIONS = ("o_proj", "out_proj", "dense", "c_proj", "o", "Wo", "out_lin", "wo",
                      "output.dense")  # fmt: skip


def output_projection(model: Any, layer: int, stack: str | None = None) -> Any:
    """Layer `layer`'s output projection module (W_O), found by OUTPUT_PROJECTIONS, or None."""
    caller = callers(model, stack)[layer]
    for holder in (caller, _parents(model).get(id(caller))):
        for name in OUTPUT_PROJECTIONS:
            found = holder
            for part in name.split("."):
                found = getattr(found, part, None) if found is not None else None
            weight = getattr(found, "weight", None)
            if weight is not None and weight.dim() == 2:
                return found
    return None


def _parents(model: Any) -> dict[int, Any]:
    """{id(module): its parent} over the base model (found once a model)."""
    found = getattr(model, "_attnviz_parents", None)
    if found is None:
        found = {}
        for _, module in model.base_model.named_modules():
            for child in module.children():
                found[id(child)] = module
        model._attnviz_parents = found
    return found


def modules(model: Any, layer: int, stack: str | None = None) -> LayerModules:
    """Layer `layer`'s attention module, its output projection (None where none is found by
    name) and, for a model with one stack, the layer that holds them, whose input is the
    residual stream (`around` checks that it is before a measure relies on it); X is not
    known here (None), nor the normalisation after the block (`around`)."""
    caller = callers(model, stack)[layer]
    holder = layer_of(model, caller) if stack is None else None
    return LayerModules(caller, None, output_projection(model, layer, stack), residual=holder)


def layer_of(model: Any, module: Any) -> Any:
    """The layer `module` sits in: its nearest ancestor (or itself) that is an item of a
    ModuleList (a model's list of layers); None where there is none."""
    import torch

    parents = _parents(model)
    found = module
    while found is not None:
        parent = parents.get(id(found))
        if isinstance(parent, torch.nn.ModuleList):
            return found
        found = parent
    return None
