"""Attention extraction: texts in, one `[layer, head, query, key]` array per text out.

A pure step over the model (BertViz's `format_attention`, done as the forward pass runs):
the probabilities come from `capture`, each layer copied out as it is produced, and each
text's attention is cropped to its own tokens. An encoder-decoder model's source and target
give one Attention per stack (`attend_stacks`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.core.attention import Attention, Encoded, Keys, SourceTarget
from attnviz.core.held import NpyFile, zeroed
from attnviz.core.memory import held_bytes, held_what, require
from attnviz.core.tokens import encode, pad

if TYPE_CHECKING:
    from attnviz.core.capture import Edit, Recorder
    from attnviz.core.model_info import LoadedModel


class _Weights:
    """The recorder `attend` uses: each chosen layer's probabilities, block by block of query
    rows as the pass makes them, into one array (B, L, H, T, S), or into the `.npy` file
    `to` (`core.held`, one text): S is T except in cross-attention (of `stack`), where keys
    are the source. A decoder's blocks stop at their last query: its later keys hold 0."""

    def __init__(
        self,
        layers: list[int],
        n_batch: int,
        n_heads: int,
        width: int,
        key_width: int | None = None,
        stack: str | None = None,
        to: Path | None = None,
    ) -> None:

        from attnviz.core.capture import ROWS

        self.wants = {layer: (ROWS,) for layer in layers}
        self.stack = stack
        self.slot = {layer: i for i, layer in enumerate(layers)}
        keys = width if key_width is None else key_width
        shape = (n_batch, len(layers), n_heads, width, keys)
        self.file = NpyFile(to, shape) if to is not None else None
        if self.file is None:
            require(held_bytes(shape), held_what(shape))
        # zeros, not empty: the keys a causal block never reaches are 0 without being written
        self.held = zeroed(shape) if self.file is None else None

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        pass  # the rows alone, in `receive_rows`

    def receive_rows(self, layer: int, start: int, rows: Any) -> None:
        block = rows.float().numpy()  # (B, H, b, W)
        b, width = block.shape[2], block.shape[3]
        if self.file is not None:
            self.file.write(self.slot[layer], start, block[0])
        else:
            self.held[:, self.slot[layer], :, start : start + b, :width] = block

    def close(self) -> Any:
        """The weights held: the array, or the file renamed into place as its memory map
        (L, H, T, S) with a batch axis of 1."""
        return self.held if self.file is None else self.file.close()[None]


def attend(
    loaded: LoadedModel,
    batch: Sequence[Encoded],
    layers: Sequence[int] | None = None,
    also: Sequence[Recorder] = (),
    values: Callable[[list[int], int, int], Any] | None = None,
    edit: Edit | None = None,
    reading: Any = None,
    to: Path | None = None,
) -> list[Attention]:
    """Run one padded forward pass and return each text's attention cropped to its own tokens.

    Only `layers` (default: all) are kept. Recorders in `also` are fed by the same pass
    (the page's inside view takes each layer's input from it). `values(chosen_layers,
    n_batch, width)` makes a recorder with a `held` array (B, L, H', W, W) and its `measure`
    whose values replace the weights (`analysis.contributions.MeasureRecorder`). `edit` changes the
    model as it runs (`show --ablate` removes heads, see `capture.run`). `reading`: the one
    text is a decoder's prompt and continuation, its rows kept as the model wrote
    (`core.generation`), handed out without running the model again.
    `to` (one text, the weights): they are written to that `.npy` file as the pass makes
    them (`core.held`), and the text's `weights` are its read-only memory map.
    Right padding keeps every text's positions 0…n-1, so a text's attention in a batch
    equals its attention alone, for causal models too.
    """
    from attnviz.core import capture

    chosen = loaded.info.pick_layers(list(layers) if layers is not None else None)
    inputs = pad(loaded, batch)
    n_batch, width = len(batch), max(len(encoded) for encoded in batch)
    if values is not None:
        weights = values(chosen, n_batch, width)
        capture.run(loaded, inputs, [weights, *also], edit=edit, reading=reading)
        held = weights.held
    else:
        weights = _Weights(chosen, n_batch, loaded.info.n_heads, width, to=to)
        try:
            capture.run(loaded, inputs, [weights, *also], edit=edit, reading=reading)
        except BaseException:
            if weights.file is not None:
                weights.file.discard()
            raise
        held = weights.close()
    measure = getattr(weights, "measure", None)

    name = measure.name if measure is not None else "weights"
    per_layer = bool(measure is not None and measure.per_layer)
    return [
        text_attention(
            encoded,
            loaded.info,
            chosen,
            _cropped(held[row], len(encoded)),
            name,
            per_layer,
        )  # (L, H, n, n)
        for row, encoded in enumerate(batch)
    ]


