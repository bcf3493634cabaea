"""A vision-language checkpoint given text alone is read through its language model (issue 59
item 2): LLaVA, Gemma 3, Qwen2-VL, Mistral 3 and Idefics 3, each a tiny random model of two
layers and four heads (a tiny vision tower of two layers beside it) saved as a user's
checkpoint is. Its text config's numbers are read before loading; `show` draws the language
model's views, and the numbers are the language model's own eager attention.
"""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app
from tests.conftest import _sentencepiece_tokenizer

runner = CliRunner()
TEXT = "The cat sat on the mat because it was tired."

# fmt: off
_TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=64, pad_token_id=0,
             bos_token_id=1, eos_token_id=2)
_VISION = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
               image_size=32, patch_size=8)
# model type: (its language model's type and fields, its vision tower's, its own)
KINDS = {
    "llava": ({"model_type": "llama"}, {"model_type": "clip_vision_model", **_VISION}, {}),
    "gemma3": ({"model_type": "gemma3_text", "sliding_window": 4, "query_pre_attn_scalar": 8,
                "layer_types": ["sliding_attention", "full_attention"]},
               {"model_type": "siglip_vision_model", **_VISION}, {"mm_tokens_per_image": 4}),
    # M-RoPE: the rotary halves of a head split between time, height and width (1 + 1 + 2)
    "qwen2_vl": ({"model_type": "qwen2_vl_text", "rope_parameters": {
                     "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}},
                 {"depth": 2, "embed_dim": 32, "num_heads": 4, "hidden_size": 32,
                  "mlp_ratio": 2, "patch_size": 8}, {}),
    "mistral3": ({"model_type": "mistral"},
                 {"model_type": "pixtral", **_VISION, "head_dim": 8}, {}),
    "idefics3": ({"model_type": "llama"}, _VISION, {"scale_factor": 2}),
}
# fmt: on


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{model type: a folder with the tiny vision-language model and a tokenizer}."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    root = tmp_path_factory.mktemp("vision-language")
    tokenizer = _sentencepiece_tokenizer()
    vocab = len(tokenizer)
    found = {}
    for kind, (text, vision, own) in KINDS.items():
        config = AutoConfig.for_model(
            kind, text_config={**_TEXT, **text, "vocab_size": vocab}, vision_config=vision,
            image_token_id=vocab - 1, **own,
        )  # fmt: skip
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(config)
        with torch.no_grad():  # scores far from uniform
            for parameter in model.parameters():
                if parameter.dim() >= 2:
                    parameter.normal_(0.0, 0.3)
        model.save_pretrained(root / kind)
        tokenizer.save_pretrained(root / kind)
        found[kind] = root / kind
    return found


def _language_models_eager(folder, ids):
    """The language model alone (`get_decoder()`) running eager attention over `ids`: its
    own `output_attentions`, (L, H, T, T)."""
    import torch
    from transformers import AutoModelForImageTextToText

    whole = AutoModelForImageTextToText.from_pretrained(folder, attn_implementation="eager")
    with torch.no_grad():
        out = whole.eval().get_decoder()(input_ids=torch.tensor([ids]), output_attentions=True)
    return np.stack([layer[0].numpy() for layer in out.attentions])


@pytest.mark.parametrize("kind", KINDS)
def test_text_alone_is_the_language_models_eager_attention(kind, folders):
    found = attnviz.attention(TEXT, model=str(folders[kind]), device="cpu")
    assert found.info.model_type == kind and found.info.causal
    assert (found.info.n_layers, found.info.n_heads) == (2, 4)  # not the vision tower's too
    ids = _sentencepiece_tokenizer()(TEXT)["input_ids"]
    assert np.abs(found.weights - _language_models_eager(folders[kind], ids)).max() <= 1e-5
    assert not np.triu(found.weights, k=1).any()  # a decoder's: causal


@pytest.mark.parametrize("kind", ["llava", "gemma3", "qwen2_vl"])
def test_show_draws_the_language_models_views(kind, folders, tmp_path):
    result = runner.invoke(app, ["show", TEXT, "-m", str(folders[kind]), "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "2×4 heads" in result.output
    (folder,) = tmp_path.iterdir()
    pngs = sorted(path.name for path in folder.glob("*.png"))
    assert len(pngs) == 1 + 2 + 2 * 4 and "layer-01-head-03.png" in pngs


def test_the_text_configs_numbers_are_read_before_loading(folders, monkeypatch):
    from attnviz.core import models

    spec = models.describe(str(folders["gemma3"]))
    assert (spec.n_layers, spec.n_heads, spec.causal, spec.max_tokens) == (2, 4, True, 64)

    def not_loaded(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", not_loaded)
    result = runner.invoke(app, ["show", TEXT, "-m", str(folders["llava"]), "--layer", "2"])
    assert result.exit_code == 2, result.output
    assert "layer 2 out of range: this model has layers 0–1" in result.output


def test_a_model_of_parts_transformers_reads_no_text_through_is_one_line(tmp_path):
    """ALIGN holds a text encoder and a vision tower, and is no image-text-to-text model:
    refused by its config, before any weights load (the folder holds none)."""
    from transformers import AutoConfig

    text = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    AutoConfig.for_model("align", text_config=text).save_pretrained(tmp_path)
    _sentencepiece_tokenizer().save_pretrained(tmp_path)
    result = runner.invoke(app, ["show", TEXT, "-m", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "('align') holds a text model and others" in result.output
