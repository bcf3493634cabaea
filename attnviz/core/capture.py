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
    source  (B, S, d_model): what the keys and values are made of: X itself in
            self-attention, the encoder's last hidden states in cross-attention

An encoder-decoder model (T5, BART) has three stacks of attention layers, "encoder",
"decoder" and "cross" (`adapters.STACKS`); a recorder's `stack` says which one its layers
are in (every other model has one stack, None).

    rows    blocks of `probs`' query rows, for callers that keep running sums and never
            hold a layer's whole matrix: such a recorder's `receive_rows(layer, start, rows)`
            gets rows start … start+b−1 of every head, (B, H, b, W), block after block,
            after its `receive` has had the layer's other kinds it asked for; W ≤ S keys
            (a decoder's block stops at its last query: the later keys hold 0)
    entropy with `rows`: each row's entropy −Σ p ln p too, (B, H, b) float32, handed as
            `receive_rows(layer, start, rows, entropy)`; recomputed rows take it from their
            softmax's own sums (`recompute.rows_and_entropy`), no logarithm per cell

The model runs its own attention implementation. With eager attention `probs` is read from
the attention module; with any other (SDPA, the default) the module keeps none, and
`probs` and `rows` are recomputed from the layer's captured X by `core.recompute`, a block
of `block_rows` query rows at a time.

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
from attnviz.errors import InputError, UnsupportedModelError

KINDS = ("input", "probs", "output", "residual", "heads", "source")
ROWS = "rows"  # blocks of probability rows, for a recorder with `receive_rows` (see above)
ENTROPY = "entropy"  # with ROWS: each row's entropy beside it (see above)

# What an edit is: (layer, W_O input (B, T, H·d_head)) -> the tensor W_O reads instead.
Edit = Callable[[int, Any], Any]


class Recorder(Protocol):
    """What one caller of `run` wants, and where its tensors go (a recorder may also have a
    `stack`: which stack of an encoder-decoder model its layers are in)."""

    wants: Mapping[int, Sequence[str]]  # layer -> kinds, from KINDS

    def receive(self, layer: int, tensors: dict[str, Any]) -> None: ...


@dataclass
class Each:
    """A recorder from a function: `receive(layer, {kind: tensor})` for each of `layers`."""

    layers: Sequence[int]
    kinds: Sequence[str]
    receive: Callable[[int, dict[str, Any]], None]
    stack: str | None = None

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
    block_rows: int | None = None,
) -> Any:
    """Run `loaded`'s model once over `inputs` (padded ids and mask, see `tokens.pad`), feeding
    every recorder, and return the model's output.

    Without `lm_head` only the base model runs (no logits over the vocabulary); with it, the
    whole model, for callers that need the loss. `edit` replaces each layer's W_O input as
    the model runs; `gradients` runs with autograd on (for gates inside `edit`); `block_rows`
    is how many query rows each block of recomputed probabilities holds: given, the run is a
    streamed one (`memory.stream_rows`), whose freed blocks the allocator keeps for the next
    (`memory.reuse_freed_blocks`).
    """
    import torch

    from attnviz.core import memory
    from attnviz.core.recompute import BLOCK_ROWS

    if block_rows is not None:
        memory.reuse_freed_blocks()

    model = loaded.model
    stacks = adapters.stacks_of(model)
    wanted: dict[Site, set[str]] = {}
    for recorder in recorders:
        if _stack(recorder) not in stacks:  # a one-stack caller on an encoder-decoder model
            raise UnsupportedModelError(
                f"this reads models with one attention stack; {loaded.info.name} is an "
                "encoder-decoder model (docs/seq2seq.md says what works on it)"
            )
        for layer, kinds in recorder.wants.items():
            unknown = set(kinds) - {*KINDS, ROWS, ENTROPY}
            if unknown:
                raise ValueError(f"unknown capture kinds {sorted(unknown)}; known: {KINDS}")
            if {"probs", ROWS} <= set(kinds):
                raise ValueError("a recorder takes a layer's probabilities whole or in rows")
            wanted.setdefault((_stack(recorder), layer), set()).update(kinds)
    probabilities = _Probabilities(loaded, inputs, BLOCK_ROWS if block_rows is None else block_rows)
    hooked = {site: probabilities.needs(site, kinds) for site, kinds in wanted.items()}
    seen: dict[Site, dict[str, Any]] = {}

    def arrive(kind: str, site: Site, tensor: Any) -> None:
        got = seen.setdefault(site, {})
        got[kind] = tensor.detach().cpu()
        if got.keys() < hooked[site]:
            return
        stack, layer = site
        mine = [r for r in recorders if _stack(r) == stack and r.wants.get(layer)]
        # a `rows` recorder has its layer's other tensors (X, say) before the blocks; the
        # others have theirs after, `probs` among them where it was assembled from blocks
        takers = [r for r in mine if ROWS in r.wants[layer]]
        for recorder in takers:
            recorder.receive(
                layer, {k: got[k] for k in recorder.wants[layer] if k not in (ROWS, ENTROPY)}
            )
        if wanted[site] & {"probs", ROWS}:
            probabilities.hand_out(site, got, wanted[site], mine)
        for recorder in mine:
            if recorder not in takers:
                recorder.receive(layer, {kind: got[kind] for kind in recorder.wants[layer]})
        del seen[site]  # every recorder has had this layer's tensors

    mode = torch.enable_grad() if gradients else torch.inference_mode()
    with _hooked(model, hooked, arrive, edit), mode:
        output = (model if lm_head else model.base_model)(**inputs)
    memory.return_freed_memory()  # the pass's activations, not held while the figures draw
    return output


