"""What a model is: its facts before it loads (`ModelSpec`, from its files) and once loaded
(`ModelInfo`), their layers, heads and stacks, and a loaded model (`LoadedModel`)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.errors import InputError, TextTooLongError

DEFAULT_STACK = "cross"  # what people come to an encoder-decoder model for


class _Stacks:
    """An encoder-decoder model's three attention stacks, each with its own counts."""

    stacks: tuple[tuple[str, int, int], ...]  # (stack, layers, heads); () for other models

    @property
    def seq2seq(self) -> bool:
        return bool(self.stacks)

    def of_stack(self, stack: str | None):
        """These facts for one stack (its layers and heads; the decoder's self-attention is
        causal), refusing a stack the model does not have; the model's own facts for None."""
        from dataclasses import replace

        if stack is None:
            return self
        if not self.stacks:  # refused before (pipelines.features)
            raise ValueError(f"{self.name} has one attention stack, not {stack}")
        _, n_layers, n_heads = next(entry for entry in self.stacks if entry[0] == stack)
        changes = dict(stack=stack, n_layers=n_layers, n_heads=n_heads, causal=stack == "decoder")
        if hasattr(self, "d_model") and self.model_type not in ("t5", "mt5"):
            # BART-style stacks may differ in heads, so in d_head; T5's d_kv is every stack's
            changes.update(d_head=self.d_model // n_heads, n_kv_heads=n_heads)
        return replace(self, **changes)


def stack_counts(config: dict[str, Any]) -> tuple[tuple[str, int, int], ...]:
    """(stack, layers, heads) for each stack of an encoder-decoder config (T5's or BART's
    names), or () for a model with one stack."""
    if not config.get("is_encoder_decoder"):
        return ()
    encoder = first_int(config, "encoder_layers", "num_layers")
    decoder = first_int(config, "decoder_layers", "num_decoder_layers") or encoder
    encoder_heads = first_int(config, "encoder_attention_heads", "num_heads")
    decoder_heads = first_int(config, "decoder_attention_heads", "num_heads")
    return (
        ("encoder", encoder, encoder_heads),
        ("decoder", decoder, decoder_heads),
        ("cross", decoder, decoder_heads),
    )


class _HeadRanges:
    """Layer and head choices checked against a model's counts."""

    n_layers: int
    n_heads: int

    def pick_layers(self, requested: list[int] | None) -> list[int]:
        """The requested layers, checked against this model, or all layers."""
        return _pick("layer", requested, self.n_layers)

    def pick_heads(self, requested: list[int] | None) -> list[int]:
        """The requested heads, checked against this model, or all heads."""
        return _pick("head", requested, self.n_heads)


def _pick(what: str, requested: list[int] | None, count: int) -> list[int]:
    if not requested:
        return list(range(count))
    for value in requested:
        if not 0 <= value < count:
            raise InputError(f"{what} {value} out of range: this model has {what}s 0–{count - 1}")
    return sorted(set(requested))


@dataclass(frozen=True)
class ModelInfo(_HeadRanges, _Stacks):
    """Facts about a loaded model that every view needs.

    An encoder-decoder model's info counts its encoder; `of_stack` gives each stack's, with
    `stack` set (an Attention of cross-attention carries the cross stack's info).
    """

    name: str
    architecture: str
    model_type: str
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    max_tokens: int
    causal: bool
    n_kv_heads: int | None = None  # key/value heads (grouped-query attention); None: n_heads
    stacks: tuple[tuple[str, int, int], ...] = ()  # encoder-decoder: (stack, layers, heads)
    stack: str | None = None  # the stack these counts are of (encoder, decoder, cross)
    max_target_tokens: int | None = None  # encoder-decoder: the decoder's limit
    # What ran: the weights' dtype, the attention implementation, where accelerate put each
    # part of the model ((module, device) pairs; () when it sits whole on one device), and
    # bitsandbytes' 4bit or 8bit (its layers compute in `dtype`).
    pictures: bool = False  # a vision model: it reads pictures, not text (`core.images`)
    dtype: str = "float32"
    implementation: str = "sdpa"
    device_map: tuple[tuple[str, str], ...] = ()
    quantize: str | None = None
    # The class the checkpoint declares (config.json's `architectures`) where `architecture`,
    # the one read, is another: ViTForImageClassification read as ViTModel. None: the same.
    declared: str | None = None
    prompted: bool = False  # a vision-language model: a picture and a prompt (`core.vlm`)

    def as_dict(self) -> dict[str, Any]:
        """The model's facts (what ran is `ran()`'s)."""
        facts = dict(self.__dict__)
        for key in RAN:
            facts.pop(key)
        if not self.prompted:  # said of vision-language models alone
            facts.pop("prompted")
        if not self.pictures:  # said of vision models alone
            facts.pop("pictures")
        if self.declared is None:  # said where the checkpoint declares another class
            facts.pop("declared")
        if not self.stacks:  # a model with one stack: no encoder-decoder fields
            for key in ("stacks", "stack", "max_target_tokens"):
                facts.pop(key)
        return facts

    def classes(self) -> str:
        """The class read, for a header line, after the checkpoint's own where it declares
        another: "ViTForImageClassification read as ViTModel"."""
        if self.declared is None:
            return self.architecture
        return f"{self.declared} read as {self.architecture}"

    def ran(self) -> dict[str, Any]:
        """What ran, as --json says it at its top level: "dtype", "device_map" (each part
        of the model and its device, or null) and "attention"."""
        return {
            "dtype": self.dtype,
            "device_map": dict(self.device_map) or None,
            "attention": self.implementation,
            **({"quantize": self.quantize} if self.quantize else {}),
        }

    def ran_line(self) -> str:
        """What ran, for a header line: "bfloat16 · sdpa", with where the parts went."""
        said = f"{self.dtype} · {self.implementation}"
        if self.quantize:
            said += f" · bitsandbytes {self.quantize}"
        if self.device_map:
            devices = [device for _, device in self.device_map]
            counts = ", ".join(f"{devices.count(d)} {d}" for d in dict.fromkeys(devices))
            said += f" · device map: {counts}"
        return said


RAN = ("dtype", "implementation", "device_map", "quantize")  # ModelInfo's fields that say what ran


@dataclass(frozen=True)
class ModelSpec(_HeadRanges, _Stacks):
    """What a model's files say before it loads (config.json, tokenizer.json).

    Enough to refuse a bad layer, head or too-long text in a fraction of a second, without
    importing torch or transformers.
    """

    name: str
    n_layers: int
    n_heads: int
    max_tokens: int | None
    tokenizer_file: Path | None
    causal: bool = False
    stacks: tuple[tuple[str, int, int], ...] = ()
    stack: str | None = None
    weights_bytes: int = 0  # the weights in memory: their files' size, or guessed from config
    weights_dtype: str | None = None  # the dtype the config says the weights are saved in
    bos_id: int | None = None  # a decoder's BOS: attnviz puts it first if the tokenizer does not
    model_type: str | None = None
    pictures: bool = False  # a vision model (`core.images.reads_pictures`)
    prompted: bool = False  # a vision-language model (`core.models._vision_language_from_files`)
    # its attention bypasses transformers' interface: it runs eager, whatever --attention says
    eager_only: bool = False

    def count_tokens(self, text: str) -> int | None:
        """Tokens of `text` with the special tokens the model adds, or None without a
        tokenizer.json."""
        if self.tokenizer_file is None:
            return None
        return self.count_lengths([text])[0]

    def count_lengths(self, texts: list[str | tuple[str, str]]) -> list[int]:
        """Tokens of each text (or (text, pair)) with the special tokens the model adds, and a
        decoder's BOS where attnviz puts it first (`core.tokens.encode`); the model must have
        a tokenizer.json."""
        assert self.tokenizer_file is not None
        path = str(self.tokenizer_file)
        found = _counting_tokenizer(path, os.stat(path).st_mtime_ns).encode_batch(texts)
        bos = self.bos_id if self.causal else None
        return [len(e.ids) + (bos is not None and e.ids[:1] != [bos]) for e in found]

    def check_length(self, text: str, truncate: bool) -> None:
        """Raise TextTooLongError for a text over the model's limit (unless it will be cut)."""
        if truncate or self.max_tokens is None:
            return
        n_tokens = self.count_tokens(text)
        if n_tokens is not None and n_tokens > self.max_tokens:
            raise too_long(n_tokens, self.max_tokens)


@functools.lru_cache(maxsize=4)
def _counting_tokenizer(path: str, modified: int) -> Any:
    """tokenizer.json at `path` as it was at `modified` (ns), loaded once a process (the
    refusals before loading count a text's tokens more than once): no truncation, no
    padding; one line naming the file where it is not one tokenizers reads."""
    from attnviz.core.checkpoint import tokenizer_file

    tokenizer = tokenizer_file(Path(path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def too_long(n_tokens: int, limit: int) -> TextTooLongError:
    """The error for a text of `n_tokens` when the model takes at most `limit`."""
    return TextTooLongError(
        f"text is {n_tokens} tokens long; this model takes at most {limit} "
        "(pass --truncate to cut it)"
    )


@dataclass(frozen=True)
class LoadedModel:
    """A model in eval mode, its fast tokenizer and its facts."""

    model: Any
    tokenizer: Any
    info: ModelInfo
    device: str
    processor: Any = None  # a vision-language model's processor (`core.vlm`)


def language_config(config: Any) -> Any:
    """Where a loaded model's numbers are (layers, heads, widths, special tokens): a
    vision-language model's text config (transformers' `get_text_config()`), else the config
    itself (an encoder-decoder model's own names its stacks)."""
    return config if config.is_encoder_decoder else config.get_text_config()


def first_int(config: dict[str, Any], *keys: str) -> Any:
    """The first of `keys` that config.json gives as a whole number, or None."""
    return next((config[k] for k in keys if isinstance(config.get(k), int)), None)
