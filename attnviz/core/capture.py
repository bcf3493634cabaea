"""The one place attnviz runs a model with hooks: one forward pass over a batch hands each
caller, layer by layer, exactly the tensors it asked for.

What a caller can ask for, per layer (`KINDS`):

    input   X (B, T, d_model): the attention block's input (a pre-LN decoder's X is already
            normalised; a post-LN encoder's is the previous layer's output)
    probs   (B, H, T, T): the attention probabilities, every row summing to 1
    output  (B, T, d_model): the block's output after W_O, before residual and normalisation
    residual (B, T, d_model): the residual stream the block's output is added to (X itself in
            a post-LN encoder; in a pre-LN decoder the stream before its input norm)
    heads   (B, T, H·d_head): W_O's input, the heads' outputs side by side (head h's slice is
            h·d_head … (h+1)·d_head); grouped-query models have one slice per query head

A caller is a `Recorder`: the layers and kinds it wants, and a `receive(layer, tensors)`
called once that layer has produced all of them. Tensors are moved to the CPU as they come
and dropped once every recorder that wanted them has had them, so a long text's layers are
never all held at once (30 layers × 9 heads × 2,048² floats is 4.5 GB). Several recorders
share one pass: `show --html` gets its weights and the inside view's inputs from one run.

An `edit` changes the model as it runs (head ablation and gates, `analysis.importance`): it
gets each layer's W_O input (B, T, H·d_head) and returns what W_O reads instead; with
`gradients`, the pass records a graph so that a loss can be differentiated with respect to
tensors the edit used (the gates), and no weight changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from attnviz.core import adapters
from attnviz.core.adapters.base import LayerModules

KINDS = ("input", "probs", "output", "residual", "heads")

# What an edit is: (layer, W_O input (B, T, H·d_head)) -> the tensor W_O reads instead.
Edit = Callable[[int, Any], Any]


class Recorder(Protocol):
    """What one caller of `run` wants, and where its tensors go."""

    wants: Mapping[int, Sequence[str]]  # layer -> kinds, from KINDS

    def receive(self, layer: int, tensors: dict[str, Any]) -> None: ...


@dataclass
class Each:
    """A recorder from a function: `receive(layer, {kind: tensor})` for each of `layers`."""

    layers: Sequence[int]
    kinds: Sequence[str]
    receive: Callable[[int, dict[str, Any]], None]

    @property
    def wants(self) -> dict[int, Sequence[str]]:
        return {layer: self.kinds for layer in self.layers}


def run(
    loaded: Any,
    inputs: dict[str, Any],
    recorders: Sequence[Recorder],
    lm_head: bool = False,
    edit: Edit | None = None,
    gradients: bool = False,
) -> Any:
    """Run `loaded`'s model once over `inputs` (padded ids and mask, see `tokens.pad`), feeding
    every recorder, and return the model's output.

    Without `lm_head` only the base model runs (no logits over the vocabulary); with it, the
    whole model, for callers that need the loss. `edit` replaces each layer's W_O input as
    the model runs; `gradients` runs with autograd on (for gates inside `edit`).
    """
    import torch

    model = loaded.model
    wanted: dict[int, set[str]] = {}
    for recorder in recorders:
        for layer, kinds in recorder.wants.items():
            unknown = set(kinds) - set(KINDS)
            if unknown:
                raise ValueError(f"unknown capture kinds {sorted(unknown)}; known: {KINDS}")
            wanted.setdefault(layer, set()).update(kinds)
    seen: dict[int, dict[str, Any]] = {}

    def arrive(kind: str, layer: int, tensor: Any) -> None:
        got = seen.setdefault(layer, {})
        got[kind] = tensor.detach().cpu()
        if got.keys() < wanted[layer]:
            return
        for recorder in recorders:
            kinds = recorder.wants.get(layer)
            if kinds:
                recorder.receive(layer, {kind: got[kind] for kind in kinds})
        del seen[layer]  # every recorder has had this layer's tensors

    mode = torch.enable_grad() if gradients else torch.inference_mode()
    with _hooked(model, wanted, arrive, edit), mode:
        return (model if lm_head else model.base_model)(**inputs)


@contextmanager
def _hooked(
    model: Any,
    wanted: Mapping[int, set[str]],
    arrive: Callable[[str, int, Any], None],
    edit: Edit | None = None,
) -> Iterator[None]:
    """Hooks that pass each wanted (kind, layer) tensor to `arrive` as the layer runs, and
    one that lets `edit` replace each layer's W_O input.

    Modules shared by several layers (ALBERT) are called once per layer, in order, so the
    n-th call of a shared module belongs to the n-th layer that uses it.
    """
    modules = [
        adapters.layer_modules(model, layer) for layer in range(model.config.num_hidden_layers)
    ]
    handles = []

    every_layer = list(range(len(modules)))

    def install(
        layers_of: Sequence[int], pick: Callable[[LayerModules], Any], before: bool, act: Callable
    ) -> None:
        """Hook the module `pick` names; `act(layer, args, output)` runs for `layers_of`, and
        what it returns (None: nothing) replaces the module's input or output."""
        if not layers_of:
            return
        users: dict[int, list[int]] = {}  # id(module) -> the layers that call it, in order
        for layer, mods in enumerate(modules):
            users.setdefault(id(pick(mods)), []).append(layer)
        calls: dict[int, int] = {}

        def hook(module, args, output=None):
            n = calls.get(id(module), 0)
            calls[id(module)] = n + 1
            layer = users[id(module)][n % len(users[id(module)])]
            if layer in layers_of:
                return act(layer, args, output)
            return None

        for module in {id(pick(m)): pick(m) for m in modules}.values():
            register = module.register_forward_pre_hook if before else module.register_forward_hook
            handles.append(register(hook))

    def record(kind: str, pick: Callable[[LayerModules], Any], before: bool, take: Callable):
        def act(layer: int, args: Any, output: Any) -> None:
            arrive(kind, layer, take(args, output))

        install([layer for layer, kinds in wanted.items() if kind in kinds], pick, before, act)

    def first(args: Any, _: Any) -> Any:
        return args[0]

    record("input", lambda m: m.q, True, first)
    record("output", lambda m: m.o, False, lambda _, output: output)
    record("residual", lambda m: m.q if m.residual is None else m.residual, True, first)
    # Every supported attention module returns (output, probabilities) in eager mode.
    record("probs", lambda m: m.attention, False, lambda _, output: output[1])
    record("heads", lambda m: m.o, True, lambda args, _: args[0])
    if edit is not None:
        # After "heads": a recorder sees what the heads computed, W_O what the edit made of it.
        install(every_layer, lambda m: m.o, True, lambda layer, args, _: (edit(layer, args[0]),))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
