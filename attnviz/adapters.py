"""Reading one attention layer out of a loaded Hugging Face model, per architecture.

For each layer an adapter names three modules and the weights:
- the attention module, whose output holds the layer's probabilities (B, H, T, T);
- the query projection, whose input is the attention block's input X (for GPT-2 that is
  after ln_1, for Llama-family decoders after input_layernorm: they normalise first);
- the output projection W_O, whose output is the block's output before residual and LayerNorm;
- W_Q, W_K, W_V, W_O and biases, turned into the `X @ W + b` convention of `attnviz.mha`,
  with what the family adds (RoPE, grouped-query heads, norms, windows, soft-capping).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from attnviz.errors import UnsupportedModelError
from attnviz.mha import LayerWeights, Rope

SUPPORTED = ("bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert", "gpt2")
SUPPORTED += ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3")


@dataclass(frozen=True, eq=False)
class LayerModules:
    """One layer's modules: its attention (whose output is (…, probabilities (B, H, T, T))),
    the projection whose input is X, and W_O, whose output is the block's output."""

    attention: Any
    q: Any
    o: Any


LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3")


def layer_modules(model: Any, layer: int) -> LayerModules:
    """Find the attention modules of `layer`, or explain which architectures are supported."""
    config = model.config
    kind = config.model_type
    base = model.base_model  # a causal LM's decoder stack, an encoder itself
    if kind in ("bert", "roberta", "xlm-roberta", "electra"):
        block = base.encoder.layer[layer].attention
        return LayerModules(block.self, block.self.query, block.output.dense)
    if kind == "albert":
        # ALBERT shares weights: layers are split evenly over num_hidden_groups groups.
        group = int(layer / (config.num_hidden_layers / config.num_hidden_groups))
        block = base.encoder.albert_layer_groups[group].albert_layers[0].attention
        return LayerModules(block, block.query, block.dense)
    if kind == "distilbert":
        block = base.transformer.layer[layer].attention
        return LayerModules(block, block.q_lin, block.out_lin)
    if kind == "gpt2":
        block = base.h[layer].attn
        return LayerModules(block, block.c_attn, block.c_proj)
    if kind in LLAMA_FAMILY:
        block = base.layers[layer].self_attn
        return LayerModules(block, block.qkv_proj if kind == "phi3" else block.q_proj, block.o_proj)
    raise UnsupportedModelError(
        f"attnviz does not know how to read '{kind}' attention; supported: {', '.join(SUPPORTED)}"
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
    """The weights of `layer` as `X @ W + b` (see `attnviz.mha.LayerWeights`), or a one-line
    UnsupportedModelError naming what the from-scratch attention does not compute."""
    config = model.config
    kind = config.model_type
    modules = layer_modules(model, layer)
    if kind in ("bert", "roberta", "xlm-roberta", "electra"):
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            raise UnsupportedModelError(
                f"{kind} with {config.position_embedding_type} position embeddings adds position "
                "terms to the scores; the from-scratch check supports absolute positions only"
            )
        own = modules.attention
        return _separate(config, own.query, own.key, own.value, modules.o)
    if kind == "albert":
        if config.inner_group_num != 1:
            raise UnsupportedModelError("ALBERT with inner_group_num > 1 is not supported by check")
        own = modules.attention
        return _separate(config, own.query, own.key, own.value, modules.o)
    if kind == "distilbert":
        own = modules.attention
        return _separate(config, own.q_lin, own.k_lin, own.v_lin, modules.o)
    if kind == "gpt2":
        if not config.scale_attn_weights or config.scale_attn_by_inverse_layer_idx:
            raise UnsupportedModelError(
                "GPT-2 with non-standard score scaling (scale_attn_weights=False or "
                "scale_attn_by_inverse_layer_idx=True) is not supported by check"
            )
        weight, bias = _linear(modules.q)  # (d_model, 3·d_model): [Q | K | V]
        d = weight.shape[0]
        (w_q, w_k, w_v), (b_q, b_k, b_v) = weight.split(d, dim=1), bias.split(d)
        w_o, b_o = _linear(modules.o)
        return LayerWeights(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, config.num_attention_heads)
    return _decoder_weights(model, layer, modules)


def _separate(config: Any, q: Any, k: Any, v: Any, o: Any) -> LayerWeights:
    (w_q, b_q), (w_k, b_k), (w_v, b_v), (w_o, b_o) = (_linear(m) for m in (q, k, v, o))
    n_heads = getattr(config, "num_attention_heads", None) or config.n_heads
    return LayerWeights(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, n_heads)


def _decoder_weights(model: Any, layer: int, modules: LayerModules) -> LayerWeights:
    """Llama-family weights: separate (Phi-3: fused) projections, GQA, RoPE, and the
    family's extras (Qwen3 q/k norms, sliding windows, Gemma2 soft-capping and scaling)."""
    config = model.config
    kind = config.model_type
    attn = modules.attention
    n_heads, n_kv = config.num_attention_heads, config.num_key_value_heads
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedModelError(f"{kind} with bidirectional attention is not supported by check")
    if kind == "phi3":
        weight, bias = _linear(attn.qkv_proj)  # (d_model, (H + 2·H_kv)·d_k): [Q | K | V]
        d_q, d_kv = n_heads * attn.head_dim, n_kv * attn.head_dim
        (w_q, w_k, w_v), (b_q, b_k, b_v) = (
            weight.split([d_q, d_kv, d_kv], dim=1),
            bias.split([d_q, d_kv, d_kv]),
        )
    else:
        (w_q, b_q), (w_k, b_k), (w_v, b_v) = (_linear(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
    w_o, b_o = _linear(attn.o_proj)
    q_norm = getattr(attn, "q_norm", None)
    if q_norm is not None and type(q_norm).__name__ != "Qwen3RMSNorm":
        raise UnsupportedModelError(f"{kind}: check supports Qwen3's q/k RMSNorm only")
    return LayerWeights(
        w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        rope=_rope(model, attn.head_dim),
        q_norm=q_norm.weight.detach() if q_norm is not None else None,
        k_norm=attn.k_norm.weight.detach() if q_norm is not None else None,
        norm_eps=q_norm.variance_epsilon if q_norm is not None else 1e-6,
        scale=attn.scaling,
        softcap=getattr(attn, "attn_logit_softcapping", None),
        window=_window(config, attn),
    )  # fmt: skip


def _window(config: Any, attn: Any) -> int | None:
    """The sliding window this layer's mask uses, or None: Mistral and Phi-3 apply
    config.sliding_window to every layer, Qwen2/3 and Gemma2 to their sliding layers."""
    if config.model_type in ("mistral", "phi3"):
        return getattr(config, "sliding_window", None)
    return getattr(attn, "sliding_window", None)


def _rope(model: Any, head_dim: int) -> Rope:
    """RoPE's frequencies: computed here from rope_theta for the default RoPE (partial for
    Phi-3's partial_rotary_factor); other static kinds (linear, llama3, yarn) from
    transformers' own table; RoPE that changes with the length is refused."""
    import torch

    config = model.config
    params = getattr(config, "rope_parameters", None) or {}
    kind = params.get("rope_type", "default")
    if kind == "default":
        rotary = int(head_dim * params.get("partial_rotary_factor", 1.0))
        exponents = torch.arange(0, rotary, 2, dtype=torch.int64).float() / rotary
        return Rope(inv_freq=1.0 / params["rope_theta"] ** exponents)
    if kind in ("linear", "llama3", "yarn"):
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
        return Rope(inv_freq=inv_freq, scaling=float(scaling))
    raise UnsupportedModelError(
        f"RoPE of type '{kind}' changes with the text's length; check supports default, linear, "
        "llama3 and yarn RoPE"
    )


@dataclass
class Captured:
    """What the hooks saw in one forward pass: each layer's attention input, output and
    probabilities."""

    inputs: dict[int, Any]
    outputs: dict[int, Any]
    probs: dict[int, Any]


Receiver = Callable[[int, Any], None]  # (layer, tensor)


@contextmanager
def hooked(
    model: Any,
    layers: list[int],
    on_input: Receiver | None = None,
    on_output: Receiver | None = None,
    on_probs: Receiver | None = None,
) -> Iterator[None]:
    """During the forward passes inside, hand each of `layers`' attention input X (B, T,
    d_model), block output (B, T, d_model) and probabilities (B, H, T, T) to the receivers.

    Only the chosen layers' tensors are passed on, as each layer runs: nothing else is kept.
    Modules shared by several layers (ALBERT) are called once per layer, in order, so the
    n-th call of a shared module belongs to the n-th layer that uses it.
    """
    modules = [layer_modules(model, layer) for layer in range(model.config.num_hidden_layers)]
    wanted = set(layers)
    handles = []

    def install(pick: Callable[[LayerModules], Any], receive: Receiver, before: bool) -> None:
        users: dict[int, list[int]] = {}  # id(module) -> the layers that call it, in order
        for layer, mods in enumerate(modules):
            users.setdefault(id(pick(mods)), []).append(layer)
        calls: dict[int, int] = {}

        def hook(module, args, output=None):
            n = calls.get(id(module), 0)
            calls[id(module)] = n + 1
            layer = users[id(module)][n % len(users[id(module)])]
            if layer in wanted:
                receive(layer, args[0].detach() if before else output)

        for module in {id(pick(m)): pick(m) for m in modules}.values():
            register = module.register_forward_pre_hook if before else module.register_forward_hook
            handles.append(register(hook))

    if on_input:
        install(lambda m: m.q, on_input, before=True)
    if on_output:
        install(lambda m: m.o, lambda layer, out: on_output(layer, out.detach()), before=False)
    if on_probs:
        # Every supported attention module returns (output, probabilities) in eager mode.
        install(lambda m: m.attention, lambda layer, out: on_probs(layer, out[1]), before=False)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def capture_layers(model: Any, layers: list[int]) -> Iterator[Captured]:
    """Record the input X, the W_O output and the probabilities of `layers` during the
    forward passes inside."""
    captured = Captured({}, {}, {})
    with hooked(
        model,
        layers,
        on_input=captured.inputs.__setitem__,
        on_output=captured.outputs.__setitem__,
        on_probs=captured.probs.__setitem__,
    ):
        yield captured
