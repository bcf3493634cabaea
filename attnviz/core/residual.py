"""How an attention block's output joins the residual stream, which ALTI and the mixing
ratios need (`analysis.contributions`): the stream r_i the block's output is added to, and the
normalisation after the block, if any.

Where attnviz knows the model's family, the layer map names them (`families.norm_after`).
For any other model they are read from the model itself, not from a table of names: one pass
over four tokens with every module of each layer traced (`capture.trace`), the first time a
model is asked. The stream is the layer's input, and the block's output (after W_O) is

- added to it as it is: a norm before the block reads the layer's input (pre-LN: Llama,
  GPT-NeoX, OPT, ModernBERT);
- normalised alone, then added: a norm after the block reads the block's output (Gemma 2 and
  3, OLMo 2);
- normalised with it: a norm after the block reads block + stream (post-LN: BERT, ERNIE).

Each form is checked as it is read: the layer's output less the stream and the block's part
is what one of its later modules wrote (the feed-forward's; a scaled residual fails this), and
the norm's numbers remake its output. A layer that passes no check is refused in one line.
"""

from __future__ import annotations

from typing import Any

from attnviz.core import families
from attnviz.core.families.base import Norm, norm_of
from attnviz.errors import UnsupportedModelError


def norm_after(model: Any, layer: int, stack: str | None = None) -> Norm | None:
    """The normalisation after `layer`'s attention block, as numbers on the CPU (float32 at
    least), or None where the block's output is added to the stream as it is: the family's,
    else what `around` reads from the model (a one-line UnsupportedModelError where it cannot
    tell)."""
    if families.knows(model):
        return families.norm_after(model, layer, stack)
    if stack is not None:
        raise UnsupportedModelError("the norms around a block are read for one-stack models")
    return around(model, layer)


# What may normalise around a block: a module whose class name says so, or, before the block,
# an identity where a layer skips its norm (ModernBERT's first layer)
def _is_norm(module: Any) -> bool:
    return "Norm" in type(module).__name__ or type(module).__name__ == "Identity"


def around(model: Any, layer: int) -> Norm | None:
    """How `layer`'s block joins the residual stream, read once a model from one pass over
    four tokens with hooks on the layer and every module in it: None where the block's
    output is added to the stream (the layer's input) as it is (pre-LN), else the norm after
    the block, of the block alone (Gemma 2 and 3, OLMo 2) or of block + stream (post-LN:
    BERT; `Norm.covers_residual`). Each form is checked as it is read: the
    layer's output less the stream and the block's (normalised) output is what one of its
    later modules wrote (the feed-forward's), and the normalisation's numbers remake its
    output. A one-line UnsupportedModelError where the layer fits none of the forms. Only the
    model's answer is remembered: a pass that runs out of memory, or a Ctrl-C, rises and is
    asked again next time."""
    found = getattr(model, "_attnviz_around", None)
    if found is None:
        found = model._attnviz_around = _probe(model)
    got = found[layer]
    if isinstance(got, str):
        raise UnsupportedModelError(got)
    return got


def _probe(model: Any) -> dict[int, Norm | None | str]:
    """`around` of every layer of a one-stack model, or why not (a string)."""
    from attnviz.core import capture
    from attnviz.core.layer_map import generic

    kind = model.config.model_type
    if model.config.is_encoder_decoder:
        reason = "ALTI and the mixing ratios compose one stack's layers"
        return {layer: reason for layer in range(len(generic.callers(model, "encoder")))}
    found_callers = generic.callers(model)
    holders = [generic.layer_of(model, caller) for caller in found_callers]
    try:
        seen = capture.trace(model, [holder for holder in holders if holder is not None])
    except (TypeError, ValueError, IndexError, RuntimeError) as error:
        if not _refused_by_model(error):
            raise  # this moment's failure, not the model's answer: nothing is remembered
        said = str(error).splitlines()[0] if str(error) else ""
        reason = (f"attnviz could not read how '{kind}' adds attention to the residual stream "
                  f"(a pass over four tokens failed: {type(error).__name__}: {said})")  # fmt: skip
        return {layer: reason for layer in range(len(holders))}
    found = {}
    for layer, (caller, holder) in enumerate(zip(found_callers, holders)):
        projection = generic.output_projection(model, layer)
        calls = seen.get(id(holder), []) if holder is not None else []
        found[layer] = _form(kind, layer, calls, holder, caller, projection)
    return found


