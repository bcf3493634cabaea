"""The result types every layer shares: a tokenised text (`Encoded`; a vision model's picture
is one too, with its `Picture`) and its attention (`Attention`).

One shape convention everywhere: attention weights are `[layer, head, query, key]`, and every
row (fixed layer, head, query) sums to 1. Queries and keys are the same tokens except in an
encoder-decoder model's cross-attention, where target tokens (queries) read source tokens
(keys): its Attention carries the key side in `keys`. Figures and the page for an Attention
live in the outputs layer; `attnviz.Attention` (the API's) adds them as methods for notebooks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.layouts import Layout
    from attnviz.core.model_info import ModelInfo


@dataclass(frozen=True)
class Continuation:
    """The part of a decoder's text that follows its prompt: written by the model
    (`--generate`) or given (`--target`, read by teacher forcing).

    Token `start + i` is the continuation's i-th token; `probs[i]` is the probability the
    model gave it, read from the position before it (the row that wrote it)."""

    start: int  # the index of the continuation's first token
    probs: tuple[float, ...]  # each continuation token's probability under the model
    written: bool  # True: the model wrote it (--generate); False: given (--target)
    how: str  # "greedy", "sampled at temperature 0.8, seed 3", "teacher-forced"
    stopped: bool = False  # the model wrote its end-of-text token and stopped there
    text_at: int = 0  # where the continuation starts in the text, in characters

    def as_dict(self) -> dict[str, object]:
        """JSON-ready: where it starts, how it came, whether it stopped, each probability."""
        return {"start": self.start, "how": self.how, "generated": self.written,
                "stopped": self.stopped, "probs": [round(p, 6) for p in self.probs]}  # fmt: skip

    def describe(self, unit: str = "token") -> str:
        """One line: how many tokens (or words), how they came, and why they end there."""
        n = len(self.probs)
        said = f"{n} {unit}{'s' * (n != 1)} {'generated' if self.written else 'given'} ({self.how})"
        if self.stopped:
            said += ", stopped at the end-of-text token"
        return said


@dataclass(frozen=True, eq=False)
class Picture:
    """The picture as the model saw it, and where its patches are among the tokens."""

    pixels: Any  # (H, W, 3) uint8: the processed image, its normalisation undone
    grid: tuple[int, int]  # patches down, across
    first: int  # the index of the first patch token (the ones before: CLS, dist, registers)
    patch: int  # a patch's side, in pixels of `pixels`
    name: str  # the file's name, or "image"
    read_from: Any = None  # the path or PIL image it was read from (to read it again: the page)

    def index(self, row: int, col: int) -> int:
        """The token index of patch (row, col)."""
        rows, cols = self.grid
        if not (0 <= row < rows and 0 <= col < cols):
            raise InputError(
                f"patch ({row}, {col}) is outside the {rows} × {cols} grid of patches "
                f"(rows 0–{rows - 1}, columns 0–{cols - 1})"
            )
        return self.first + row * cols + col

    def patches(self, row: Any) -> Any:
        """A row of attention (over every token) as the (rows, cols) grid of its patches."""
        rows, cols = self.grid
        return row[self.first : self.first + rows * cols].reshape(rows, cols)


@dataclass(frozen=True)
class Encoded:
    """One text as the model's tokenizer cut it, ready for a forward pass."""

    text: str
    ids: tuple[int, ...]
    tokens: tuple[str, ...]
    special: tuple[bool, ...]
    words: tuple[int, ...]  # word index of each token; special tokens are words of their own
    word_labels: tuple[str, ...]
    notes: tuple[str, ...]
    pair: str | None = None  # the second sentence of a pair: [CLS] text [SEP] pair [SEP]
    segments: tuple[int, ...] | None = None  # with a pair: 0 for text's tokens, 1 for pair's
    truncated: bool = False  # cut to the model's limit (--truncate); `notes` says how
    stand_ins: int = 0  # treebank words the tokenizer drops, given as its unknown token
    continuation: Continuation | None = None  # a decoder's generated or given continuation
    pixels: Any = None  # a picture's pixel values, (1, 3, H, W), for a vision model
    picture: Picture | None = None  # a picture: as the model saw it, and its patch grid
    # a picture and a prompt (`core.vlm`): the processor's outputs beside the ids (pixel
    # values, image_grid_thw, …), and where each image token sits on the picture
    inputs: dict[str, Any] | None = None
    layout: Layout | None = None
    # Mllama's picture, read by cross-attention layers: where each of their keys sits on it
    # (`core.cross_picture.CrossPicture`, which builds an Attention: typed Any, no cycle)
    cross: Any = None

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class SourceTarget:
    """A source and target for an encoder-decoder model: the encoder reads `source`, the
    decoder `target` (its start token first, then the target's tokens, teacher forcing)."""

    source: Encoded
    target: Encoded
    generated: bool = False  # the model wrote the target itself (greedy)
    untargeted: bool = False  # no target given or written: the decoder reads its start alone


