"""What the families share: a projection's (W, b), a layer of separate Q, K, V and O, RoPE's
frequencies, a normalisation as numbers, and an offloaded module's weights in place while
they are read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any

from attnviz.core.mha import LayerWeights, Rope, on_cpu
from attnviz.errors import UnsupportedModelError


@dataclass(frozen=True, eq=False)
class Norm:
    """A LayerNorm or RMSNorm as numbers: y = gain ⊙ (u − [centre] mean(u)) / s(u) + bias, with
    s(u) = √(var(u) + eps) (LayerNorm, centred) or √(mean(u²) + eps) (RMSNorm)."""

    centre: bool
    gain: Any  # (d_model,)
    bias: Any  # (d_model,) or None
    eps: float
    covers_residual: bool

    def to_cpu(self) -> Norm:
        """The same numbers on the CPU, in float32 at least (half precision upcast)."""
        bias = on_cpu(self.bias) if self.bias is not None else None
        return replace(self, gain=on_cpu(self.gain), bias=bias)

    def scale(self, u: Any) -> Any:
        """s(u) over the last dimension, as the model computes it (the divisor of u)."""
        if self.centre:
            return (u.var(dim=-1, unbiased=False, keepdim=True) + self.eps).sqrt()
        return (u.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt()


def norm_of(module: Any, covers_residual: bool) -> Norm:
    """A normalisation module's numbers: torch's LayerNorm, or an RMSNorm (Llama's
    `variance_epsilon`, Gemma's `eps` and gain 1 + weight)."""
    import torch

    if isinstance(module, torch.nn.LayerNorm):
        bias = module.bias.detach() if module.bias is not None else None
        return Norm(True, module.weight.detach(), bias, module.eps, covers_residual)
    eps = getattr(module, "variance_epsilon", None) or module.eps
    gain = module.weight.detach()
    if type(module).__name__.startswith("Gemma"):  # Gemma's RMSNorm multiplies by 1 + weight
        gain = 1.0 + gain
    return Norm(False, gain, None, float(eps), covers_residual)


def linear(module: Any) -> tuple[Any, Any]:
    """(W, b) with W of shape (in, out): nn.Linear stores (out, in), GPT-2's Conv1D (in, out);
    a bitsandbytes layer's 4- or 8-bit weight unpacked to floats."""
    import torch

    weight = module.weight
    if type(weight).__name__ in ("Params4bit", "Int8Params"):
        from transformers.integrations.bitsandbytes import dequantize_bnb_weight

        weight = dequantize_bnb_weight(weight, getattr(module, "state", None))
    if isinstance(module, torch.nn.Linear):
        weight = weight.detach().T
    else:
        weight = weight.detach()
    bias = module.bias.detach() if module.bias is not None else torch.zeros(weight.shape[1])
    return weight, bias


@contextmanager
def onloaded(model: Any, *modules: Any) -> Iterator[None]:
    """The weights of `modules` (and of their submodules) in place on the CPU while the context
    lasts, where accelerate keeps them on the disk, or on the CPU for a GPU, between forward
    passes: such a module's parameters are on the "meta" device outside its forward, and its
    AlignDevicesHook (its own, or an ancestor's that places its submodules) loads them from
    its weights map, as forward would. Nothing happens for a model accelerate did not place."""
    if not getattr(model, "hf_device_map", None):
        yield
        return
    from accelerate.utils import align_module_device, has_offloaded_params

    named = dict(model.named_modules())
    names = {id(module): name for name, module in named.items()}
    wanted: set[str] = set()
    for module in modules:
        name = names[id(module)]
        parts = name.split(".") if name else []
        wanted.update(".".join(parts[:i]) for i in range(len(parts)))  # its ancestors
        wanted.update(inner for inner, _ in module.named_modules(prefix=name))  # and itself
    with ExitStack() as stack:
        for name in sorted(wanted):  # ancestors first: a hook that places submodules
            if has_offloaded_params(named[name]):
                stack.enter_context(align_module_device(named[name], "cpu"))
        yield


def separate(n_heads: int, q: Any, k: Any, v: Any, o: Any) -> LayerWeights:
    """The weights of a layer with separate Q, K, V and O projections (one head per column
    block, no extras)."""
    (w_q, b_q), (w_k, b_k), (w_v, b_v), (w_o, b_o) = (linear(m) for m in (q, k, v, o))
    return LayerWeights(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, n_heads)


def rope(config: Any, head_dim: int, layer_type: str | None = None) -> Rope:
    """RoPE's frequencies: computed here from rope_theta for the default RoPE (partial for
    Phi-3's partial_rotary_factor and GPT-NeoX's rotary_pct); other static kinds (linear,
    llama3, yarn) from transformers' own table; RoPE that changes with the length is refused.
    `layer_type` names the parameters of a model whose kinds of layer have their own
    (ModernBERT: `full_attention` and `sliding_attention`, each with its own base)."""
    import torch

    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None:
        params = params[layer_type]
    kind = params.get("rope_type", "default")
    if kind == "default":
        rotary = int(head_dim * params.get("partial_rotary_factor", 1.0))
        exponents = torch.arange(0, rotary, 2, dtype=torch.int64).float() / rotary
        return Rope(inv_freq=1.0 / params["rope_theta"] ** exponents)
    if kind in ("linear", "llama3", "yarn"):
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        of_layer = {} if layer_type is None else {"layer_type": layer_type}
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](config, "cpu", **of_layer)
        return Rope(inv_freq=inv_freq, scaling=float(scaling))
    raise UnsupportedModelError(
        f"RoPE of type '{kind}' changes with the text's length; check supports default, linear, "
        "llama3 and yarn RoPE"
    )