def _refused_by_model(error: Exception) -> bool:
    """Whether the pass over four tokens failed for the model's own reason (it needs other
    inputs, its shapes do not take these: a TypeError, ValueError, IndexError or
    RuntimeError), which `around` remembers; not where memory ran out, on a GPU or in the
    CPU's allocator (a RuntimeError too), which may pass on another try."""
    import torch

    if isinstance(error, torch.OutOfMemoryError):
        return False
    return not (isinstance(error, RuntimeError) and "can't allocate memory" in str(error))


def _close(a: Any, b: Any) -> bool:
    import torch

    if a is None or b is None or a.numel() != b.numel():
        return False
    a, b = a.float().reshape(b.shape), b.float()  # OPT's feed-forward reads (B·T, d)
    near = (a - b).abs().max() <= 1e-4 * (b.abs().max() + 1e-6)
    return bool(near) and bool(torch.isfinite(a).all())


def _form(
    kind: str, layer: int, calls: list, holder: Any, caller: Any, projection: Any
) -> Norm | None | str:
    """`layer`'s norm after the block (None: none) from its calls [(module, order, input,
    output)], or why not (a string)."""
    refused = (
        f"attnviz cannot tell how layer {layer} of '{kind}' adds its attention's output "
        "to the residual stream (not pre-LN, post-LN or a norm of the block alone)"
    )
    own = [call for call in calls if call[0] is holder]
    at = [call for call in calls if call[0] is caller]
    made = [call for call in calls if call[0] is projection]
    if len(own) != 1 or len(at) != 1 or len(made) != 1 or projection is None:
        return refused
    stream, out, start = own[0][2], own[0][3], at[0][1]
    block = made[0][3]
    if stream is None or out is None or block is None or stream.shape != block.shape:
        return refused  # MobileBERT: bottlenecks between the stream and the block
    norms = [call for call in calls if call[0] is not holder and _is_norm(call[0])]
    before = any(c[1] < start and _close(c[2], stream) for c in norms)
    after = [c for c in norms if c[1] > start and type(c[0]).__name__ != "Identity"]
    alone = next((c for c in after if _close(c[2], block)), None)
    summed = next((c for c in after if _close(c[2], stream + block)), None)
    if alone is not None:
        form, joined = (alone[0], False), stream + alone[3]
    elif before:
        form, joined = None, stream + block
    elif summed is not None:
        form, joined = (summed[0], True), None  # the stream is the norm's output
    else:
        return refused
    if joined is not None:  # what the rest of the layer added is one later module's output
        rest = out - joined
        if not any(c[1] > start and c[0] is not holder and _close(c[3], rest) for c in calls):
            return refused
    if form is None:
        return None
    module, covers = form
    call = alone if not covers else summed
    try:
        norm = norm_of(module, covers)
        remade = _close(_normalised(norm, call[2]), call[3])
    except (AttributeError, TypeError, RuntimeError):
        remade = False
    if not remade:
        return (f"layer {layer} of '{kind}' normalises with a {type(module).__name__} whose "
                "numbers attnviz does not remake (not a LayerNorm or RMSNorm)")  # fmt: skip
    return norm.to_cpu()


def _normalised(norm: Norm, u: Any) -> Any:
    """What `norm` makes of u (the check that its numbers are the module's)."""
    u = u.float()
    centred = u - u.mean(dim=-1, keepdim=True) if norm.centre else u
    found = norm.gain.float() * centred / norm.scale(u)
    return found + norm.bias.float() if norm.bias is not None else found
