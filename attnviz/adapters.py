"""Reading one attention layer out of a loaded Hugging Face model, per architecture.

For each layer an adapter names two modules and the weights:
- the query projection, whose input is the attention block's input X (for GPT-2 that is
  after ln_1, because GPT-2 normalises before attention);
- the output projection W_O, whose output is the block's output before residual and LayerNorm;
- W_Q, W_K, W_V, W_O and biases, turned into the `X @ W + b` convention of `attnviz.mha`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from attnviz.errors import UnsupportedModelError
from attnviz.mha import LayerWeights

SUPPORTED = ("bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert", "gpt2")


@dataclass(frozen=True, eq=False)
class LayerModules:
    """One layer's modules: q, k, v (GPT-2: the fused c_attn for all three) and W_O."""

    q: Any
    k: Any
    v: Any
    o: Any
    fused_qkv: bool = False


def layer_modules(model: Any, layer: int) -> LayerModules:
    """Find the projection modules of `layer`, or explain which architectures are supported."""
    config = model.config
    kind = config.model_type
    if kind in ("bert", "roberta", "xlm-roberta", "electra"):
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            raise UnsupportedModelError(
                f"{kind} with {config.position_embedding_type} position embeddings adds position "
                "terms to the scores; the from-scratch check supports absolute positions only"
            )
        block = model.encoder.layer[layer].attention
        own = block.self
        return LayerModules(own.query, own.key, own.value, block.output.dense)
    if kind == "albert":
        if config.inner_group_num != 1:
            raise UnsupportedModelError("ALBERT with inner_group_num > 1 is not supported by check")
        # ALBERT shares weights: layers are split evenly over num_hidden_groups groups.
        group = int(layer / (config.num_hidden_layers / config.num_hidden_groups))
        block = model.encoder.albert_layer_groups[group].albert_layers[0].attention
        return LayerModules(block.query, block.key, block.value, block.dense)
    if kind == "distilbert":
        block = model.transformer.layer[layer].attention
        return LayerModules(block.q_lin, block.k_lin, block.v_lin, block.out_lin)
    if kind == "gpt2":
        if not config.scale_attn_weights or config.scale_attn_by_inverse_layer_idx:
            raise UnsupportedModelError(
                "GPT-2 with non-standard score scaling (scale_attn_weights=False or "
                "scale_attn_by_inverse_layer_idx=True) is not supported by check"
            )
        block = model.h[layer].attn
        return LayerModules(block.c_attn, block.c_attn, block.c_attn, block.c_proj, fused_qkv=True)
    raise UnsupportedModelError(
        f"check does not know how to read '{kind}' attention; supported: {', '.join(SUPPORTED)}"
    )


def _linear(module: Any) -> tuple[Any, Any]:
    """(W, b) with W of shape (in, out): nn.Linear stores (out, in), GPT-2's Conv1D (in, out)."""
    import torch

    if isinstance(module, torch.nn.Linear):
        weight = module.weight.detach().T
    else:
        weight = module.weight.detach()
    bias = module.bias.detach() if module.bias is not None else torch.zeros(weight.shape[1])
    return weight, bias


def layer_weights(model: Any, layer: int) -> LayerWeights:
    """W_Q, W_K, W_V, W_O and biases of `layer`, each (d_model, d_model), as `X @ W + b`."""
    modules = layer_modules(model, layer)
    if modules.fused_qkv:
        weight, bias = _linear(modules.q)  # (d_model, 3·d_model): [Q | K | V]
        d = weight.shape[0]
        (w_q, w_k, w_v), (b_q, b_k, b_v) = weight.split(d, dim=1), bias.split(d)
    else:
        (w_q, b_q), (w_k, b_k), (w_v, b_v) = (_linear(m) for m in (modules.q, modules.k, modules.v))
    w_o, b_o = _linear(modules.o)
    return LayerWeights(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, model.config.num_attention_heads)


@dataclass
class Captured:
    """What the hooks saw in one forward pass: each layer's attention input and output."""

    inputs: dict[int, Any]
    outputs: dict[int, Any]


@contextmanager
def capture_layers(model: Any, layers: list[int]) -> Iterator[Captured]:
    """Record the input X and the W_O output of `layers` during the forward passes inside.

    Modules shared by several layers (ALBERT) are called once per layer, in order, so the
    n-th call of a shared module belongs to the n-th layer that uses it.
    """
    n_layers = model.config.num_hidden_layers
    users: dict[int, list[int]] = {}  # id(module) -> the layers that call it, in order
    modules = [layer_modules(model, layer) for layer in range(n_layers)]
    for layer, mods in enumerate(modules):
        users.setdefault(id(mods.q), []).append(layer)
        users.setdefault(id(mods.o), []).append(layer)
    calls: dict[int, int] = {}
    captured = Captured({}, {})
    wanted = set(layers)

    def which_layer(module: Any, kind: str) -> int:
        key = (id(module), kind)
        n = calls.get(key, 0)
        calls[key] = n + 1
        return users[id(module)][n]

    def on_input(module, args):
        layer = which_layer(module, "in")
        if layer in wanted:
            captured.inputs[layer] = args[0].detach()

    def on_output(module, args, output):
        layer = which_layer(module, "out")
        if layer in wanted:
            captured.outputs[layer] = output.detach()

    handles = []
    for module in {id(m.q): m.q for m in modules}.values():
        handles.append(module.register_forward_pre_hook(on_input))
    for module in {id(m.o): m.o for m in modules}.values():
        handles.append(module.register_forward_hook(on_output))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()
