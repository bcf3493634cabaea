"""Any model whose attention goes through transformers' `AttentionInterface`, without an
adapter: its layers are the modules that call the interface, in the order the model
registers them (layer 0 first). attnviz records their probabilities inside that call
(`core.recording`); what needs a family's weight names (X, W_O, the norms: `check`, the norm
and ALTI measures) is refused for such a model in one line.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from attnviz.core.adapters.base import STACKS, LayerModules

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
    """("encoder", "decoder", "cross") for an encoder-decoder model, else (None,)."""
    return STACKS if model.config.is_encoder_decoder else (None,)


_CROSS = ("cross", "encoder_attn", "encdec")  # BART, NLLB-MoE, T5 call theirs so


def _stack(model: Any, name: str, module: Any) -> str | None:
    """Which stack the module at `name` is in: by its place (under the encoder or not) and,
    in the decoder, whether it reads the encoder's states (cross-attention)."""
    if not model.config.is_encoder_decoder:
        return None
    parts = name.lower().split(".")
    if "encoder" in parts:
        return "encoder"
    cross = getattr(module, "is_cross_attention", False) or any(
        word in part for part in parts for word in _CROSS
    )
    return "cross" if cross else "decoder"


def modules(model: Any, layer: int, stack: str | None = None) -> LayerModules:
    """Layer `layer`'s attention module; X, W_O and the norms are not known here (None)."""
    return LayerModules(callers(model, stack)[layer], None, None)
