"""The model runs attnviz's attention function; each wanted layer's probabilities are made
from the model's own q and k in blocks of query rows.

Every family's recorded probabilities equal its own eager attention (transformers'
`output_attentions`) within 1e-5 on every layer, on a padded batch, through `capture` and the
extraction on top of it; the blocks of rows put together are the same whatever their size.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.core import capture
from attnviz.core.extract import attend, attend_stacks
from attnviz.core.models import load_model
from attnviz.core.seq2seq import encode_source_target
from attnviz.core.tokens import encode, pad
from tests.conftest import ARCHITECTURES

TEXTS = (
    "The cat sat on the mat because it was tired of standing.",
    "A dog.",
    "Heads attend; the the cat cat sat sat on on mats mats again and again.",
)
TOLERANCE = 1e-5


def _eager_probs(loaded, batch):
    """transformers' own attention probabilities of every layer, (L, B, H, T, T)."""
    import torch

    inputs = pad(loaded, batch)
    with torch.inference_mode():
        out = loaded.model.base_model(**inputs, output_attentions=True)
    return np.stack([a.float().numpy() for a in out.attentions]), inputs["attention_mask"]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_recorded_equals_eager_every_layer(arch, loaded_tiny, eager_tiny):
    fast, eager = loaded_tiny[arch], eager_tiny[arch]
    assert not capture.records(eager.model)
    assert capture.records(fast.model)  # every family, Gemma2's soft cap too
    batch = [encode(fast, text) for text in TEXTS]
    reference, mask = _eager_probs(eager, batch)  # (L, B, H, T, T)
    found = attend(fast, batch)
    for row, att in enumerate(found):
        n = int(mask[row].sum())
        theirs = reference[:, row, :, :n, :n]
        assert att.weights.shape == theirs.shape
        assert np.abs(att.weights - theirs).max() <= TOLERANCE
        assert np.allclose(att.weights.sum(axis=-1), 1.0, atol=1e-5)
    # the attention extracted eagerly, by attnviz's own path, is the same too
    for ours, theirs in zip(found, attend(eager, batch)):
        assert np.abs(ours.weights - theirs.weights).max() <= TOLERANCE


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_recorded_stacks_equal_eager(arch, seq2seq_dirs, loaded_seq2seq):
    import torch

    fast = loaded_seq2seq[arch]
    eager = load_model(str(seq2seq_dirs[arch]), "cpu", "eager")
    assert capture.records(fast.model)
    pairs = [("The cat sat on the mat.", "Die Katze sass auf der Matte."), ("Hi.", "Hallo du da.")]
    batch = [encode_source_target(fast, s, t) for s, t in pairs]
    stacks = ("encoder", "decoder", "cross")
    ours = attend_stacks(fast, batch, stacks)
    theirs = attend_stacks(eager, batch, stacks)
    from attnviz.core.seq2seq import pad_pairs

    with torch.inference_mode():
        out = eager.model(**pad_pairs(eager, batch), output_attentions=True)
    raw = {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions,
           "cross": out.cross_attentions}  # fmt: skip
    for row, (mine, reference) in enumerate(zip(ours, theirs)):
        for stack in stacks:
            got = mine[stack].weights
            t, s = got.shape[2:]
            model = np.stack([a[row, :, :t, :s].float().numpy() for a in raw[stack]])
            assert np.abs(got - model).max() <= TOLERANCE, stack
            assert np.abs(got - reference[stack].weights).max() <= TOLERANCE, stack


class _Rows:
    """A recorder that keeps the blocks of rows it is given, and which starts they had."""

    def __init__(self, layers):
        self.wants = {layer: ("rows",) for layer in layers}
        self.blocks: dict[int, list] = {layer: [] for layer in layers}

    def receive_rows(self, layer, start, rows):
        self.blocks[layer].append((start, rows.clone()))

    def receive(self, layer, tensors):
        assert tensors == {}  # nothing but rows was asked for

    def whole(self, layer):
        """The layer's matrix from its blocks; a decoder's block stops at its last query's
        key (W ≤ S), the later keys holding 0."""
        import torch

        starts = [start for start, _ in self.blocks[layer]]
        assert starts == sorted(starts) and starts[0] == 0
        width = max(rows.shape[3] for _, rows in self.blocks[layer])
        padded = [torch.nn.functional.pad(rows, (0, width - rows.shape[3]))
                  for _, rows in self.blocks[layer]]  # fmt: skip
        return torch.cat(padded, dim=2).numpy()


@pytest.mark.parametrize("panels", [False, True], ids=["batched", "panels"])
@pytest.mark.parametrize("arch", ["bert", "llama", "gemma2"])
def test_block_sizes_give_the_same_rows(arch, panels, loaded_tiny, eager_tiny, monkeypatch):
    """Blocks of 1, 7 and T rows, recorded or cut from eager probabilities: one matrix; the
    scores of long rows, multiplied a panel of query rows at a time, too (here panels of 5
    rows)."""
    from attnviz.core import recording

    if panels:
        monkeypatch.setattr(recording, "PANEL_WIDTH", 1)
        monkeypatch.setattr(recording, "PANEL_ROWS", 5)
    loaded = loaded_tiny[arch]
    batch = [encode(loaded, text) for text in TEXTS]
    inputs = pad(loaded, batch)
    width = inputs["input_ids"].shape[1]
    layers = range(loaded.info.n_layers)
    wholes = []
    for model in (loaded, eager_tiny[arch]):
        for size in (1, 7, width):
            rows = _Rows(layers)
            capture.run(model, pad(model, batch), [rows], block_rows=size)
            assert all(len(rows.blocks[layer]) == -(-width // size) for layer in layers)
            wholes.append(np.stack([rows.whole(layer) for layer in layers]))
    # real queries: a padding query that sees no key (Gemma2's window past the text) is 0 in
    # attnviz's rows and uniform in eager's
    real = inputs["attention_mask"].bool().numpy()[None, :, None, :, None]  # (1, B, 1, T, 1)
    for other in wholes[1:]:
        assert np.abs(np.where(real, other - wholes[0], 0)).max() <= TOLERANCE
    recorded = wholes[:3]  # the same products in other shapes: float32 rounding at most
    assert all(np.abs(other - recorded[0]).max() <= 1e-6 for other in recorded[1:])


class _Entropies:
    """A rows recorder that also asks for each row's entropy (`capture.ENTROPY`)."""

    def __init__(self, layers):
        self.wants = {layer: (capture.ROWS, capture.ENTROPY) for layer in layers}
        self.found = {layer: [] for layer in layers}

    def receive(self, layer, tensors):
        assert not tensors  # nothing but rows and their entropies was asked for

    def receive_rows(self, layer, start, rows, entropy):
        assert entropy.shape == rows.shape[:3]  # (B, H, b)
        self.found[layer].append(entropy.numpy())


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_row_entropies_equal_those_of_the_eager_probabilities(arch, loaded_tiny, eager_tiny):
    """The entropy handed beside recorded rows (taken from the softmax's own sums) and
    beside eager ones (from each weight) equals −Σ p ln p of transformers' own probabilities,
    on every real query row of a padded batch, in blocks of 1 and 5 rows."""
    eager = eager_tiny[arch]
    batch = [encode(eager, text) for text in TEXTS]
    reference, mask = _eager_probs(eager, batch)  # (L, B, H, T, T)
    real = mask.bool().numpy()  # (B, T)
    p = reference.astype(np.float64)
    expected = -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=-1)  # (L, B, H, T)
    layers = range(eager.info.n_layers)
    for model in (loaded_tiny[arch], eager):
        for size in (1, 5):
            found = _Entropies(layers)
            capture.run(model, pad(model, batch), [found], block_rows=size)
            for layer in layers:
                ours = np.concatenate(found.found[layer], axis=-1)  # (B, H, T)
                diff = np.abs(ours - expected[layer]).transpose(0, 2, 1)[real]  # (real rows, H)
                assert diff.max() <= 1e-5, (model is eager, size, layer)


def test_no_whole_matrix_for_rows_alone(loaded_tiny, monkeypatch):
    """A recorder of rows alone never makes the function build a layer's whole matrix."""
    import torch

    loaded = loaded_tiny["llama"]
    batch = [encode(loaded, TEXTS[0])]
    width = pad(loaded, batch)["input_ids"].shape[1]
    made = []

    def watching(real):
        def watched(*shape, **kwargs):
            one = len(shape) == 1 and not isinstance(shape[0], int)
            made.append(tuple(shape[0]) if one else shape)
            return real(*shape, **kwargs)

        return watched

    for name in ("empty", "zeros"):
        monkeypatch.setattr(torch, name, watching(getattr(torch, name)))
    rows = _Rows(range(loaded.info.n_layers))
    capture.run(loaded, pad(loaded, batch), [rows], block_rows=5)
    assert not [shape for shape in made if len(shape) == 4 and shape[-2:] == (width, width)]
    assert all(rows.whole(layer).shape[2] == width for layer in rows.blocks)


def test_recording_can_fail(loaded_tiny, eager_tiny, monkeypatch):
    """The comparisons above can fail: a decoder's rows made without their causal mask (the
    function told that the layer is not causal) move far from the model's own."""
    from attnviz.core import recording

    loaded = loaded_tiny["llama"]
    batch = [encode(loaded, TEXTS[0])]
    reference, _ = _eager_probs(eager_tiny["llama"], batch)
    monkeypatch.setattr(recording, "_causal", lambda *args: False)
    wrong = attend(loaded, batch)[0].weights
    assert np.abs(wrong - reference[:, 0]).max() > 0.1


def test_block_rows_below_one_is_refused(loaded_tiny):
    loaded = loaded_tiny["bert"]
    from attnviz.errors import InputError

    with pytest.raises(InputError, match="at least 1"):
        capture.run(loaded, pad(loaded, [encode(loaded, "Hi.")]), [_Rows([0])], block_rows=0)


def test_the_api_and_cli_give_the_same_numbers_either_way():
    """`implementation="eager"` (the model's own probabilities) and the default SDPA path
    (recorded by attnviz's function) agree within 1e-5 through the API, and the CLI takes
    --attention."""
    import json

    from typer.testing import CliRunner

    import attnviz
    from attnviz.cli import app

    text = "The keys to the cabinet are on the table."
    fast = attnviz.attention(text, device="cpu")
    eager = attnviz.attention(text, device="cpu", implementation="eager")
    assert np.abs(fast.weights - eager.weights).max() <= TOLERANCE
    found = {}
    for way in ("sdpa", "eager"):
        result = CliRunner().invoke(
            app, ["show", text, "--json", "--no-images", "--device", "cpu", "--attention", way]
        )
        assert result.exit_code == 0, result.output
        found[way] = json.loads(result.stdout)
    for a, b in zip(found["sdpa"]["heads"], found["eager"]["heads"]):
        assert a["special_share"] == pytest.approx(b["special_share"], abs=1e-5)
    bad = CliRunner().invoke(app, ["show", text, "--attention", "flash"])
    assert bad.exit_code == 2


def test_a_layer_that_never_reaches_the_function_is_an_error(loaded_tiny, monkeypatch):
    """A wanted layer whose attention does not reach attnviz's function is one line naming
    the layer, not a recorder silently left without it."""
    from attnviz.errors import UnsupportedModelError

    loaded = loaded_tiny["llama"]
    real = capture.Callers.site

    def missing(self, module):
        found = real(self, module)
        return None if found == (None, 1) else found

    monkeypatch.setattr(capture.Callers, "site", missing)
    rows = _Rows(range(loaded.info.n_layers))
    with pytest.raises(UnsupportedModelError, match="layer 1 of 'llama' gave attnviz nothing"):
        capture.run(loaded, pad(loaded, [encode(loaded, TEXTS[0])]), [rows])


# ---------- --attention flash_attention_2, on the CPU ----------


def _flash_stand_in(handed):
    """transformers' `_lazy_imports` with flash-attn's kernels replaced by SDPA: it refuses
    any implementation name but flash_attention_2 (as transformers does, looking the name up
    as a hub kernel), and its kernels check the layout they are handed, (B, T, H, d) or a
    padded batch unpadded into (tokens, H, d) with each text's lengths, recording those
    lengths in `handed`, before computing SDPA (causal bottom-right, a sliding window)."""
    import torch
    from transformers.modeling_flash_attention_utils import _pad_input, _unpad_input

    def dense(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
              softcap=None, deterministic=False):  # fmt: skip
        assert q.dim() == 4 and q.shape[1] == k.shape[1], (q.shape, k.shape)  # (B, T, H, d)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, d)
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        n, s = q.shape[2], k.shape[2]
        offset = torch.arange(s)[None, :] - torch.arange(n)[:, None] - (s - n)  # key − query
        sees = torch.ones(n, s, dtype=torch.bool)
        if causal:
            sees &= offset <= 0
        if window_size[0] >= 0:
            sees &= offset >= -window_size[0]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, sees, scale=softmax_scale)
        return out.transpose(1, 2)

    def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
               dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
               softcap=None, deterministic=False):  # fmt: skip
        assert q.dim() == 3 and cu_seqlens_k[-1] == k.shape[0], (q.shape, cu_seqlens_k)
        handed.append(cu_seqlens_k.tolist())
        out = torch.empty_like(q)
        for b in range(len(cu_seqlens_q) - 1):
            rows = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]))
            keys = slice(int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1]))
            out[rows] = dense(q[None, rows], k[None, keys], v[None, keys], dropout_p,
                              softmax_scale, causal, window_size)[0]  # fmt: skip
        return out

    def lazy_imports(implementation, attention_wrapper=None, allow_all_kernels=False):
        if implementation != "flash_attention_2":
            raise ValueError(f"no flash attention implementation '{implementation}'")
        return dense, varlen, None, _pad_input, _unpad_input

    return lazy_imports


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_flash_layers_run_transformers_flash_path(arch, tiny_model_dirs, loaded_tiny, monkeypatch):
    """With --attention flash_attention_2 the layers nobody records run transformers' flash
    wrapper, named flash_attention_2 and handed the padding mask, (B, S): a padded batch's
    texts reach the kernel unpadded, one text whole; the recorded layer after them equals
    SDPA's (Mistral: a sliding window of 4, shorter than the texts)."""
    import transformers.modeling_flash_attention_utils as flash

    from attnviz.core.settings import Load

    handed = []
    monkeypatch.setattr(flash, "_lazy_imports", _flash_stand_in(handed))
    for name in (
        "_loaded_implementation",
        "_flash_fn",
        "_flash_varlen_fn",
        "_pad_fn",
        "_unpad_fn",
        "_process_flash_kwargs_fn",
        "_process_with_kvcache_kwargs_fn",
    ):
        monkeypatch.setattr(flash, name, getattr(flash, name))  # put back after  # fmt: skip
    monkeypatch.setattr(Load, "refuse", lambda self: None)  # no CUDA, no flash-attn here
    loaded = load_model(str(tiny_model_dirs[arch]), "cpu", "flash_attention_2")
    assert loaded.info.implementation == "flash_attention_2"
    batch = [encode(loaded, text) for text in TEXTS]
    ours = attend(loaded, batch, [1])  # layer 0 runs flash, layer 1 is recorded
    theirs = attend(loaded_tiny[arch], batch, [1])
    lengths = [len(e) for e in batch]
    assert handed == [[0, *np.cumsum(lengths).tolist()]]  # one flash layer, unpadded
    for a, b in zip(ours, theirs):
        assert np.abs(a.weights - b.weights).max() <= TOLERANCE
    alone = attend(loaded, batch[:1], [1])[0]  # no padding: no mask, the dense kernel
    assert len(handed) == 1 and np.abs(alone.weights - theirs[0].weights).max() <= TOLERANCE
