"""Attention extraction: real properties of real outputs, for every architecture."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from attnviz.analysis.transforms import hide_special, word_view
from attnviz.core.extract import attend, extract
from attnviz.core.tokens import encode
from attnviz.errors import InputError, ModelLoadError, UnsupportedModelError
from tests.conftest import ARCHITECTURES, LLAMA_FAMILY, TINY, synthetic_attention

SENTENCES = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog, twice!"]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_rows_sum_to_one_and_shape(loaded_tiny, arch):
    loaded = loaded_tiny[arch]
    att = extract(loaded, SENTENCES[1])
    n = len(att.tokens)
    assert att.weights.shape == (TINY["layers"], TINY["heads"], n, n)
    assert np.allclose(att.weights.sum(-1), 1.0, atol=1e-5)
    assert (att.weights >= 0).all()
    config = loaded.model.config
    head_dim = getattr(config, "head_dim", None) or TINY["hidden"] // TINY["heads"]
    assert loaded.info.n_heads == TINY["heads"] and loaded.info.d_head == head_dim


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_causal_models_never_look_ahead(loaded_tiny, arch):
    att = extract(loaded_tiny[arch], SENTENCES[1])
    above = np.triu(np.ones(att.weights.shape[-2:], bool), k=1)
    future = att.weights[..., above]
    if loaded_tiny[arch].info.causal:
        assert arch == "gpt2" or arch in LLAMA_FAMILY
        assert (future == 0).all()
    else:
        assert future.max() > 1e-3  # encoders do look ahead; the test above can fail


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_batched_equals_unbatched(loaded_tiny, arch):
    loaded = loaded_tiny[arch]
    encoded = [encode(loaded, s) for s in SENTENCES]
    assert len(encoded[0]) != len(encoded[1])  # so the shorter one is padded
    batched = attend(loaded, encoded)
    for item, together in zip(encoded, batched):
        alone = attend(loaded, [item])[0]
        assert together.weights.shape == alone.weights.shape
        np.testing.assert_allclose(together.weights, alone.weights, atol=1e-5)


def test_bundled_model_facts_and_tokens(bundled):
    info = bundled.info
    assert (info.n_layers, info.n_heads, info.d_model, info.d_head) == (6, 12, 384, 32)
    assert info.max_tokens == 512 and not info.causal
    att = extract(bundled, "Unbelievably, the cat sat.")
    assert att.tokens[0] == "[CLS]" and att.tokens[-1] == "[SEP]"
    assert "##ly" in att.tokens or any(t.startswith("##") for t in att.tokens)
    assert att.special.tolist() == [True] + [False] * (len(att.tokens) - 2) + [True]
    assert np.allclose(att.weights.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_accents_cjk_and_emoji(loaded_tiny, bundled, arch):
    loaded = bundled if arch == "bert" else loaded_tiny[arch]
    text = "Héllo 世界 🙂 naïve café"
    att = word_view(extract(loaded, text))
    content = [w for w, s in zip(att.tokens, att.special) if not s]
    # BERT's basic tokenizer splits CJK characters apart; byte-level BPE keeps the run together.
    cjk = ["世", "界"] if arch == "bert" else ["世界"]
    assert content == ["Héllo", *cjk, "🙂", "naïve", "café"]
    assert np.allclose(att.weights.sum(-1), 1.0, atol=1e-5)


def test_byte_level_tokens_are_labelled_with_text(loaded_tiny):
    att = extract(loaded_tiny["gpt2"], "The cat sat")
    # raw BPE pieces would read 'ĠThe', 'Ġcat'…; BOS is put first, as the decoder's sink
    assert att.tokens == ("<|endoftext|>", "The", "cat", "sat")
    assert att.special.tolist() == [True, False, False, False]


def test_word_view_sums_to_words_and_averages_from_words():
    # Three tokens; tokens 1 and 2 are pieces of one word.
    weights = np.array([[[[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.4, 0.4, 0.2]]]])
    att = synthetic_attention(weights, ["a", "b", "##c"], words=[0, 1, 1], word_labels=["a", "bc"])
    words = word_view(att)
    assert words.tokens == ("a", "bc") and words.unit == "word"
    expected = np.array(
        [
            [0.5, 0.3 + 0.2],  # from "a": to "a", to "bc" (sum of its pieces)
            [(0.1 + 0.4) / 2, (0.6 + 0.3 + 0.4 + 0.2) / 2],  # from "bc": mean of its pieces' rows
        ]
    )
    np.testing.assert_allclose(words.weights[0, 0], expected, atol=1e-6)
    assert np.allclose(words.weights.sum(-1), 1.0)


def test_hide_special_renormalises_and_says_so():
    weights = np.array(
        [[[[0.6, 0.1, 0.2, 0.1], [0.5, 0.2, 0.2, 0.1], [0.2, 0.3, 0.3, 0.2], [0.1, 0.1, 0.1, 0.7]]]]
    )
    att = synthetic_attention(
        weights, ["[CLS]", "x", "y", "[SEP]"], special=[True, False, False, True]
    )
    hidden = hide_special(att)
    assert hidden.tokens == ("x", "y")
    np.testing.assert_allclose(hidden.weights[0, 0], [[0.5, 0.5], [0.5, 0.5]], atol=1e-6)
    assert any("special tokens hidden (2 of 4)" in note for note in hidden.notes)


def test_hide_special_on_real_model_keeps_rows_summing_to_one(bundled):
    att = hide_special(word_view(extract(bundled, "The committee approved the budget.")))
    assert "[CLS]" not in att.tokens and "[SEP]" not in att.tokens
    assert np.allclose(att.weights.sum(-1), 1.0, atol=1e-5)


def test_empty_text_is_refused(loaded_tiny):
    for text in ["", "   \n\t"]:
        with pytest.raises(InputError, match="empty"):
            encode(loaded_tiny["bert"], text)


def test_overlong_text_names_both_lengths_or_is_truncated_with_a_note(loaded_tiny):
    loaded = loaded_tiny["bert"]
    text = " ".join(["word"] * 100)
    with pytest.raises(InputError, match=r"102 tokens long; this model takes at most 64"):
        encode(loaded, text)
    cut = encode(loaded, text, truncate=True)
    assert len(cut) == 64 and cut.tokens[-1] == "[SEP]"
    assert "kept the first 64 of 102 tokens" in cut.notes[0]


def test_unknown_model_path_and_offline_hub_id(tmp_path):
    from attnviz.core.models import load_model

    with pytest.raises(ModelLoadError, match="no model directory"):
        load_model(str(tmp_path / "missing"))
    with pytest.raises(ModelLoadError, match="not in the Hugging Face cache"):
        load_model("nobody-here/not-a-real-model")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))


def test_an_encoder_decoder_outside_the_interface_is_refused_before_the_weights_load(tmp_path):
    """FSMT computes attention in its own code, not through transformers' attention
    interface, and has two stacks, which attnviz finds through the interface alone: refused
    from its config, with no weights file there to load. (BLOOM and the other one-stack types
    run eager: tests/test_eager_types.py.)"""
    from transformers import FSMTConfig

    from attnviz.core.models import load_model

    config = FSMTConfig(langs=["en", "de"], d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2)  # fmt: skip
    config.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="'fsmt' is an encoder-decoder model that "
                       "computes its attention in its own code"):  # fmt: skip
        load_model(str(tmp_path))


def test_layer_and_head_ranges(bundled):
    assert bundled.info.pick_layers(None) == list(range(6))
    assert bundled.info.pick_heads([3, 1, 3]) == [1, 3]
    with pytest.raises(InputError, match="layer 6 out of range: this model has layers 0–5"):
        bundled.info.pick_layers([6])
    with pytest.raises(InputError, match="head -1 out of range: this model has heads 0–11"):
        bundled.info.pick_heads([-1])


def test_unreachable_hub_fails_at_once_without_retries(monkeypatch):
    """Online mode but no network: one clear error straight away, not 23 s of retries. What
    is asserted is what it does (one look in the cache, one name lookup, no waiting), not how
    long it took: a timing belongs in a benchmark."""
    import socket
    import time

    from attnviz.core import models

    lookups, asked = [], []

    def no_dns(host, *_args, **_kwargs):
        lookups.append(host)
        raise socket.gaierror("no network in this test")

    def never_online(*_args, **kwargs):
        asked.append(kwargs.get("local_files_only"))
        raise OSError("not cached")

    def no_waiting(seconds):
        raise AssertionError(f"slept {seconds} s: a retry")

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", never_online)
    monkeypatch.setattr(time, "sleep", no_waiting)
    with pytest.raises(ModelLoadError, match="the hub could not be reached"):
        models.load_model("some-org/some-model")
    assert asked == [True]  # the local cache only: the hub itself is never tried
    assert lookups == ["huggingface.co"]  # one lookup, no retry


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_decoder_tokens_read_as_text_and_bos_is_special(loaded_tiny, arch):
    att = extract(loaded_tiny[arch], "The cat sat, über")
    assert att.tokens.count("<s>") + att.tokens.count("<|endoftext|>") == 1  # never twice
    # SentencePiece's tokenizer adds BOS itself; for the byte-level one (no BOS of its own)
    # attnviz puts it first: either way a special first token, like [CLS]
    bos = "<s>" if arch == "llama" else "<|endoftext|>"
    assert att.tokens[0] == bos and att.special.tolist() == [True] + [False] * (len(att.tokens) - 1)
    assert hide_special(att).tokens[0] == "The"
    content = [t for t, s in zip(att.tokens, att.special) if not s]
    assert content[:4] == ["The", "cat", "sat", ","]  # not '▁The', 'Ġcat' or '<0x2C>'
    assert "ü" in content and not any(t.startswith(("▁", "Ġ", "<0x")) for t in content)


def test_chosen_layers_alone_are_kept_and_match_all_layers(loaded_tiny):
    loaded = loaded_tiny["llama"]
    every = extract(loaded, SENTENCES[0])
    one = extract(loaded, SENTENCES[0], layers=[1])
    assert one.weights.shape[0] == 1 and one.layers == (1,)
    # layer 0 unwanted runs SDPA, wanted its output is attnviz's blocks times V: layer 1's
    # input differs by float32 rounding, no more
    np.testing.assert_allclose(one.pattern(1, 2), every.pattern(1, 2), rtol=0, atol=1e-6)
    with pytest.raises(
        InputError, match="layer 0 was not extracted; this attention holds layers 1"
    ):
        one.pattern(0, 0)


def _pair_attention():
    """[CLS] a ##b c [SEP] d [SEP]: a sentence pair (segments 0 then 1) whose word "ab" is two
    pieces; 1 layer, 2 heads of random rows, one row (head 1, query "c") all on [CLS] and [SEP]."""
    rng = np.random.default_rng(11)
    logits = rng.normal(size=(1, 2, 7, 7))
    weights = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    weights[0, 1, 3] = [0.5, 0, 0, 0, 0.25, 0, 0.25]
    tokens = ["[CLS]", "a", "##b", "c", "[SEP]", "d", "[SEP]"]
    att = synthetic_attention(
        weights, tokens, special=[True, False, False, False, True, False, True],
        words=[0, 1, 1, 2, 3, 4, 5], word_labels=["[CLS]", "ab", "c", "[SEP]", "d", "[SEP]"],
    )  # fmt: skip
    return replace(att, segments=(0, 0, 0, 0, 0, 1, 1), notes=("given",))


def test_word_view_carries_every_field_and_matches_a_loop():
    att = _pair_attention()
    words = word_view(att)
    a = att.weights.astype(np.float64)
    pieces = {0: [0], 1: [1, 2], 2: [3], 3: [4], 4: [5], 5: [6]}  # word -> its tokens
    expected = np.zeros((1, 2, 6, 6))
    for u, from_pieces in pieces.items():
        for v, to_pieces in pieces.items():
            # to a word: the sum over its pieces; from a word: the mean over its pieces
            expected[..., u, v] = sum(a[..., i, to_pieces].sum(-1) for i in from_pieces) / len(
                from_pieces
            )
    np.testing.assert_allclose(words.weights, expected, atol=1e-6)
    assert words.weights.dtype == np.float32 and words.unit == "word"
    assert words.tokens == ("[CLS]", "ab", "c", "[SEP]", "d", "[SEP]")
    assert words.special.tolist() == [True, False, False, True, False, True]
    assert words.words == (0, 1, 2, 3, 4, 5) and words.word_labels == att.word_labels
    assert words.segments == (0, 0, 0, 0, 1, 1)  # each word keeps its first piece's sentence
    assert words.notes == ("given", "word view: pieces merged into words")
    assert (words.text, words.info, words.hidden_special) == (att.text, att.info, False)
    assert word_view(words) is words  # already words: nothing to merge
    assert word_view(replace(att, segments=None)).segments is None


def test_hide_special_carries_every_field_and_matches_a_loop():
    att = _pair_attention()
    hidden = hide_special(att)
    a = att.weights.astype(np.float64)
    kept = [1, 2, 3, 5]
    expected = np.zeros((1, 2, 4, 4))
    shares = []
    for h in range(2):
        for row, i in enumerate(kept):
            share = a[0, h, i, kept].sum()
            shares.append(share)
            # each kept row renormalised; a row with nothing left stays all zeros
            expected[0, h, row] = a[0, h, i, kept] / share if share > 0 else 0.0
    assert hidden.weights[0, 1, 2].tolist() == [0.0] * 4  # head 1's row of "c" had nothing left
    np.testing.assert_allclose(hidden.weights, expected, atol=1e-6)
    assert hidden.weights.dtype == np.float32 and hidden.hidden_special
    assert hidden.tokens == ("a", "##b", "c", "d") and not hidden.special.any()
    assert hidden.words == (0, 0, 1, 2) and hidden.word_labels == ("ab", "c", "d")
    assert hidden.segments == (0, 0, 0, 1) and hidden.unit == "token"
    removed = 1 - np.mean(shares)  # the share of attention the hidden tokens held
    assert hidden.notes == (
        "given",
        f"special tokens hidden (3 of 7); they held {removed:.0%} of attention on average, "
        "and each row was renormalised",
    )
    assert hide_special(replace(att, segments=None)).segments is None

    plain = hide_special(hidden)  # nothing special left: the same weights, and a note
    assert plain.weights is hidden.weights and plain.tokens == hidden.tokens
    assert plain.notes == (*hidden.notes, "no special tokens to hide")
    only = replace(att, special=np.ones(7, bool))
    with pytest.raises(InputError, match="^the text has only special tokens; nothing is left"):
        hide_special(only)


@pytest.mark.parametrize("apply", [word_view, hide_special])
def test_transforms_work_a_layer_at_a_time(apply):
    """--words and --hide-special compute in float64 a layer at a time: the numpy memory they
    allocate at the peak is under twice the float32 attention of 6 layers (its result, at
    most as large, and one layer's work; a float64 copy of every layer alone is twice it)."""
    import tracemalloc

    n = 200
    weights = np.random.default_rng(0).random((6, 2, n, n)) ** 3
    tokens = ["[CLS]"] + [f"t{i}" for i in range(n - 2)] + ["[SEP]"]
    special = [True] + [False] * (n - 2) + [True]
    pieces = [0] + [1 + i // 2 for i in range(n - 2)] + [(n - 3) // 2 + 2]  # two per word
    att = synthetic_attention(
        weights / weights.sum(-1, keepdims=True), tokens, special, pieces,
        [f"w{i}" for i in range(pieces[-1] + 1)],
    )  # fmt: skip
    tracemalloc.start()
    try:
        apply(att)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * att.weights.nbytes


def test_transform_merges_words_first_then_hides():
    from attnviz.analysis.transforms import transform

    att = _pair_attention()
    assert transform(att) is att
    assert transform(att, words=True).tokens == word_view(att).tokens
    assert transform(att, hide_special_tokens=True).tokens == hide_special(att).tokens
    both = transform(att, words=True, hide_special_tokens=True)
    assert both.tokens == ("ab", "c", "d") and both.unit == "word" and both.hidden_special
    np.testing.assert_array_equal(both.weights, hide_special(word_view(att)).weights)
    # the other order gives other numbers: the two pieces of "ab" lose different shares
    assert not np.allclose(both.weights, word_view(hide_special(att)).weights, atol=1e-3)
