"""Encoder-decoder models: the three attention stacks against transformers' own
`encoder_attentions`, `decoder_attentions` and `cross_attentions`, on tiny random T5, BART,
mBART and Marian models saved with real tokenizers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from seq2seq_models import SEQ2SEQ

from attnviz.core.extract import attend_stacks
from attnviz.core.seq2seq import encode_source_target, pad_pairs
from attnviz.errors import InputError, TextTooLongError

STACKS = ("encoder", "decoder", "cross")
SOURCE, TARGET = "The cat sat on the mat.", "Die Katze saß auf der Matte."


def _reference(loaded, item) -> dict[str, np.ndarray]:
    """transformers' own attentions of one source and target, (L, H, T, S) per stack."""
    with torch.no_grad():
        out = loaded.model(**pad_pairs(loaded, [item]), output_attentions=True)
    found = zip(STACKS, (out.encoder_attentions, out.decoder_attentions, out.cross_attentions))
    return {stack: torch.stack(layers)[:, 0].numpy() for stack, layers in found}


@pytest.mark.parametrize("arch", SEQ2SEQ)
def test_every_stack_equals_transformers_batched_or_alone(loaded_seq2seq, arch):
    loaded = loaded_seq2seq[arch]
    items = [
        encode_source_target(loaded, SOURCE, TARGET),
        encode_source_target(loaded, "A quick brown fox!", "Ein Fuchs!"),
    ]
    batched = attend_stacks(loaded, items, STACKS)
    for item, found in zip(items, batched):
        reference = _reference(loaded, item)
        alone = attend_stacks(loaded, [item], STACKS)[0]
        for stack in STACKS:
            att = found[stack]
            assert att.weights.shape == reference[stack].shape
            np.testing.assert_allclose(att.weights, reference[stack], atol=1e-5)
            np.testing.assert_allclose(att.weights, alone[stack].weights, atol=1e-6)
            np.testing.assert_allclose(att.weights.sum(-1), 1.0, atol=1e-5)
            assert att.stack == stack and att.target == item.target.text


@pytest.mark.parametrize("arch", SEQ2SEQ)
def test_stacks_have_their_own_shapes_tokens_and_counts(loaded_seq2seq, arch):
    loaded = loaded_seq2seq[arch]
    item = encode_source_target(loaded, SOURCE, TARGET)
    found = attend_stacks(loaded, [item], STACKS)[0]
    n_source, n_target = len(item.source), len(item.target)
    encoder, decoder, cross = found["encoder"], found["decoder"], found["cross"]
    assert encoder.weights.shape[-2:] == (n_source, n_source)
    assert decoder.weights.shape[-2:] == (n_target, n_target)
    assert cross.weights.shape[-2:] == (n_target, n_source)
    # the decoder reads its start token, then the target; the target's EOS is not read
    assert item.target.ids[0] == loaded.model.config.decoder_start_token_id
    assert item.target.ids[-1] != loaded.model.config.eos_token_id
    assert cross.tokens == item.target.tokens and cross.key_tokens == item.source.tokens
    assert encoder.key_tokens == encoder.tokens == item.source.tokens
    # causal: no decoder query sees a later target token
    assert np.all(np.triu(decoder.weights, k=1) == 0)
    assert decoder.info.causal and not cross.info.causal and not encoder.info.causal
    for stack, att in found.items():
        _, n_layers, n_heads = next(e for e in loaded.info.stacks if e[0] == stack)
        assert att.weights.shape[:2] == (n_layers, n_heads)
        assert att.info.stack == stack


@pytest.mark.parametrize("arch", SEQ2SEQ)
def test_generate_reads_what_the_model_wrote_greedily(loaded_seq2seq, arch):
    loaded = loaded_seq2seq[arch]
    item = encode_source_target(loaded, SOURCE, generate=6)
    assert item.generated
    ids = torch.tensor([item.source.ids])
    with torch.no_grad():
        wrote = loaded.model.generate(
            input_ids=ids, max_new_tokens=6, do_sample=False, num_beams=1, use_cache=False
        )[0].tolist()
    eos = loaded.model.config.eos_token_id
    expected = wrote[:-1] if wrote[-1] == eos else wrote
    assert list(item.target.ids) == expected
    assert 1 <= len(item.target) <= 7
    # the attention it used is the attention of teacher forcing on what it wrote
    found = attend_stacks(loaded, [item], STACKS)[0]
    reference = _reference(loaded, item)
    for stack in STACKS:
        np.testing.assert_allclose(found[stack].weights, reference[stack], atol=1e-5)
    assert any("wrote the target itself" in note for note in found["cross"].notes)


def test_layers_are_checked_against_each_stack(loaded_seq2seq):
    loaded = loaded_seq2seq["bart"]  # 2 encoder layers of 4 heads, 3 decoder layers of 2
    item = encode_source_target(loaded, SOURCE, TARGET)
    assert attend_stacks(loaded, [item], ("cross",), layers=[2])[0]["cross"].layers == (2,)
    with pytest.raises(InputError, match="layer 2 out of range: this model has layers 0–1"):
        attend_stacks(loaded, [item], ("encoder",), layers=[2])
    with pytest.raises(InputError, match="head 2 out of range: this model has heads 0–1"):
        loaded.info.of_stack("cross").pick_heads([2])


def test_bad_input_is_one_clear_error(loaded_seq2seq, bundled):
    loaded = loaded_seq2seq["t5"]
    with pytest.raises(InputError, match="--target needs an encoder-decoder model"):
        encode_source_target(bundled, SOURCE, TARGET)
    with pytest.raises(InputError, match="--stack cross: .* has one attention stack"):
        bundled.info.of_stack("cross")
    with pytest.raises(InputError, match="--target text is empty"):
        encode_source_target(loaded, SOURCE, "  ")
    with pytest.raises(TextTooLongError, match="target is 81 tokens long .* at most 64"):
        encode_source_target(loaded, SOURCE, " ".join(["cat"] * 80))


def test_the_files_tell_the_stacks_before_loading(seq2seq_dirs):
    from attnviz.core.models import describe

    spec = describe(str(seq2seq_dirs["marian"]))
    assert spec.stacks == (("encoder", 2, 4), ("decoder", 3, 2), ("cross", 3, 2))
    assert spec.of_stack("decoder").n_layers == 3
    with pytest.raises(InputError, match="layer 3 out of range"):
        spec.of_stack("cross").pick_layers([3])
