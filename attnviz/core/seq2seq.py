"""Encoder-decoder models (T5, BART, Marian): a source and a target as the model reads them.

The encoder reads the source as its tokenizer cuts it. The decoder reads its start token
and then the target's tokens (teacher forcing: `labels` shifted right, the target's closing
EOS left out, since no position reads it), so query i of the decoder is the position that
predicts target token i. With `generate`, the model writes the target itself, greedily, and
the decoder reads what it wrote: the attention it used at each step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from attnviz.core.attention import Encoded, SourceTarget, require_text
from attnviz.core.tokens import encode, label_of, pad
from attnviz.errors import InputError, TextTooLongError

if TYPE_CHECKING:
    from attnviz.core.model_info import LoadedModel

DEFAULT_GENERATE = 40  # tokens --generate writes at most, when it is given no number


def encode_source_target(
    loaded: LoadedModel,
    source: str,
    target: str | None = None,
    generate: int | None = None,
    truncate: bool = False,
    write: bool = True,
) -> SourceTarget:
    """The source and the decoder's tokens: `target` read with teacher forcing, or (with
    `generate`, or neither) the model's own greedy output of at most `generate` tokens;
    with neither and not `write`, the decoder's start token alone (`untargeted`: what `show`
    reads then is the encoder's self-attention)."""
    if not loaded.info.seq2seq:  # refused before (pipelines.features)
        raise ValueError(f"{loaded.info.name} is not an encoder-decoder model")
    require_text(source)
    encoded = encode_side(loaded, source, truncate)
    if target is None and generate is None and not write:
        start = _start_id(loaded)
        return SourceTarget(encoded, from_ids(loaded, [start], ""), untargeted=True)
    if target is not None:
        require_text(target, "the --target text")
        labels = loaded.tokenizer(text_target=target)["input_ids"]
        ids = [_start_id(loaded), *_without_eos(loaded, labels)]
        generated = False
    else:
        ids = _greedy(loaded, encoded, generate or DEFAULT_GENERATE)
        generated = True
    limit = loaded.info.max_target_tokens
    if limit is not None and len(ids) > limit:
        raise TextTooLongError(
            f"target is {len(ids)} tokens long with the decoder's start token; this model's "
            f"decoder takes at most {limit}"
        )
    text = target if target is not None else loaded.tokenizer.decode(ids, skip_special_tokens=True)
    return SourceTarget(encoded, from_ids(loaded, ids, text), generated)


def encode_side(loaded: LoadedModel, text: str, truncate: bool) -> Encoded:
    """The source as the encoder reads it: `tokens.encode` with a fast tokenizer; from the
    ids alone with a SentencePiece-only one (Marian's), which gives no character offsets."""
    if getattr(loaded.tokenizer, "is_fast", False):
        return encode(loaded, text, truncate)
    ids = loaded.tokenizer(text)["input_ids"]
    limit = loaded.info.max_tokens
    notes: tuple[str, ...] = ()
    if len(ids) > limit:
        if not truncate:
            from attnviz.core.model_info import too_long

            raise too_long(len(ids), limit)
        ids = loaded.tokenizer(text, truncation=True, max_length=limit)["input_ids"]
        notes = (f"truncated: kept the first {limit} tokens",)
    encoded = from_ids(loaded, ids, text)
    return Encoded(
        text, encoded.ids, encoded.tokens, encoded.special, encoded.words,
        encoded.word_labels, notes, truncated=bool(notes),
    )  # fmt: skip


def from_ids(loaded: LoadedModel, ids: Sequence[int], text: str) -> Encoded:
    """Token ids labelled by what each decodes to, in words: a token that opens a word
    (SentencePiece's ▁, byte-level BPE's Ġ, a WordPiece without ##, one that decodes to text
    starting with whitespace or follows one that ends with it: a newline) starts a new one,
    and special tokens are words of their own."""
    tokenizer = loaded.tokenizer
    ids = tuple(int(i) for i in ids)
    raw = tokenizer.convert_ids_to_tokens(list(ids))
    specials = set(tokenizer.all_special_ids)
    special = tuple(i in specials for i in ids)
    wordpiece = any(token.startswith("##") for token in raw)
    labels, words, word_labels = [], [], []
    after_space = False  # the token before decoded to text ending in whitespace (a newline)
    # each id decoded once: a picture's hundreds of image tokens are one id
    decodes = {token_id: tokenizer.decode([token_id]) for token_id in set(ids)}
    for i, (token_id, token, is_special) in enumerate(zip(ids, raw, special)):
        decoded = decodes[token_id]
        label = token if is_special else label_of(decoded)
        if wordpiece and not is_special:
            label = token  # WordPiece keeps its own form: ##ing says the piece continues
        opens = (is_special or i == 0 or special[i - 1] or _opens_word(token, wordpiece)
                 or after_space or decoded[:1].isspace())  # fmt: skip
        after_space = decoded[-1:].isspace()
        if opens:
            word_labels.append(label)
        else:
            word_labels[-1] += label.removeprefix("##")
        labels.append(label)
        words.append(len(word_labels) - 1)
    return Encoded(text, ids, tuple(labels), special, tuple(words), tuple(word_labels), ())


def _opens_word(token: str, wordpiece: bool) -> bool:
    if wordpiece:
        return not token.startswith("##")
    return token.startswith(("▁", "Ġ"))


def _start_id(loaded: LoadedModel) -> int:
    """The token the decoder starts from (T5, Marian: pad; BART: EOS)."""
    for holder in (getattr(loaded.model, "generation_config", None), loaded.model.config):
        start = getattr(holder, "decoder_start_token_id", None)
        if start is not None:
            return int(start)
    raise InputError(f"{loaded.info.name} names no decoder_start_token_id in its config")


def _eos_id(loaded: LoadedModel) -> int | None:
    eos = loaded.model.config.eos_token_id
    return eos if eos is not None else loaded.tokenizer.eos_token_id


def _without_eos(loaded: LoadedModel, labels: Sequence[int]) -> list[int]:
    """The target's ids without the EOS that closes them (no decoder position reads it)."""
    labels = list(labels)
    if labels and labels[-1] == _eos_id(loaded):
        labels.pop()
    return labels


def _greedy(loaded: LoadedModel, source: Encoded, max_new: int) -> list[int]:
    """The decoder's tokens as the model writes them greedily (its start token, what it
    wrote, without the EOS it ends on), at most `max_new` new tokens."""
    import torch

    model = loaded.model
    ids = torch.tensor([source.ids], device=loaded.device)
    encoder, decoder, _ = loaded.info.stacks
    # transformers sizes T5's generation cache by the encoder's layer count
    cache = encoder[1] == decoder[1]
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new,
            do_sample=False,
            num_beams=1,
            decoder_start_token_id=_start_id(loaded),
            use_cache=cache,
        )
    written = [int(i) for i in out[0]]
    pad = loaded.model.config.pad_token_id
    start, rest = written[0], written[1:]
    while rest and rest[-1] == pad and pad != start:
        rest.pop()
    return [start, *_without_eos(loaded, rest)]


def pad_pairs(loaded: LoadedModel, batch: Sequence[SourceTarget]) -> dict:
    """Model inputs for a batch of sources and targets, each side padded on the right."""
    sources = pad(loaded, [item.source for item in batch])
    targets = pad(loaded, [item.target for item in batch])
    return {
        "input_ids": sources["input_ids"],
        "attention_mask": sources["attention_mask"],
        "decoder_input_ids": targets["input_ids"],
        "decoder_attention_mask": targets["attention_mask"],
    }