def _cropped(held: Any, n: int) -> Any:
    """One text's (L, H, n, n) of its batch row `held` (L, H, W, W): the array itself where
    it is the text's whole width (no copy; a file's memory map stays one)."""
    import numpy as np

    if held.shape[-1] == n and held.shape[-2] == n:
        return held
    return np.ascontiguousarray(held[:, :, :n, :n])


def text_attention(
    encoded: Encoded,
    info: Any,
    layers: Sequence[int],
    weights: Any,
    measure: str = "weights",
    per_layer: bool = False,
) -> Attention:
    """One text's Attention: its tokens and the model's facts, with `weights` (L, H, T, T)
    of `layers`."""
    import numpy as np

    return Attention(
        text=encoded.text,
        tokens=encoded.tokens,
        special=np.array(encoded.special, dtype=bool),
        weights=weights,
        info=info,
        unit="token",
        words=encoded.words,
        word_labels=encoded.word_labels,
        notes=encoded.notes,
        layers=tuple(layers),
        pair=encoded.pair,
        segments=encoded.segments,
        truncated=encoded.truncated,
        measure=measure,
        per_layer=per_layer,
        continuation=encoded.continuation,
        picture=encoded.picture,
        layout=encoded.layout,
    )


def attend_stacks(
    loaded: LoadedModel,
    batch: Sequence[SourceTarget],
    stacks: Sequence[str] = ("cross",),
    layers: Sequence[int] | None = None,
    also: Sequence[Recorder] = (),
    values: Callable[[str, list[int], int, int, int], Any] | None = None,
) -> list[dict[str, Attention]]:
    """Run an encoder-decoder model once over sources and targets and return, for each, the
    attention of each of `stacks` ("encoder": source × source, "decoder": target × target,
    causal, "cross": target × source), cropped to its own tokens. Only `layers` (checked
    against each stack; default all) are kept. `values(stack, chosen_layers, n_batch, width,
    key_width)` makes a recorder whose `held` (B, L, H, T, S) and `measure` replace the
    weights, as in `attend`.
    """
    import numpy as np

    from attnviz.core import capture
    from attnviz.core.seq2seq import pad_pairs

    inputs = pad_pairs(loaded, batch)
    n_batch, source_width = inputs["input_ids"].shape
    target_width = inputs["decoder_input_ids"].shape[1]
    infos = {stack: loaded.info.of_stack(stack) for stack in stacks}
    chosen = {
        stack: info.pick_layers(list(layers) if layers else None) for stack, info in infos.items()
    }
    widths = {"encoder": (source_width, source_width), "decoder": (target_width, target_width),
              "cross": (target_width, source_width)}  # fmt: skip
    recorders = {
        stack: _Weights(chosen[stack], n_batch, infos[stack].n_heads, *widths[stack], stack=stack)
        if values is None
        else values(stack, chosen[stack], n_batch, *widths[stack])
        for stack in stacks
    }
    capture.run(loaded, inputs, [*recorders.values(), *also])

    results = []
    for row, item in enumerate(batch):
        source, target = item.source, item.target
        n_source, n_target = len(source), len(target)
        source_keys = Keys(
            source.text, source.tokens, np.array(source.special, dtype=bool),
            source.words, source.word_labels,
        )  # fmt: skip
        found = {}
        for stack in stacks:
            queries = source if stack == "encoder" else target
            n_keys = n_source if stack != "decoder" else n_target
            weights = recorders[stack].held[row, :, :, : len(queries), :n_keys]  # (L, H, T, S)
            found[stack] = Attention(
                text=source.text,
                tokens=queries.tokens,
                special=np.array(queries.special, dtype=bool),
                weights=np.ascontiguousarray(weights),
                info=infos[stack],
                unit="token",
                words=queries.words,
                word_labels=queries.word_labels,
                notes=(*source.notes, *target.notes, *_target_notes(item)),
                layers=tuple(chosen[stack]),
                truncated=source.truncated,
                stack=stack,
                keys=source_keys if stack == "cross" else None,
                target=None if item.untargeted else target.text,
                measure=_measure_name(recorders[stack]),
            )
        results.append(found)
    return results


