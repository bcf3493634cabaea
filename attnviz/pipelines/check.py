"""`attnviz check`: recompute real layers with the from-scratch MHA and compare them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attnviz.analysis.check import CheckResult, LayerCheck, compare, tolerance_for
from attnviz.errors import InputError
from attnviz.pipelines import checks

if TYPE_CHECKING:
    from attnviz.core.attention import Encoded, SourceTarget
    from attnviz.core.capture import Each
    from attnviz.core.model_info import LoadedModel, ModelInfo, ModelSpec
    from attnviz.pipelines.request import CheckRequest

Shapes = tuple  # ((step, formula, shape), …) of one layer, as `MHAResult.shapes`


def check_layers(
    loaded: LoadedModel, batch: Sequence[Encoded], layers: list[int]
) -> tuple[list[LayerCheck], Shapes]:
    """Run the model once on a (padded) batch and check each chosen layer against our MHA.

    Each layer is checked as soon as the forward pass has produced its input, probabilities
    and output, and those are dropped: a long text's layers are never all held at once.
    A batch of pictures (`core.images.encode_picture`: one size, no padding) has every token
    real.
    """
    import torch

    from attnviz.core import capture
    from attnviz.core.tokens import pad

    inputs = pad(loaded, batch)
    if "attention_mask" in inputs:
        mask = inputs["attention_mask"].cpu()
    else:  # pictures: every token is one of the picture's
        mask = torch.ones(len(batch), len(batch[0]), dtype=torch.long)
    checks: dict[tuple, LayerCheck] = {}
    shapes: dict[str | None, Shapes] = {}
    width = mask.shape[1]
    if in_blocks(loaded, len(batch), width):
        capture.run(loaded, inputs, _InBlocks(loaded, layers, mask, checks, shapes).recorders())
    else:
        recorder = _checker(loaded, None, layers, (mask, mask), checks, shapes)
        with capture.own_probabilities(loaded.model):  # the model's own, not recomputed
            capture.run(loaded, inputs, [recorder])
    return [checks[None, layer] for layer in layers], shapes.get(None, ())


def in_blocks(loaded: LoadedModel, n_batch: int, width: int) -> bool:
    """Whether `check` reads a layer's probabilities in blocks of rows from attnviz's
    attention function (the model's own q and k, as `show` records them) rather than whole
    from the model's eager attention: where one layer's maps would take more than
    `memory.CHECK_WHOLE_LAYER` (eager holds them, its scores and our float64 copy at once)."""
    from attnviz.core import capture, memory

    return memory.check_in_blocks(loaded.info.n_heads, width, n_batch) and capture.records(
        loaded.model
    )


class _InBlocks:
    """A capture recorder that checks each of `layers` a block of query rows at a time: our
    K_h and V_h are made from the layer's input (`mha.RowBlocks`), each block of the model's
    rows is compared with ours as the pass hands it out, and the layer's output once it has
    come (`recorders()`: this, and one for the outputs). No layer's whole map is held."""

    def __init__(
        self,
        loaded: LoadedModel,
        layers: list[int],
        mask: Any,
        checks: dict[tuple, LayerCheck],
        shapes: dict[str | None, Shapes],
    ) -> None:
        from attnviz.core import capture, families

        families.layer_weights(loaded.model, 0, None)  # a family check cannot read: refused now
        self.loaded, self.layers, self.checks, self.shapes = loaded, layers, checks, shapes
        self.wants = {layer: ("input", capture.ROWS) for layer in layers}
        self.mask, self.real = mask, mask.bool()  # (B, T): padded query rows are no text's
        self.ours: Any = None
        self.errors: Any = None

    def recorders(self) -> list[Any]:
        from attnviz.core import capture

        return [self, capture.Each(self.layers, ("output",), self.finish)]

    def receive(self, layer: int, seen: dict[str, Any]) -> None:
        """The layer's input: our K_h and V_h, before its first block."""
        import torch

        from attnviz.core import families
        from attnviz.core.mha import RowBlocks

        weights = families.layer_weights(self.loaded.model, layer, None)
        self.ours = RowBlocks(seen["input"], weights, self.mask, self.loaded.info.causal)
        self.errors = torch.zeros(self.ours.w.n_heads, dtype=torch.float64)
        self.shapes[None] = self.ours.shapes()

    def receive_rows(self, layer: int, first: int, model_rows: Any) -> None:
        """Rows first … first+b−1 of every head, (B, H, b, W), against ours."""
        import torch

        b, width = model_rows.shape[2], model_rows.shape[3]  # W: a causal block's last key
        ours = self.ours.rows(first, first + b)  # (B, H, b, S)
        kept = ~self.real[:, None, first : first + b, None]
        worst = (model_rows.double() - ours[..., :width]).abs().masked_fill(kept, 0)
        beyond = ours[..., width:].abs().masked_fill(kept, 0)  # ours past it: 0 when causal
        for part in (worst, beyond):
            if part.numel():
                self.errors = torch.maximum(self.errors, part.amax(dim=(0, 2, 3)))

    def finish(self, layer: int, seen: dict[str, Any]) -> None:
        """The layer's output against ours, once every block has come."""
        real = self.real[:, :, None]
        output = seen["output"].double().masked_fill(~real, 0)  # (B, T, d_model)
        diff = (output - self.ours.output()).abs().masked_fill(~real, 0)
        output_error = diff.max() / max(1.0, float(output.abs().max()))
        head_errors = tuple(float(e) for e in self.errors)
        self.checks[None, layer] = LayerCheck(layer, head_errors, float(output_error))
        self.ours = self.errors = None


def check_stacks(
    loaded: LoadedModel, batch: Sequence[SourceTarget], layers: Mapping[str, list[int]]
) -> tuple[dict[str, list[LayerCheck]], dict[str, Shapes]]:
    """Run an encoder-decoder model once on (padded) sources and targets and check the
    chosen layers of each stack ({stack: layers}) against our MHA, as `check_layers` does.

    Encoder self-attention: source queries and keys; decoder self-attention: target queries
    and keys, causal; cross-attention: target queries, keys and values from the encoder's
    last hidden states, the source's padding masked.
    """
    from attnviz.core import capture
    from attnviz.core.seq2seq import pad_pairs

    inputs = pad_pairs(loaded, batch)
    source = inputs["attention_mask"].cpu()
    target = inputs["decoder_attention_mask"].cpu()
    masks = {"encoder": (source, source), "decoder": (target, target), "cross": (target, source)}
    checks: dict[tuple, LayerCheck] = {}
    shapes: dict[str | None, Shapes] = {}
    recorders = [
        _checker(loaded, stack, chosen, masks[stack], checks, shapes)
        for stack, chosen in layers.items()
    ]
    with capture.own_probabilities(loaded.model):  # the model's own, not recomputed
        capture.run(loaded, inputs, recorders)
    found = {stack: [checks[stack, layer] for layer in chosen] for stack, chosen in layers.items()}
    return found, shapes


def _checker(
    loaded: LoadedModel,
    stack: str | None,
    layers: list[int],
    masks: tuple[Any, Any],
    checks: dict[tuple, LayerCheck],
    shapes: dict[str | None, Shapes],
) -> Each:
    """A capture recorder that checks each of `layers` of `stack` as the pass produces it,
    into checks[stack, layer]; `masks` are (queries, keys), each (B, T) 1 for real tokens."""
    from attnviz.core import capture, families
    from attnviz.core.mha import multi_head_attention

    query_mask, key_mask = masks
    causal = loaded.info.of_stack(stack).causal
    kinds = ("input", "probs", "output", *(("kv_input",) if stack == "cross" else ()))
    families.layer_weights(loaded.model, 0, stack)  # a family check cannot read: refused now

    def check_layer(layer: int, seen: dict[str, Any]) -> None:
        weights = families.layer_weights(loaded.model, layer, stack)
        source = seen.get("kv_input")  # cross-attention: the encoder's last hidden states
        ours = multi_head_attention(seen["input"], weights, key_mask, causal, source)
        checks[stack, layer] = compare(
            layer, seen["probs"], seen["output"], ours, query_mask, stack
        )
        shapes[stack] = ours.shapes

    return capture.Each(layers, kinds, check_layer, stack=stack)


def check(request: CheckRequest) -> CheckResult:
    """Recompute the chosen layers (default: all) of the model on `request.text` (or on
    `request.picture`, a vision model's) and compare.

    An encoder-decoder model reads the text as its source and `request.target` as the
    decoder's input (teacher forcing), or writes its own target greedily (`generate` tokens
    at most; the default without a target), and checks each of `request.stacks` (names from
    `layer_map.STACKS`, or "all", the default).
    """
    from attnviz.core.attention import require_text
    from attnviz.core.models import describe

    if request.picture is None:
        require_text(request.text)
    model = request.model()
    spec = describe(model.name)
    checks.against(request, spec)
    if spec is not None:
        _plan(spec, request)
        if request.picture is None:  # a picture's tokens are its processor's grid
            spec.check_length(request.text, request.truncate)
            _fits(spec, request)
    loaded = model.load()
    checks.against(request, loaded.info)
    plan = _plan(loaded.info, request)
    text, truncate, tolerance = request.text, request.truncate, request.tolerance
    if tolerance is None:  # the dtype's: a half-precision model's own numbers are rounded
        tolerance = tolerance_for(loaded.info.dtype)
    if not loaded.info.seq2seq:
        from attnviz.core.images import encode_picture
        from attnviz.core.tokens import encode

        if request.picture is not None:
            encoded = encode_picture(loaded, request.picture)
        else:
            encoded = encode(loaded, text, truncate)
        layer_checks, shapes = check_layers(loaded, [encoded], plan[None])
        return CheckResult(loaded.info, encoded.tokens, tolerance, tuple(layer_checks), shapes,
                           in_blocks=in_blocks(loaded, 1, len(encoded)))  # fmt: skip

    from attnviz.core.seq2seq import encode_source_target

    item = encode_source_target(loaded, text, request.target, request.generate, truncate)
    found, shapes = check_stacks(loaded, [item], plan)
    source, decoded = item.source.tokens, item.target.tokens
    parts = tuple(
        CheckResult(
            loaded.info.of_stack(stack),
            source if stack == "encoder" else decoded,
            tolerance,
            tuple(found[stack]),
            shapes[stack],
            stack=stack,
            key_tokens=source if stack == "cross" else None,
        )
        for stack in plan
    )
    every = tuple(lc for part in parts for lc in part.layers)
    return CheckResult(
        loaded.info, source, tolerance, every, (), stacks=parts, target_tokens=decoded
    )


def _fits(spec: ModelSpec, request: CheckRequest) -> None:
    """Refuse, one line, a check that would not fit in memory, from the model's files before
    it loads (`memory.check_estimate`: a long text's layers in blocks, a short one's whole)."""
    from attnviz.core import memory

    if spec.seq2seq or spec.tokenizer_file is None:
        return  # an encoder-decoder model's target is known once it is written
    (n_tokens,) = spec.count_lengths([request.text])
    if spec.max_tokens is not None:
        n_tokens = min(n_tokens, spec.max_tokens)
    # a model running eager (asked for, or its type's: `ModelSpec.eager_only`) is read whole
    blocks = memory.check_in_blocks(spec.n_heads, n_tokens) and not (
        request.load.implementation == "eager" or spec.eager_only
    )
    weights = request.load.weights_held(spec)
    found = memory.check_estimate(spec.n_heads, weights, n_tokens, blocks)
    memory.refuse_estimate(found, f"check of this text ({n_tokens:,} tokens)",
                           "read a shorter text")  # fmt: skip


def _plan(facts: ModelSpec | ModelInfo, request: CheckRequest) -> dict[str | None, list[int]]:
    """The layers to check in each stack ({None: layers} for a model with one stack), from
    the model's files before it loads and from the loaded model after; a layer a chosen
    stack lacks is refused."""
    from attnviz.core.layer_map import STACKS

    layers = list(request.layers) if request.layers else None
    if not facts.seq2seq:
        return {None: facts.pick_layers(layers)}
    plan = {}
    stacks = request.stacks
    for stack in STACKS if not stacks or "all" in stacks else stacks:
        try:
            plan[stack] = facts.of_stack(stack).pick_layers(layers)
        except InputError as error:
            raise InputError(f"{error} in its {stack} stack") from None
    return plan
