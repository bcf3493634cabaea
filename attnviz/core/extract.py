"""Attention extraction: text in, one `[layer, head, query, key]` array out, plus its word view.

Every array here follows one shape convention: attention weights are
`[layer, head, query, key]`, and every row (fixed layer, head, query) sums to 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from attnviz.core.models import too_long
from attnviz.errors import InputError

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.figure import Figure

    from attnviz.core.models import LoadedModel, ModelInfo
    from attnviz.outputs.figures import Style


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

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, eq=False)
class Attention:
    """Attention of one text: `weights[layer, head, query, key]` over `tokens`."""

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
        """One head's `[query, key]` weights, (T, T)."""
        self.info.pick_heads([head])
        return self.weights[self.slot(layer), head]

    def held_layers(self) -> list[int]:
        """The model layers this attention holds."""
        return list(self.layers) if self.layers is not None else self.info.pick_layers(None)

    # The figures the CLI writes, returned as matplotlib Figures (nothing is written).

    def heatmap(self, layer: int, head: int, style: Style | None = None) -> Figure:
        """One head's query × key heatmap."""
        from attnviz.outputs.figures import HeadFigure, Style, head_title

        figure = HeadFigure(self, style or Style())
        grid = self.pattern(layer, head)  # (T, T)
        return figure.draw(grid, head_title(layer, head, grid))

    def layer(self, layer: int, heads: list[int] | None = None, style: Style | None = None):
        """All heads (or `heads`) of one layer in a grid."""
        from attnviz.outputs.figures import LayerFigure, Style

        figure = LayerFigure(self, self.info.pick_heads(heads), style or Style())
        return figure.draw(self.weights[self.slot(layer)], layer)

    def overview(self, style: Style | None = None) -> Figure:
        """Every layer × head as small multiples, each scaled to its own max."""
        from attnviz.outputs.figures import Style, overview_figure

        every_layer, every_head = self.held_layers(), self.info.pick_heads(None)
        return overview_figure(self, every_layer, every_head, style or Style())

    def query(self, token: str | int, style: Style | None = None) -> Figure:
        """Where one token (`"it"`, `"it#2"` or a position) looks, in every head."""
        from attnviz.analysis.query import find_query
        from attnviz.outputs.figures import Style, query_figure

        index = find_query(self, str(token))
        every_layer, every_head = self.held_layers(), self.info.pick_heads(None)
        return query_figure(self, index, every_layer, every_head, style or Style())

    def to_html(self, scale: str = "absolute", cmap: str = "viridis") -> str:
        """The interactive page (head, model, matrix, query and inside-one-head views) as one
        self-contained HTML string: nothing in it loads from the network."""
        from attnviz.outputs.html import build_page
        from attnviz.outputs.html.inside import inside_for

        return build_page(
            self, inside=inside_for(self), scale=scale, cmap=cmap, segments=self.segments
        )

    def _repr_html_(self) -> str:
        """A notebook cell showing an Attention shows the interactive page, in a sandboxed
        frame so that its script and Content-Security-Policy stay its own."""
        import html

        page = html.escape(self.to_html(), quote=True)
        return (
            f'<iframe srcdoc="{page}" sandbox="allow-scripts" '
            'style="width:100%;height:720px;border:1px solid #ddd"></iframe>'
        )

    def _repr_png_(self) -> bytes:
        """A notebook cell showing an Attention shows its overview."""
        from attnviz.outputs.figures import figure_png

        return figure_png(self.overview())


def require_text(text: str, what: str = "text") -> None:
    """Refuse text with no word in it."""
    if not text.strip():
        raise InputError(f"{what} is empty: give a sentence with at least one word")


def encode(
    loaded: LoadedModel, text: str, truncate: bool = False, pair: str | None = None
) -> Encoded:
    """Tokenise one text (or a sentence pair: `[CLS] text [SEP] pair [SEP]` with token types),
    refusing empty text and text longer than the model takes.

    A decoder whose tokenizer does not start texts with BOS (GPT-2, SmolLM2, Qwen) gets its
    BOS token put first: a decoder parks spare attention on its first token, and a special
    BOS takes that role as [CLS] does in BERT (so --hide-special and the maps treat it alike).
    """
    require_text(text)
    if pair is not None:
        require_text(pair, "the --pair sentence")
        if loaded.info.causal:
            raise InputError(
                f"--pair needs an encoder that reads sentence pairs; {loaded.info.name} is a "
                "decoder"
            )
    tokenizer = loaded.tokenizer
    bos = _bos_to_add(loaded)
    limit = loaded.info.max_tokens - (bos is not None)
    notes: list[str] = []
    options = dict(return_offsets_mapping=True, return_special_tokens_mask=True)
    enc = tokenizer(text, pair, **options)
    n_tokens = len(enc["input_ids"])
    if n_tokens > limit:
        if not truncate:
            raise too_long(n_tokens + (bos is not None), loaded.info.max_tokens)
        enc = tokenizer(text, pair, truncation=True, max_length=limit, **options)
        kept_chars = max((end for _, end in enc["offset_mapping"]), default=0)
        notes.append(
            f"truncated: kept the first {limit} of {n_tokens} tokens "
            + (
                f"(text cut after character {kept_chars} of {len(text)})"
                if pair is None
                else "(the longer sentence of the pair was cut)"
            )
        )

    ids = tuple(int(i) for i in enc["input_ids"])
    special = tuple(bool(s) for s in enc["special_tokens_mask"])
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    word_ids = enc.word_ids()
    sequence_ids = enc.sequence_ids()
    if bos is not None:
        ids, special = (bos, *ids), (True, *special)
        offsets, word_ids = [(0, 0), *offsets], [None, *word_ids]
        sequence_ids = [None, *sequence_ids]
    # Offsets index into the sentence each token came from.
    sources = [pair if seq == 1 else text for seq in sequence_ids]
    raw = tokenizer.convert_ids_to_tokens(list(ids))
    from_text = _labels_from_text(tokenizer)
    tokens = tuple(
        (source[start:end].strip() or "␣") if from_text and not is_special else token
        for token, is_special, (start, end), source in zip(raw, special, offsets, sources)
    )
    words, word_labels = _group_words(sources, raw, special, offsets, word_ids)
    segments = None
    if pair is not None:
        segments = tuple(_segment_of(sequence_ids))
    return Encoded(text, ids, tokens, special, words, word_labels, tuple(notes), pair, segments)


def _segment_of(sequence_ids: list[int | None]) -> list[int]:
    """Each token's sentence (0 or 1); a special token belongs to the sentence it closes
    ([CLS] and the first [SEP] to the first, the last [SEP] to the second)."""
    segments, current = [], 0
    for seq in sequence_ids:
        if seq is not None:
            current = seq
        segments.append(current)
    return segments


def _bos_to_add(loaded: LoadedModel) -> int | None:
    """A decoder's BOS id when its tokenizer does not put one first itself; else None."""
    tokenizer = loaded.tokenizer
    bos = tokenizer.bos_token_id
    if not loaded.info.causal or bos is None:
        return None
    first = tokenizer("a")["input_ids"]
    return None if first and first[0] == bos else bos


def encode_words(
    loaded: LoadedModel,
    words: Sequence[str],
    space_after: Sequence[bool] | None = None,
    text: str | None = None,
    truncate: bool = False,
) -> Encoded:
    """Tokenise words given by a treebank, each piece mapped back to its word.

    The tokenizer sees the words as given (`is_split_into_words`), so its word view has one
    word per given word, in order, plus the special tokens as words of their own. Byte-level
    tokenizers get each word with the space that precedes it in the text (`space_after`), as
    they would see it in running text. A word the tokenizer drops entirely (control or
    zero-width characters) is given as its unknown token (or `_`), so that every word keeps
    its place. A decoder gets its BOS first, as in `encode`.
    Truncation keeps the first words that fit, and says how many.
    """
    if not words:
        raise InputError("a sentence with no words")
    tokenizer = loaded.tokenizer
    bos = _bos_to_add(loaded)
    limit = loaded.info.max_tokens - (bos is not None)
    spaced = list(words)
    if _is_byte_level(tokenizer):
        gaps = [False] + [True if space_after is None else bool(s) for s in space_after[:-1]]
        spaced = [(" " + w if gap else w) for w, gap in zip(words, gaps)]
    notes: list[str] = []

    def tokenise(items: list[str], cut: bool):
        return tokenizer(
            items,
            is_split_into_words=True,
            return_special_tokens_mask=True,
            return_offsets_mapping=True,
            truncation=cut,
            max_length=limit if cut else None,
        )

    enc = tokenise(spaced, False)
    dropped = set(range(len(words))) - {w for w in enc.word_ids() if w is not None}
    if dropped:
        stand_in = tokenizer.unk_token or "_"
        spaced = [stand_in if i in dropped else w for i, w in enumerate(spaced)]
        notes.append(f"{len(dropped)} word(s) with no token given as {stand_in}")
        enc = tokenise(spaced, False)
    n_tokens = len(enc["input_ids"])
    if n_tokens > limit:
        if not truncate:
            raise too_long(n_tokens + (bos is not None), loaded.info.max_tokens)
        enc = tokenise(spaced, True)
        kept = len({w for w in enc.word_ids() if w is not None})
        notes.append(
            f"truncated: kept the first {limit} of {n_tokens} tokens ({kept} of {len(words)} words)"
        )
    ids = [int(i) for i in enc["input_ids"]]
    special = [bool(s) for s in enc["special_tokens_mask"]]
    word_ids = list(enc.word_ids())
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    if bos is not None:
        ids, special = [bos, *ids], [True, *special]
        word_ids, offsets = [None, *word_ids], [(0, 0), *offsets]
    raw = tokenizer.convert_ids_to_tokens(ids)
    from_text = _labels_from_text(tokenizer)
    token_words: list[int] = []
    labels: list[str] = []
    previous = None
    for token, is_special, word_id in zip(raw, special, word_ids):
        if is_special or word_id is None or word_id != previous:
            labels.append(token if is_special or word_id is None else words[word_id])
        token_words.append(len(labels) - 1)
        previous = None if is_special else word_id
    tokens = tuple(
        (spaced[w][start:end].strip() or "␣") if from_text and w is not None else token
        for token, w, (start, end) in zip(raw, word_ids, offsets)
    )
    joined = text if text is not None else " ".join(words)
    return Encoded(
        joined, tuple(ids), tokens, tuple(special), tuple(token_words), tuple(labels), tuple(notes)
    )


