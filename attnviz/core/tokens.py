"""Tokenising: a text (or a sentence pair, or a treebank's words) into the ids a model reads,
with each token's label, word and special-token flag; and padding a batch for one pass."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.core.attention import Encoded, require_text
from attnviz.core.model_info import too_long
from attnviz.errors import InputError

if TYPE_CHECKING:
    from attnviz.core.model_info import LoadedModel, ModelInfo, ModelSpec

# A token of whitespace alone is labelled by a mark: each line break it holds as ↵, else ␣.
SPACE, LINE_BREAK = "␣", "↵"


def label_of(piece: str) -> str:
    """A token's label from the text it covers: that text without the whitespace around it,
    or for whitespace alone a mark, one ↵ a line break it holds (a blank line's token: ↵↵),
    else ␣ (spaces, a tab)."""
    return piece.strip() or LINE_BREAK * piece.count("\n") or SPACE


def encode(
    loaded: LoadedModel, text: str, truncate: bool = False, pair: str | None = None
) -> Encoded:
    """Tokenise one text (or a sentence pair: `[CLS] text [SEP] pair [SEP]` with token types),
    refusing empty text and text longer than the model takes.

    A decoder whose tokenizer does not start texts with BOS (GPT-2, SmolLM2, Qwen) gets its
    BOS token put first: a decoder parks spare attention on its first token, and a special
    BOS takes that role as [CLS] does in BERT (so --hide-special and the maps treat it alike).
    """
    return encode_with(loaded.tokenizer, loaded.info, text, truncate, pair)


def encode_with(
    tokenizer: Any,
    facts: ModelInfo | ModelSpec,
    text: str,
    truncate: bool = False,
    pair: str | None = None,
) -> Encoded:
    """`encode` with a tokenizer and the model's facts (its name, limit, and whether it is a
    decoder): a tokenizer loaded alone and the facts of the model's files (`ModelSpec`) give
    the tokens the loaded model will read, before its weights load."""
    require_text(text)
    if pair is not None:
        require_text(pair, "the --pair sentence")
        if facts.causal:  # refused before (pipelines.features): a decoder reads no pair
            raise ValueError(f"{facts.name} is a decoder: it reads no sentence pair")
    options = dict(return_offsets_mapping=True, return_special_tokens_mask=True)

    def tokenise(limit: int | None) -> Any:
        if limit is None:
            return tokenizer(text, pair, **options)
        return tokenizer(text, pair, truncation=True, max_length=limit, **options)

    def kept(enc: Any) -> str:
        if pair is not None:
            return "(the longer sentence of the pair was cut)"
        kept_chars = max((end for _, end in enc["offset_mapping"]), default=0)
        return f"(text cut after character {kept_chars} of {len(text)})"

    notes: list[str] = []
    got = _pieces(tokenizer, facts, tokenise, truncate, kept, notes)
    ids, special, offsets, raw = tuple(got.ids), tuple(got.special), got.offsets, got.raw
    sequence_ids, word_ids = got.sequence_ids, got.word_ids
    # Offsets index into the sentence each token came from.
    sources = [pair if seq == 1 else text for seq in sequence_ids]
    from_text = _labels_from_text(tokenizer)
    tokens = tuple(
        label_of(source[start:end]) if from_text and not is_special else token
        for token, is_special, (start, end), source in zip(raw, special, offsets, sources)
    )
    tokens, unknown = _label_unknown(tokenizer, tokens, raw, special, offsets, sources)
    if unknown:
        notes.append(
            f"{len(unknown)} token(s) are the tokenizer's {tokenizer.unk_token} (unknown to its "
            f"vocabulary), labelled with the text they cover: {' '.join(unknown)}"
        )
    words, word_labels = _group_words(sources, raw, special, offsets, word_ids)
    segments = None
    if pair is not None:
        segments = tuple(_segment_of(sequence_ids))
    return Encoded(
        text,
        ids,
        tokens,
        special,
        words,
        word_labels,
        tuple(notes),
        pair,
        segments,
        truncated=got.truncated,
    )


@dataclass(frozen=True)
class _Pieces:
    """A text's tokens as the tokenizer gave them, a decoder's BOS put first."""

    ids: list[int]
    special: list[bool]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]
    sequence_ids: list[int | None]
    raw: list[str]  # each token's vocabulary form
    truncated: bool


def _pieces(
    tokenizer: Any,
    facts: ModelInfo | ModelSpec,
    tokenise: Callable[[int | None], Any],
    truncate: bool,
    kept: Callable[[Any], str],
    notes: list[str],
) -> _Pieces:
    """The one skeleton of `encode_with` and `encode_words`: `tokenise(None)` whole; over
    the model's limit, refused, or with `truncate` `tokenise(limit)` and a note of what was
    kept (`kept(encoding)`) added to `notes`; a decoder's BOS put first where its tokenizer
    does not put it there itself."""
    bos = bos_to_add(tokenizer, facts.causal)
    limit = facts.max_tokens - (bos is not None)
    enc = tokenise(None)
    n_tokens = len(enc["input_ids"])
    if n_tokens > limit:
        if not truncate:
            raise too_long(n_tokens + (bos is not None), facts.max_tokens)
        enc = tokenise(limit)
        notes.append(f"truncated: kept the first {limit} of {n_tokens} tokens {kept(enc)}")
    ids = [int(i) for i in enc["input_ids"]]
    special = [bool(s) for s in enc["special_tokens_mask"]]
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    word_ids, sequence_ids = list(enc.word_ids()), list(enc.sequence_ids())
    if bos is not None:
        ids, special = [bos, *ids], [True, *special]
        offsets, word_ids, sequence_ids = (
            [(0, 0), *offsets],
            [None, *word_ids],
            [None, *sequence_ids],
        )
    raw = tokenizer.convert_ids_to_tokens(ids)
    return _Pieces(ids, special, offsets, word_ids, sequence_ids, raw, n_tokens > limit)


def _label_unknown(tokenizer, tokens, raw, special, offsets, sources):
    """Labels with each unknown token ([UNK], <unk>) given the text it covers (an emoji, a
    rare script), so figures show it and --query finds it; and those texts, in order."""
    unk = tokenizer.unk_token
    labels, unknown = list(tokens), []
    for i, (token, is_special, (start, end)) in enumerate(zip(raw, special, offsets)):
        covered = sources[i][start:end].strip()
        if unk is not None and token == unk and not is_special and covered:
            labels[i] = covered
            unknown.append(covered)
    return tuple(labels), unknown


def _segment_of(sequence_ids: list[int | None]) -> list[int]:
    """Each token's sentence (0 or 1); a special token belongs to the sentence it closes
    ([CLS] and the first [SEP] to the first, the last [SEP] to the second)."""
    segments, current = [], 0
    for seq in sequence_ids:
        if seq is not None:
            current = seq
        segments.append(current)
    return segments


def bos_to_add(tokenizer: Any, causal: bool) -> int | None:
    """A decoder's BOS id when its tokenizer does not put one first itself; else None."""
    bos = tokenizer.bos_token_id
    if not causal or bos is None:
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
    spaced = list(words)
    if _is_byte_level(tokenizer):
        gaps = [False] + [True if space_after is None else bool(s) for s in space_after[:-1]]
        spaced = [(" " + w if gap else w) for w, gap in zip(words, gaps)]
    notes: list[str] = []

    def tokenise(limit: int | None) -> Any:
        return tokenizer(
            spaced,
            is_split_into_words=True,
            return_special_tokens_mask=True,
            return_offsets_mapping=True,
            truncation=limit is not None,
            max_length=limit,
        )

    seen = {w for w in tokenise(None).word_ids() if w is not None}
    dropped = set(range(len(words))) - seen
    if dropped:
        stand_in = tokenizer.unk_token or "_"
        spaced = [stand_in if i in dropped else w for i, w in enumerate(spaced)]
        notes.append(f"{len(dropped)} word(s) with no token given as {stand_in}")

    def kept(enc: Any) -> str:
        return f"({len({w for w in enc.word_ids() if w is not None})} of {len(words)} words)"

    got = _pieces(tokenizer, loaded.info, tokenise, truncate, kept, notes)
    ids, special, word_ids, offsets, raw = got.ids, got.special, got.word_ids, got.offsets, got.raw
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
        label_of(spaced[w][start:end]) if from_text and w is not None else token
        for token, w, (start, end) in zip(raw, word_ids, offsets)
    )
    joined = text if text is not None else " ".join(words)
    return Encoded(
        joined,
        tuple(ids),
        tokens,
        tuple(special),
        tuple(token_words),
        tuple(labels),
        tuple(notes),
        truncated=got.truncated,
        stand_ins=len(dropped),
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

    if batch[0].pixels is not None:  # pictures: one size, the processor's
        pixels = torch.cat([e.pixels for e in batch])
        return {"pixel_values": pixels.to(loaded.device, loaded.model.dtype)}
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
    inputs = {name: tensor.to(loaded.device) for name, tensor in inputs.items()}
    if batch[0].inputs is not None:  # a picture and a prompt (`core.vlm`): read one at a time
        if len(batch) > 1:
            raise ValueError("a picture and a prompt are read one at a time")
        inputs.update(picture_inputs(loaded, batch[0]))
    return inputs


def picture_inputs(loaded: LoadedModel, encoded: Encoded, length: int | None = None) -> dict:
    """The processor's outputs beside a prompt's ids (`core.vlm`) on the model's device, the
    pixel values in its dtype; with `length` (the prompt and a target read with it), or for
    a prompt with its continuation (read again whole: eager attention), its per-token ones
    go on over what follows the prompt as transformers' `generate` extends them over what it
    writes: PaliGemma's `token_type_ids` with 1 (a suffix, read causally), the image
    tokens' types (Gemma 3's `token_type_ids`, others' `mm_token_type_ids`) with 0 (text:
    a 1 would make the target's tokens one more image, read both ways), the others (Mllama's
    `cross_attention_mask`) with the prompt's last token's."""
    import torch

    # PaliGemma's types mark its prompt (0, read both ways) from what follows it (1)
    suffix = int(loaded.model.config.model_type == "paligemma")
    found, prompt = {}, len(encoded.ids)
    if encoded.continuation is not None:  # the processor's outputs are its prompt's
        prompt, length = encoded.continuation.start, length or len(encoded.ids)
    for name, value in (encoded.inputs or {}).items():
        if length is not None and value.dim() >= 2 and value.shape[1] == prompt < length:
            if name.endswith("token_type_ids"):
                more = torch.full((1, length - prompt), suffix * (name == "token_type_ids"))
            else:
                more = value[:, -1:].expand(-1, length - prompt, *value.shape[2:])
            value = torch.cat([value, more.to(value.dtype)], dim=1)
        dtype = loaded.model.dtype if value.is_floating_point() else None
        found[name] = value.to(loaded.device, dtype)
    return found