Site = tuple  # (stack, layer): a layer of one attention stack (stack None: the only one)


def recomputes(model: Any) -> bool:
    """Whether `model` runs an attention that keeps no probabilities (SDPA, flash), so that
    capture recomputes them from each layer's X."""
    return getattr(model.config, "_attn_implementation", "eager") != "eager"


@contextmanager
def own_probabilities(model: Any) -> Iterator[None]:
    """`model` runs eager attention for the duration, so that `probs` are the model's own
    (what `check` compares with), not recomputed; its own implementation after."""
    before = model.config._attn_implementation if recomputes(model) else None
    if before is not None:
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if before is not None:
            model.set_attn_implementation(before)


class _Probabilities:
    """Where a run's `probs` and `rows` come from: the attention module's output (eager), or
    each layer's X, recomputed in blocks of rows (`core.recompute`)."""

    def __init__(self, loaded: Any, inputs: dict[str, Any], block_rows: int) -> None:
        if block_rows < 1:
            raise InputError(f"block_rows must be at least 1, not {block_rows}")
        self.loaded, self.block_rows = loaded, block_rows
        self.recompute = recomputes(loaded.model)
        source = inputs.get("attention_mask")
        target = inputs.get("decoder_attention_mask")
        self.key_masks = {None: source, "encoder": source, "cross": source, "decoder": target}

    def needs(self, site: Site, kinds: set[str]) -> set[str]:
        """The kinds to hook at `site` for `kinds`: probabilities become the layer's X (and
        cross-attention's source) when they are recomputed; `rows` are cut from `probs`."""
        needed = set(kinds) - {ROWS, ENTROPY}
        if kinds & {"probs", ROWS}:
            needed.add("probs")
            if self.recompute:
                needed.discard("probs")
                needed.add("input")
                if site[0] == "cross":
                    needed.add("source")
        return needed

    def hand_out(self, site: Site, got: dict[str, Any], kinds: set[str], mine: list) -> None:
        """Give each `rows` recorder of `site` its blocks, and put the whole matrix in
        got["probs"] where a recorder wants it and it was recomputed; float32 either way."""
        import torch

        from attnviz.core import recompute

        layer = site[1]
        takers = [r for r in mine if ROWS in r.wants[layer]]
        entropy = any(ENTROPY in r.wants[layer] for r in takers)
        if not self.recompute:
            # (B, H, T, S) from the attention module, in float32 whatever the model runs in (a
            # half-precision model's own probabilities, rounded in its dtype)
            whole = got["probs"] = got["probs"].float()
            found: Any = (
                (start, part, torch.special.entr(part).sum(dim=-1) if entropy else None)
                for start in range(0, whole.shape[2], self.block_rows)
                for part in [whole[:, :, start : start + self.block_rows]]
            )
            keep = None
        else:
            projected = self._project(site, got)
            found = recompute.blocks(projected, self.block_rows, entropy)
            keep = torch.zeros(projected.shape) if "probs" in kinds else None
        for start, rows, entropies in found if takers or keep is not None else ():
            for recorder in takers:
                if ENTROPY in recorder.wants[layer]:
                    recorder.receive_rows(layer, start, rows, entropies)
                else:
                    recorder.receive_rows(layer, start, rows)  # (B, H, b, S)
            if keep is not None:  # a decoder's block stops at its last query's key
                keep[:, :, start : start + rows.shape[2], : rows.shape[3]] = rows
        if keep is not None:
            got["probs"] = keep

    def _project(self, site: Site, got: dict[str, Any]) -> Any:
        from attnviz.core import adapters, recompute

        stack, layer = site
        mask = self.key_masks[stack]
        weights = adapters.layer_weights(self.loaded.model, layer, stack)
        return recompute.project(
            got["input"],
            weights,
            mask.cpu() if mask is not None else None,
            self.loaded.info.of_stack(stack).causal,
            got.get("source") if stack == "cross" else None,
        )


def _stack(recorder: Recorder) -> str | None:
    return getattr(recorder, "stack", None)


@contextmanager
def _hooked(
    model: Any,
    wanted: Mapping[Site, set[str]],
    arrive: Callable[[str, Site, Any], None],
    edit: Edit | None = None,
) -> Iterator[None]:
    """Hooks that pass each wanted (kind, site) tensor to `arrive` as the layer runs, and
    one that lets `edit` replace each layer's W_O input.

    Modules shared by several layers (ALBERT) are called once per layer, in order, so the
    n-th call of a shared module belongs to the n-th layer that uses it.
    """
    sites: list[tuple[Site, LayerModules]] = [
        ((stack, layer), adapters.layer_modules(model, layer, stack))
        for stack in adapters.stacks_of(model)
        for layer in range(adapters.n_layers(model, stack))
    ]
    if edit is not None and sites[0][0][0] is not None:
        raise ValueError("edits (head ablation, gates) are for models with one attention stack")
    handles = []

    def install(
        sites_of: Sequence[Site], pick: Callable[[LayerModules], Any], before: bool, act: Callable
    ) -> None:
        """Hook the module `pick` names; `act(site, mods, args, output)` runs for `sites_of`,
        and what it returns (None: nothing) replaces the module's input or output."""
        if not sites_of:
            return
        users: dict[int, list[tuple]] = {}  # id(module) -> the sites that call it, in order
        for site, mods in sites:
            users.setdefault(id(pick(mods)), []).append((site, mods))
        calls: dict[int, int] = {}

        def hook(module, args, output=None):
            n = calls.get(id(module), 0)
            calls[id(module)] = n + 1
            callers = users[id(module)]
            site, mods = callers[n % len(callers)]
            if site in sites_of:
                return act(site, mods, args, output)
            return None

        for module in {id(pick(m)): pick(m) for _, m in sites}.values():
            register = module.register_forward_pre_hook if before else module.register_forward_hook
            handles.append(register(hook))

    def record(kind: str, pick: Callable[[LayerModules], Any], before: bool, take: Callable):
        def act(site: Site, mods: LayerModules, args: Any, output: Any) -> None:
            arrive(kind, site, take(mods, args, output))

        install([site for site, kinds in wanted.items() if kind in kinds], pick, before, act)

    def first(_: LayerModules, args: Any, __: Any) -> Any:
        return args[0]

    record("input", lambda m: m.q, True, first)
    record("output", lambda m: m.o, False, lambda _, __, output: output)
    record("residual", lambda m: m.q if m.residual is None else m.residual, True, first)
    record("probs", lambda m: m.attention, False, lambda mods, _, output: output[mods.probs_at])
    record("heads", lambda m: m.o, True, first)
    record("source", lambda m: m.q if m.source is None else m.source, True, first)
    if edit is not None:
        # After "heads": a recorder sees what the heads computed, W_O what the edit made of it.
        install(
            [site for site, _ in sites],
            lambda m: m.o,
            True,
            lambda site, _, args, __: (edit(site[1], args[0]),),
        )
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