def extract_seq2seq(
    loaded: LoadedModel,
    source: str,
    target: str | None = None,
    generate: int | None = None,
    stacks: Sequence[str] = ("cross",),
    truncate: bool = False,
    layers: Sequence[int] | None = None,
    values: Callable[[str, list[int], int, int, int], Any] | None = None,
    also: Callable[[list[SourceTarget]], Sequence[Recorder]] | None = None,
) -> dict[str, Attention]:
    """An encoder-decoder model's attention of each of `stacks` on `source` and `target`
    (teacher forcing), or on its own greedy output (`generate` tokens at most, the default
    when no target is given); `layers` and `values` as in `attend_stacks`. `also` makes more
    recorders for the encoded source and target (a one-item batch), fed by the same pass."""
    from attnviz.core.seq2seq import encode_source_target

    for stack in stacks:
        loaded.info.of_stack(stack)  # a model with one stack refuses --stack here
    item = encode_source_target(loaded, source, target, generate, truncate)
    extra = also([item]) if also is not None else ()
    return attend_stacks(loaded, [item], stacks, layers, extra, values)[0]


def _measure_name(recorder: Any) -> str:
    measure = getattr(recorder, "measure", None)
    return measure.name if measure is not None else "weights"


# What `show` and the API say of an encoder-decoder model read without a target.
UNTARGETED = (
    "no target: this is the encoder's self-attention; give --target TEXT, or --generate N to "
    "have the model write one (target= or generate= in the Python API), for the decoder's "
    "self-attention and the cross-attention"
)


def _target_notes(item: SourceTarget) -> tuple[str, ...]:
    """How the decoder's tokens came, where it says more than the target given: written by
    the model, or none at all (its start token alone)."""
    if item.untargeted:
        return (UNTARGETED,)
    if not item.generated:
        return ()
    return (f"the model wrote the target itself (greedy, {len(item.target) - 1} tokens)",)


def extract(
    loaded: LoadedModel,
    text: str,
    truncate: bool = False,
    layers: Sequence[int] | None = None,
    pair: str | None = None,
) -> Attention:
    """Attention of one text (or sentence pair), `[layer, head, query, key]` (only `layers`,
    default all)."""
    return attend(loaded, [encode(loaded, text, truncate, pair)], layers)[0]


def batched(
    encoded: Iterable[Encoded], batch_size: int, same_size: bool = False
) -> Iterator[list[Encoded]]:
    """Encoded texts in lists of `batch_size` (the last may be shorter), in order; with
    `same_size` (pictures, whose pixels are stacked) a list also ends where the next one's
    pixels differ in size."""
    batch: list[Encoded] = []
    for item in encoded:
        if same_size and batch and batch[-1].pixels.shape != item.pixels.shape:
            yield batch
            batch = []
        batch.append(item)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch
