"""Any model transformers runs: attnviz's attention function records each layer's
probabilities inside the model's own attention call, and they equal that model's eager
`output_attentions` within 1e-5, for every model type in `any_models.TYPES` (tiny random
models from configs, two layers each), every stack of the encoder-decoders among them.

The layers' outputs (the hidden states) equal the eager pass's too: the function's output is
the model's attention, not only its probabilities.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from attnviz.core import capture, recording
from tests import any_models

EXACT = 1e-5


def _loaded(model):
    """What `capture.run` reads of a loaded model, for a model built here from its config."""
    info = SimpleNamespace(implementation="sdpa", name=model.config.model_type)
    return SimpleNamespace(model=model, info=info)


def _eager(model, given):
    """The model's own probabilities, {stack: [(B, H, T, S) a layer]}, and its last states."""
    import torch

    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(**given, output_attentions=True)
    if model.config.is_encoder_decoder:
        stacks = {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions,
                  "cross": out.cross_attentions}  # fmt: skip
        return stacks, out.last_hidden_state
    return {None: out.attentions}, out.last_hidden_state


def _real_rows(given, stack):
    """(B, T) True for each real query of `stack`: the decoder's mask for its stacks."""

    name = "decoder_attention_mask" if stack in ("decoder", "cross") else "attention_mask"
    mask = given.get(name)
    return None if mask is None else mask.bool()


@pytest.mark.parametrize("model_type", sorted(any_models.TYPES))
def test_recorded_probabilities_equal_eager(model_type):
    import torch

    model = any_models.build(model_type)
    given = any_models.inputs(model_type, model)
    expected, states = _eager(model, given)
    recording.register()
    model.set_attn_implementation(recording.implementation(model))
    seen: dict = {stack: {} for stack in expected}
    recorders = [
        capture.Each(range(len(layers)), ("probs",), seen[stack].__setitem__, stack=stack)
        for stack, layers in expected.items()
    ]
    found = capture.run(_loaded(model), given, recorders, block_rows=3)
    for stack, layers in expected.items():
        real = _real_rows(given, stack)
        for layer, own in enumerate(layers):
            probs = seen[stack][layer]["probs"]
            assert probs.shape == own.shape, (stack, layer)
            diff = (probs - own.float()).abs().amax(dim=(1, 3))  # (B, T)
            if real is not None:
                diff = diff[real]
            assert float(diff.max()) <= EXACT, (stack, layer)
    last = found.last_hidden_state
    real = _real_rows(given, "decoder" if model.config.is_encoder_decoder else None)
    gap = (last - states).abs().amax(dim=-1)  # relative to the states' size (MobileBERT's grow)
    scale = max(1.0, float(states.abs().max()))
    assert float((gap[real] if real is not None else gap).max()) <= EXACT * scale
    assert torch.isfinite(last).all()


def test_every_listed_type_reads_through_the_interface_and_bypassers_do_not():
    """The matrix's types call transformers' attention function (`adapters.caller` finds a
    module in each layer); the bypassing types have none, and run eager
    (tests/test_eager_types.py)."""
    from attnviz.core.layer_map import generic

    assert len(any_models.TYPES) >= 30
    for model_type in any_models.BYPASS:
        model = any_models.build(model_type)
        assert not any(generic.calls_interface(m) for m in model.modules()), model_type


def types_paragraph() -> str:
    """The tested types as docs/models.md lists them: sorted, wrapped at 100 columns."""
    import textwrap

    names = ", ".join(f"`{kind}`" for kind in sorted(any_models.TYPES))
    return textwrap.fill(f"{len(any_models.TYPES)} types: {names}.", 100, break_on_hyphens=False)


def test_models_doc_lists_the_tested_types():
    """docs/models.md's list is this matrix's (write it: `python tests/test_any_model.py`)."""
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "models.md").read_text(encoding="utf-8")
    start = doc.index("<!-- any-model-types")
    block = doc[doc.index("\n", start) + 1 : doc.index("<!-- /any-model-types -->")]
    assert block.strip() == types_paragraph()


if __name__ == "__main__":  # rewrite docs/models.md's list of tested types
    import re
    from pathlib import Path

    path = Path(__file__).parents[1] / "docs" / "models.md"
    text = path.read_text(encoding="utf-8")
    pattern = r"(<!-- any-model-types[^\n]*\n).*?(<!-- /any-model-types -->)"
    path.write_text(re.sub(pattern, lambda m: m[1] + types_paragraph() + "\n" + m[2], text,
                           flags=re.S), encoding="utf-8")  # fmt: skip