def _is_byte_level(tokenizer) -> bool:
    """GPT-2-style byte-level BPE: a word's leading space is part of its first token."""
    from tokenizers import decoders

    return isinstance(tokenizer.backend_tokenizer.decoder, decoders.ByteLevel)


def _labels_from_text(tokenizer) -> bool:
    """Whether tokens are labelled with the text they cover rather than their vocabulary form.

    Byte-level BPE (GPT-2, Llama 3, Qwen) writes 'Ġcat' and SentencePiece (Llama 2, Mistral,
    Gemma) '▁cat' or '<0xC3>' for a byte; the text is what a reader recognises. WordPiece
    keeps its own form: '##ing' says the piece continues a word.
    """
    from tokenizers import models

    return not isinstance(tokenizer.backend_tokenizer.model, models.WordPiece)


def _group_words(sources, raw, special, offsets, word_ids):
    """Give each token a word index: consecutive pieces of one word share it. `sources[i]` is
    the sentence token i's offsets index into."""
    words: list[int] = []
    labels: list[str] = []
    spans: list[list] = []
    previous = object()
    for token, is_special, (start, end), word_id, source in zip(
        raw, special, offsets, word_ids, sources
    ):
        if is_special or word_id is None or word_id != previous:
            labels.append(token if is_special or word_id is None else "")
            spans.append([start, end, source])
        else:
            spans[-1][1] = end
        words.append(len(labels) - 1)
        previous = None if is_special else word_id
    for index, (start, end, source) in enumerate(spans):
        if not labels[index]:
            labels[index] = source[start:end].strip() or source[start:end]
    return tuple(words), tuple(labels)


def pad(loaded: LoadedModel, batch: Sequence[Encoded]) -> dict:
    """Model inputs for a batch: token ids padded on the right, and the attention mask (B, T).

    Right padding keeps every text's positions 0…n-1, so its cropped attention equals its
    unbatched attention, for causal models too.
    """
    import torch

    width = max(len(e) for e in batch)
    pad_id = loaded.tokenizer.pad_token_id or 0
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    types = torch.zeros((len(batch), width), dtype=torch.long)
    for row, encoded in enumerate(batch):
        input_ids[row, : len(encoded)] = torch.tensor(encoded.ids)
        mask[row, : len(encoded)] = 1
        if encoded.segments is not None:
            types[row, : len(encoded)] = torch.tensor(encoded.segments)
    inputs = {"input_ids": input_ids, "attention_mask": mask}
    if any(encoded.segments is not None for encoded in batch):
        inputs["token_type_ids"] = types  # the second sentence of a pair is type 1
    return {name: tensor.to(loaded.device) for name, tensor in inputs.items()}


