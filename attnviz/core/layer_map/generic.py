"""The layer map of any model whose attention goes through transformers'
`AttentionInterface`, without a family of its own: its layers are the modules that call the
interface, in the order the model registers them (layer 0 first). attnviz records their
probabilities inside that call (`core.recording`), and the values v it hands over there. Each
head's output projection W_O is found by name (OUTPUT_PROJECTIONS, TransformerLens-style),
which is all the norm measure needs beside v. How the block's output joins the residual
stream (ALTI and the mixing ratios) is read from the model itself (`core.residual`); `check`
(X's projections by name, the weights: `core.families`) stays with the named families.

A model type whose attention bypasses the interface (BLOOM, MPT, GPT-Neo,
DeBERTa-v2: `bypasses_interface`, from transformers' source files) runs eager attention with
`output_attentions`: its layers are the modules whose outputs hold the tensors the model hands
back as its attentions (`capture.own_attention` finds them in one pass over four tokens, and
`keep_own` keeps them here), and the probabilities are read from those outputs."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from attnviz.core.layer_map.base import STACKS, LayerModules
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


# What a model class that takes the interface declares (a model of parts, LLaVA, says so for
# the language model it holds, whose own file calls the interface).
DECLARED = "_supports_attention_backend = True"


def bypasses_interface(model_type: str) -> bool:
    """Whether transformers' modelling code for `model_type` computes its attention without
    the interface (it neither calls it nor declares that it takes it): read from its source
    file, without importing it or torch, so before anything loads. ImportError where
    transformers has no modelling file for the type."""
    source = _modelling_source(model_type)
    return INTERFACE not in source and DECLARED not in source


@functools.cache
def _modelling_source(model_type: str) -> str:
    """The text of transformers' modeling_<name>.py for `model_type` (its folder named as
    transformers' `model_type_to_module_name` names it, deprecated models included)."""
    import importlib.util
    import re
    from pathlib import Path

    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("transformers is not installed")
    models = Path(spec.submodule_search_locations[0], "models")
    try:
        table = (models / "auto" / "auto_mappings.py").read_text(encoding="utf-8")
    except OSError:
        table = ""
    start = table.find("SPECIAL_MODEL_TYPE_TO_MODULE_NAME")  # ("blip-2", "blip_2"), … )
    block = table[start : table.find("\n)", start)] if start >= 0 else ""
    special = dict(re.findall(r'\("([\w\-]+)",\s*"(\w+)"\)', block))
    name = special.get(model_type, model_type.replace("-", "_"))
    for folder in (models / name, models / "deprecated" / name):
        try:
            return (folder / f"modeling_{name}.py").read_text(encoding="utf-8")
        except OSError:
            continue
    raise ImportError(f"transformers has no modelling file for '{model_type}'")


def calls_interface(module: Any) -> bool:
    """Whether `module`'s forward calls the attention function its config names."""
    return _calls(type(module))


def keep_own(model: Any, found: list[tuple[Any, int]]) -> None:
    """Keep, on a model whose attention bypasses the interface, each layer's attention
    module and where its output holds the probabilities (`capture.own_attention`, layer 0
    first): its layers from now on (`callers`, `modules`)."""
    model._attnviz_callers = {None: [module for module, _ in found]}
    model._attnviz_own = {id(module): at for module, at in found}


def own(model: Any) -> bool:
    """Whether `model`'s attention bypasses the interface (`keep_own`): it runs eager, and
    hands its probabilities out only when run with `output_attentions`."""
    return getattr(model, "_attnviz_own", None) is not None


def callers(model: Any, stack: str | None = None) -> list[Any]:
    """`stack`'s attention modules that call the interface, layer 0 first (found once a
    model): every one in a model with one stack; a model whose attention bypasses the
    interface, its attention modules (`keep_own`)."""
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
    vision-language model (its language model, and its vision tower), and "cross" after them
    where its language model reads the picture in cross-attention layers (Mllama's); else
    (None,)."""
    if model.config.is_encoder_decoder:
        return STACKS
    if reading(model) is model.base_model:
        return (None,)
    return (None, VISION, CROSS) if callers(model, CROSS) else (None, VISION)


VISION = "vision"  # a vision-language model's vision tower, beside its language model (None)
CROSS = "cross"  # its language model's cross-attention to the picture (Mllama's), or a decoder's


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
    vision-language model, the language model's (None), its cross-attention to the
    picture's states (Mllama's: keys that are no tokens of the text), or the vision
    tower's."""
    parts = name.lower().split(".")
    cross = getattr(module, "is_cross_attention", False) or any(
        word in part for part in parts for word in _CROSS
    )
    if not model.config.is_encoder_decoder:
        language = reading(model)
        if language is model.base_model:
            return None
        inside = getattr(model, "_attnviz_language", None)
        if inside is None:  # the language model's modules, found once a model
            inside = model._attnviz_language = {id(m) for m in language.modules()}
        if id(module) not in inside:
            return VISION
        return "cross" if cross else None
    if "encoder" in parts:
        return "encoder"
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
    at = getattr(model, "_attnviz_own", {}).get(id(caller), 1)  # eager's (output, probs, …)
    return LayerModules(caller, None, output_projection(model, layer, stack), residual=holder,
                        probs_at=at)  # fmt: skip


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
