"""Reading attention layers out of loaded Hugging Face models, one adapter per architecture.

Each adapter (a module here, see `base` for what it provides) names a layer's attention
module, its input and output projections, and turns its weights into the `X @ W + b`
convention of `attnviz.core.mha`. A new architecture is one new module plus one line in FAMILIES.
The hooks below use the adapters to hand on, layer by layer during a forward pass, exactly
the tensors a command needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from attnviz.core.adapters import albert, bert, distilbert, gpt2, llama, phi3
from attnviz.core.adapters.base import LayerModules
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


def layer_weights(model: Any, layer: int) -> LayerWeights:
    """The weights of `layer` as `X @ W + b` (see `attnviz.core.mha.LayerWeights`), or a one-line
    UnsupportedModelError naming what the from-scratch attention does not compute."""
    return _family(model).weights(model, layer)


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
def each_layer(
    model: Any,
    layers: list[int],
    on_layer: Callable[[int, dict[str, Any]], None],
    kinds: tuple[str, ...] = ("input", "output", "probs"),
) -> Iterator[None]:
    """During the forward passes inside, call `on_layer(layer, {kind: tensor})` once each
    of `layers` has handed on all its `kinds` (moved to the CPU), then drop them: a long
    text's layers are never all held at once. Architectures differ in which comes first."""
    seen: dict[str, dict[int, Any]] = {kind: {} for kind in kinds}

    def receiver(kind: str) -> Receiver:
        def receive(layer: int, tensor: Any) -> None:
            seen[kind][layer] = tensor.cpu()
            if all(layer in got for got in seen.values()):
                on_layer(layer, {k: seen[k].pop(layer) for k in kinds})

        return receive

    with hooked(model, layers, **{f"on_{kind}": receiver(kind) for kind in kinds}):
        yield