def attend(
    loaded: LoadedModel, batch: Sequence[Encoded], layers: Sequence[int] | None = None
) -> list[Attention]:
    """Run one padded forward pass and return each text's attention cropped to its own tokens.

    Only `layers` (default: all) are kept, each copied out as the forward pass reaches it:
    a long text's other layers are never held (30 layers × 9 heads × 2,048² floats is 4.5 GB).
    """
    import numpy as np
    import torch

    from attnviz.core import adapters

    chosen = loaded.info.pick_layers(list(layers) if layers is not None else None)
    inputs = pad(loaded, batch)
    n_batch, width = inputs["input_ids"].shape
    slot = {layer: i for i, layer in enumerate(chosen)}
    held = np.empty((n_batch, len(chosen), loaded.info.n_heads, width, width), np.float32)

    def keep(layer: int, probs) -> None:  # probs (B, H, T, T)
        held[:, slot[layer]] = probs.float().cpu().numpy()

    with adapters.hooked(loaded.model, chosen, on_probs=keep), torch.inference_mode():
        loaded.model.base_model(**inputs)  # the decoder stack alone: no logits over the vocabulary

    results = []
    for row, encoded in enumerate(batch):
        n = len(encoded)
        weights = np.ascontiguousarray(held[row, :, :, :n, :n])  # (L, H, n, n)
        results.append(
            Attention(
                text=encoded.text,
                tokens=encoded.tokens,
                special=np.array(encoded.special, dtype=bool),
                weights=weights,
                info=loaded.info,
                unit="token",
                words=encoded.words,
                word_labels=encoded.word_labels,
                notes=encoded.notes,
                layers=tuple(chosen),
                pair=encoded.pair,
                segments=encoded.segments,
            )
        )
    return results


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


def extract_many(
    loaded: LoadedModel,
    encoded: Iterable[Encoded],
    batch_size: int = 8,
    layers: Sequence[int] | None = None,
) -> Iterator[Attention]:
    """Attention of many encoded texts, in order, with forward passes batched by `batch_size`."""
    batch: list[Encoded] = []
    for item in encoded:
        batch.append(item)
        if len(batch) == batch_size:
            yield from attend(loaded, batch, layers)
            batch = []
    if batch:
        yield from attend(loaded, batch, layers)


def view(att: Attention, words: bool = False, hide_special_tokens: bool = False) -> Attention:
    """The view a command asks for: word pieces merged first, then special tokens hidden."""
    if words:
        att = word_view(att)
    if hide_special_tokens:
        att = hide_special(att)
    return att


def word_view(att: Attention) -> Attention:
    """Merge word pieces into words.

    Attention *to* a word sums over its pieces; attention *from* a word averages its pieces'
    rows. Rows still sum to 1.
    """
    import numpy as np

    if att.unit == "word":
        return att
    groups = np.array(att.words)
    n_words = len(att.word_labels)
    member = np.zeros((len(groups), n_words))  # (T, W) one-hot token -> word
    member[np.arange(len(groups)), groups] = 1.0
    counts = member.sum(axis=0)  # (W,)
    to_words = att.weights.astype(np.float64) @ member  # (L, H, T, W)
    merged = (member.T @ to_words) / counts[:, None]  # (W, T) @ (L, H, T, W) -> (L, H, W, W)
    special = np.array([att.special[groups == w].all() for w in range(n_words)])
    segments = None
    if att.segments is not None:
        segments = tuple(att.segments[int(np.argmax(groups == w))] for w in range(n_words))
    return replace(
        att,
        tokens=att.word_labels,
        special=special,
        weights=merged.astype(np.float32),
        unit="word",
        words=tuple(range(n_words)),
        segments=segments,
        notes=att.notes + ("word view: pieces merged into words",),
    )


def hide_special(att: Attention) -> Attention:
    """Drop special tokens ([CLS], [SEP], BOS…) as queries and keys, renormalising each row."""
    import numpy as np

    keep = ~att.special
    if keep.all():
        return replace(att, notes=att.notes + ("no special tokens to hide",))
    if not keep.any():
        raise InputError("the text has only special tokens; nothing is left once they are hidden")
    weights = att.weights[:, :, keep][:, :, :, keep].astype(np.float64)  # (L, H, t, t)
    kept_share = weights.sum(axis=-1, keepdims=True)  # (L, H, t, 1)
    weights = weights / np.where(kept_share > 0, kept_share, 1.0)
    removed = 1.0 - float(kept_share.mean())
    kept_words = [w for w, k in zip(att.words, keep) if k]
    return replace(
        att,
        tokens=tuple(t for t, k in zip(att.tokens, keep) if k),
        special=att.special[keep],
        weights=weights.astype(np.float32),
        words=tuple(sorted(set(kept_words)).index(w) for w in kept_words),
        word_labels=tuple(att.word_labels[w] for w in sorted(set(kept_words))),
        hidden_special=True,
        segments=None
        if att.segments is None
        else tuple(s for s, k in zip(att.segments, keep) if k),
        notes=att.notes
        + (
            f"special tokens hidden ({int((~keep).sum())} of {len(keep)}); they held "
            f"{removed:.0%} of attention on average, and each row was renormalised",
        ),
    )