@dataclass(frozen=True, eq=False)
class Keys:
    """The key side of a non-square attention (cross-attention: the source's tokens)."""

    text: str
    tokens: tuple[str, ...]
    special: np.ndarray  # (S,) bool
    words: tuple[int, ...]
    word_labels: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Attention:
    """Attention of one text: `weights[layer, head, query, key]` over `tokens`.

    `measure` names what `weights` holds: the attention weights, or one of the contribution
    measures of `attnviz.analysis.contributions` (`norm`: ‖α f(x)‖ per head; `alti`,
    `rollout`: one map per layer, composed from layer 0 up, held as `weights[layer, 0]` with
    `per_layer` True: the views show them as layers, not heads).

    An encoder-decoder model's attention is one of its three stacks (`stack`): "encoder"
    (source × source, `text` and `tokens` are the source), "decoder" (target × target,
    causal) or "cross" (target × source: `tokens` are the target's, `keys` the source's, and
    `weights` is (L, H, T, S)). `target` is the target text as the decoder read it.

    `removed` are the (layer, head) pairs whose output the pass set to 0 (`show --ablate`):
    their weights are what they computed, but nothing downstream saw their output, so the
    views mark them as removed rather than show a pattern.
    """

    text: str
    tokens: tuple[str, ...]
    special: np.ndarray  # (T,) bool
    weights: np.ndarray  # (L, H, T, T) float32
    info: ModelInfo
    unit: str  # "token" or "word"
    words: tuple[int, ...]
    word_labels: tuple[str, ...]
    notes: tuple[str, ...] = ()
    hidden_special: bool = False  # special tokens dropped and rows renormalised
    layers: tuple[int, ...] | None = None  # the model layers `weights` holds, in order; None: all
    pair: str | None = None  # the second sentence, when the model read a sentence pair
    segments: tuple[int, ...] | None = None  # with a pair: 0 (first sentence) or 1, per token
    truncated: bool = False  # the text was cut to the model's limit
    measure: str = "weights"
    per_layer: bool = False  # one map per layer (no head axis): weights is (L, 1, T, T)
    stack: str | None = None  # encoder-decoder models: "encoder", "decoder" or "cross"
    keys: Keys | None = None  # cross-attention: the source tokens the target reads
    target: str | None = None  # encoder-decoder models: the target text
    removed: tuple[tuple[int, int], ...] = ()  # (layer, head) pairs ablated in the pass
    # (size, "mean" or "max"): a long text's maps pooled, each cell `size` × `size` of its
    # tokens (`analysis.pooling`); `tokens` are then each block's first token
    pooled: tuple[int, str] | None = None
    # a window of a longer text: its first token and one past its last (`analysis.window`);
    # `tokens` are the window's, its rows leave out the keys outside it
    span: tuple[int, int] | None = None
    # a pooled view: how many tokens the text has along each axis (queries, keys)
    pooled_from: tuple[int, int] | None = None
    # a decoder's text that it wrote (or was given) after its prompt: where that part
    # starts and each of its tokens' probabilities (`--generate`, `--target`)
    continuation: Continuation | None = None
    picture: Picture | None = None  # a vision model's picture: its pixels and patch grid
    layout: Layout | None = None  # a vision-language model's picture: its image tokens' cells

    @property
    def pool_size(self) -> int:
        """How many tokens a cell spans along each axis: 1 unless the maps are pooled."""
        return self.pooled[0] if self.pooled is not None else 1

    def pooling(self) -> str | None:
        """How a pooled view's cells come from the text's, `each cell the max of 17 × 17
        tokens`; None where the maps are not pooled."""
        if self.pooled is None:
            return None
        size, how = self.pooled
        return f"each cell the {how} of {size} × {size} {self.unit}s"

    def token_counts(self) -> tuple[int, int]:
        """How many tokens (or words) the text has along each axis, (queries, keys): the
        map's rows and columns, or a pooled map's tokens before pooling."""
        if self.pooled_from is not None:
            return self.pooled_from
        return len(self.tokens), len(self.key_tokens)

    def position(self, index: int) -> int:
        """The position in the text of row `index` (a window's rows count from its first)."""
        return index + (self.span[0] if self.span is not None else 0)

    @property
    def key_tokens(self) -> tuple[str, ...]:
        """The tokens along the key axis (the source's in cross-attention)."""
        return self.keys.tokens if self.keys is not None else self.tokens

    @property
    def key_special(self) -> np.ndarray:
        """Which keys are special tokens, (S,) bool."""
        return self.keys.special if self.keys is not None else self.special

    def slot(self, layer: int) -> int:
        """Where model layer `layer` is in `weights` (refusing one that was not extracted)."""
        self.info.pick_layers([layer])
        if self.layers is None:
            return layer
        if layer not in self.layers:
            held = ", ".join(map(str, self.layers))
            raise InputError(f"layer {layer} was not extracted; this attention holds layers {held}")
        return self.layers.index(layer)

    def pattern(self, layer: int, head: int) -> np.ndarray:
        """One head's `[query, key]` weights, (T, T) (a per-layer measure's map is head 0)."""
        if self.per_layer:
            if head != 0:
                raise InputError(f"the {self.measure} measure has one map per layer, no heads")
            return self.weights[self.slot(layer), 0]
        self.info.pick_heads([head])
        return self.weights[self.slot(layer), head]

    def is_removed(self, layer: int, head: int) -> bool:
        """Whether head `head` of layer `layer` was removed (a per-layer map never is)."""
        return not self.per_layer and (layer, head) in self.removed

    def head_label(self, head: int) -> str:
        """A head's short label, `H3`; empty for a per-layer measure's one map."""
        return "" if self.per_layer else f"H{head}"

    def heads_held(self, requested: list[int] | None = None) -> list[int]:
        """The heads to show: the requested ones, or [0], the one map of a per-layer measure."""
        if self.per_layer:
            return [0]
        return self.info.pick_heads(requested)

    def keep_layers(self, layers: Sequence[int] | None) -> Attention:
        """This attention with only `layers` (None: as it is)."""
        if not layers:
            return self
        from dataclasses import replace

        chosen = self.info.pick_layers(list(layers))
        slots = [self.slot(layer) for layer in chosen]
        return replace(self, weights=self.weights[slots], layers=tuple(chosen))

    def held_layers(self) -> list[int]:
        """The model layers this attention holds."""
        return list(self.layers) if self.layers is not None else self.info.pick_layers(None)


def require_text(text: str, what: str = "text") -> None:
    """Refuse text with no word in it, or that is not Unicode (`require_unicode`)."""
    require_unicode(text, what)
    if not text.strip():
        raise InputError(f"{what} is empty: give a sentence with at least one word")


def require_unicode(text: str, what: str = "text") -> None:
    """Refuse text a tokenizer cannot read: a lone surrogate where a character should be,
    the first one's place said. Python hands on bytes that were not UTF-8 (a command line's
    argument) as the surrogates U+DC80–U+DCFF, so such a one is said as the byte it was, by
    its place among the text's bytes (as a file's line is said, `core.inputs`)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        char = text[error.start]
        if "\udc80" <= char <= "\udcff":
            byte = len(text[: error.start].encode("utf-8")) + 1
            found = f"not valid UTF-8 (byte {byte}, 0x{ord(char) - 0xDC00:02x})"
        else:
            found = (f"not valid Unicode (character {error.start + 1} is a lone surrogate, "
                     f"U+{ord(char):04X})")  # fmt: skip
        raise InputError(f"{what}: {found}; give the text in UTF-8") from None
