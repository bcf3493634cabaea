"""The contribution measures (norm, ALTI, rollout) against a second, plainly written
implementation: loops over heads and tokens in float64, on tiny models of every family.

The loops take f^h from the weights `check` proves (`families.layer_weights`) and the layer's
tensors from one hooked pass; whether those tensors are the right ones (the residual stream,
the normalisation's input) is shown separately, against what the model's next module reads.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import ARCHITECTURES

TEXT = "The cat sat on the mat because it was tired."
OTHER = "A dog ran."
# Every architecture attnviz reads: the three ways a block meets the residual stream are all
# here: post-LN encoders (BERT and its kin, ALBERT, DistilBERT), pre-LN decoders (GPT-2, Llama
# with GQA, Qwen2 with one key/value head, Phi-3's fused projections…), and Gemma2, which
# normalises the block's output alone before adding it.
FAMILIES = ARCHITECTURES


def _tensors(loaded, text):
    """Every layer's input, probs, output and residual for `text`, from one hooked pass."""
    from attnviz.core import capture
    from attnviz.core.tokens import encode, pad

    got = {}
    layers = range(loaded.info.n_layers)
    recorder = capture.Each(layers, capture.KINDS, lambda layer, t: got.__setitem__(layer, t))
    capture.run(loaded, pad(loaded, [encode(loaded, text)]), [recorder])
    return got


def _value_vectors(weights, x):
    """f^h(x_j) by loops: {h: (T, d)} in float64."""
    w = weights.double()
    d_k, group = w.d_k, w.n_heads // w.kv_heads
    f = {}
    for h in range(w.n_heads):
        g = h // group
        rows = []
        for j in range(x.shape[0]):
            v = x[j] @ w.w_v[:, g * d_k : (g + 1) * d_k] + w.b_v[g * d_k : (g + 1) * d_k]
            rows.append(v @ w.w_o[h * d_k : (h + 1) * d_k])
        f[h] = np.stack([r.numpy() for r in rows])
    return f


def _norm_numbers(norm):
    if norm is None:
        return None
    gain = norm.gain.double().numpy()
    bias = norm.bias.double().numpy() if norm.bias is not None else np.zeros_like(gain)
    return norm.centre, gain, bias, norm.eps, norm.covers_residual


def _alti_by_loops(loaded, tensors):
    """ALTI's per-layer contributions, the decomposed vectors' sum plus the biases (what the
    block and its normalisation write for each token), by loops."""
    from attnviz.core import families

    per_layer, rebuilt, mixing = [], [], []
    for layer in range(loaded.info.n_layers):
        t_ = tensors[layer]
        x = t_["input"][0].double()
        probs = t_["probs"][0].double().numpy()
        r = t_["residual"][0].double().numpy()
        o = t_["output"][0].double().numpy()
        weights = families.layer_weights(loaded.model, layer)
        b_o = weights.b_o.double().numpy()
        f = _value_vectors(weights, x)
        norm = _norm_numbers(families.norm_after(loaded.model, layer))
        n, heads = probs.shape[-1], probs.shape[0]
        c = np.zeros((n, n))
        built = np.zeros_like(r)
        # Kobayashi et al. 2021's Attn-W, Attn-N, AttnRes-N and AttnResLn-N: the length of
        # the others' summed vectors against that and the token's own
        mix = np.zeros((4, n))

        def ratio(vectors, i):
            others = np.linalg.norm(sum(v for j, v in enumerate(vectors) if j != i))
            return others / (others + np.linalg.norm(vectors[i]))

        for i in range(n):
            ts = []
            mixed = [sum(probs[h, i, j] * f[h][j] for h in range(heads)) for j in range(n)]
            mix[0, i] = 1 - np.mean([probs[h, i, i] for h in range(heads)])
            mix[1, i] = ratio(mixed, i)
            mix[2, i] = ratio([m + r[i] if j == i else m for j, m in enumerate(mixed)], i)
            for j in range(n):
                t = mixed[j]
                if i == j and (norm is None or norm[4]):
                    t = t + r[i]
                ts.append(t)
            bias = b_o
            if norm is not None:
                centre, gain, beta, eps, covers = norm
                u = o[i] + r[i] if covers else o[i]
                mean = u.mean() if centre else 0.0
                s = (
                    np.sqrt(((u - mean) ** 2).mean() + eps)
                    if centre
                    else np.sqrt((u**2).mean() + eps)
                )
                ts = [gain * ((t - t.mean()) if centre else t) / s for t in ts]
                bias = gain * ((b_o - b_o.mean()) if centre else b_o) / s + (beta if centre else 0)
                if not covers:
                    ts[i] = ts[i] + r[i]
            y = sum(ts)
            built[i] = y + bias
            mix[3, i] = ratio(ts, i)
            for j in range(n):
                c[i, j] = max(0.0, np.abs(y).sum() - np.abs(y - ts[j]).sum())
            c[i] /= c[i].sum()
        per_layer.append(c)
        rebuilt.append(built)
        mixing.append(mix)
    return per_layer, rebuilt, mixing


def _composed(steps):
    out, current = [], None
    for step in steps:
        current = step if current is None else step @ current
        out.append(current)
    return np.stack(out)


def _measure(loaded, text, name, layers=None):
    from attnviz.analysis.contributions import read_measure
    from attnviz.core.tokens import encode

    return read_measure(loaded, [encode(loaded, text)], name, layers)[0]


@pytest.mark.parametrize("arch", FAMILIES)
def test_norm_is_weight_times_value_length_by_loops(arch, loaded_tiny):
    loaded = loaded_tiny[arch]
    from attnviz.core import families

    tensors = _tensors(loaded, TEXT)
    got = _measure(loaded, TEXT, "norm")
    weights = _measure(loaded, TEXT, "weights")
    assert got.measure == "norm" and not got.per_layer
    assert got.weights.shape == weights.weights.shape and (got.weights >= 0).all()
    for layer in range(loaded.info.n_layers):
        x = tensors[layer]["input"][0].double()
        f = _value_vectors(families.layer_weights(loaded.model, layer), x)
        for h in range(loaded.info.n_heads):
            lengths = np.linalg.norm(f[h], axis=-1)  # ‖f^h(x_j)‖ per key
            expected = weights.weights[layer, h] * lengths[None, :]
            np.testing.assert_allclose(got.weights[layer, h], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", FAMILIES)
def test_alti_matches_loops_and_rows_sum_to_one(arch, loaded_tiny):
    loaded = loaded_tiny[arch]
    expected, _, _ = _alti_by_loops(loaded, _tensors(loaded, TEXT))
    got = _measure(loaded, TEXT, "alti")
    assert got.measure == "alti" and got.per_layer and got.weights.shape[1] == 1
    np.testing.assert_allclose(got.weights[:, 0], _composed(expected), atol=1e-5)
    np.testing.assert_allclose(got.weights.sum(-1), 1.0, atol=1e-5)
    assert (got.weights >= 0).all()


@pytest.mark.parametrize("arch", ("bert", "llama", "gemma2"))
@pytest.mark.parametrize("block", (None, 200))
def test_mixing_ratios_by_loops_in_blocks_of_queries(arch, block, loaded_tiny, monkeypatch):
    """ALTI's by-products, each query's mixing ratio by weights, by norms and with the residual
    and normalisation, against the loops; and the same numbers when ALTI works through the
    queries in blocks (200 floats hold less than one query's T × d_model values: one query a
    block)."""
    from attnviz.analysis import contributions
    from attnviz.core.tokens import encode

    loaded = loaded_tiny[arch]
    expected_c, _, expected = _alti_by_loops(loaded, _tensors(loaded, TEXT))
    if block is not None:
        monkeypatch.setattr(contributions.maths, "BLOCK_FLOATS", block)
    kept = []
    got = contributions.read_measure(loaded, [encode(loaded, TEXT)], "alti", keep=kept)[0]
    np.testing.assert_allclose(got.weights[:, 0], _composed(expected_c), atol=1e-5)
    for layer, found in kept[0].mixing.items():
        for k, ratios in enumerate(found.ratios):
            np.testing.assert_allclose(ratios[0].numpy(), expected[layer][k], atol=1e-5)


def test_mixing_ratios_of_the_bundled_model_are_the_authors_by_loops(bundled):
    """Kobayashi et al. (2021)'s four mixing ratios of every token of the pretrained encoder,
    against float64 loops over v_ij = Σ_h α^h_ij f^h(x_j): ‖Σ_{j≠i} v_ij‖ / (‖Σ_{j≠i} v_ij‖
    + ‖v_ii‖), with the residual and with the linearised LayerNorm; a share of summed
    lengths (what attnviz reported before) would be far off."""
    from attnviz.analysis import contributions
    from attnviz.core.tokens import encode

    _, _, expected = _alti_by_loops(bundled, _tensors(bundled, TEXT))
    kept = []
    contributions.read_measure(bundled, [encode(bundled, TEXT)], "alti", keep=kept)
    for layer, found in kept[0].mixing.items():
        for k, ratios in enumerate(found.ratios):
            np.testing.assert_allclose(ratios[0].numpy(), expected[layer][k], atol=1e-5)
    # the old definition, Σ_{j≠i} ‖v_ij‖ / Σ_j ‖v_ij‖, is not what is reported
    from attnviz.core import families

    first = _tensors(bundled, TEXT)[0]
    probs = first["probs"][0].double().numpy()
    f = _value_vectors(families.layer_weights(bundled.model, 0), first["input"][0].double())
    n = probs.shape[-1]
    lengths = np.array([[np.linalg.norm(sum(probs[h, i, j] * f[h][j] for h in f))
                         for j in range(n)] for i in range(n)])  # fmt: skip
    old = (lengths.sum(1) - np.diag(lengths)) / lengths.sum(1)
    assert np.abs(old - kept[0].mixing[0].ratios[1][0].numpy()).max() > 0.05


@pytest.mark.parametrize("arch", FAMILIES)
def test_alti_decomposes_what_the_model_writes(arch, loaded_tiny):
    """Σ_j t'_ij plus the biases is the vector the model's next module reads: the residual
    stream and the normalisation's scale are the model's own, not assumed."""
    loaded = loaded_tiny[arch]
    model = loaded.model
    layers = range(loaded.info.n_layers)
    base = model.base_model
    encoder = lambda layer: base.encoder.layer[layer].intermediate.dense  # noqa: E731
    readers = {
        **{arch: encoder for arch in ("bert", "roberta", "xlm-roberta", "electra")},
        "albert": lambda layer: base.encoder.albert_layer_groups[0].albert_layers[0].ffn,
        "distilbert": lambda layer: base.transformer.layer[layer].ffn.lin1,
        "gpt2": lambda layer: base.h[layer].ln_2,
        "gemma2": lambda layer: base.layers[layer].pre_feedforward_layernorm,
    }
    reader = readers.get(arch, lambda layer: base.layers[layer].post_attention_layernorm)
    seen = []
    hooks = []
    for module in {id(reader(layer)): reader(layer) for layer in layers}.values():
        hooks.append(module.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach())))
    try:
        tensors = _tensors(loaded, TEXT)
    finally:
        for hook in hooks:
            hook.remove()
    _, rebuilt, _ = _alti_by_loops(loaded, tensors)
    for layer in layers:
        np.testing.assert_allclose(rebuilt[layer], seen[layer][0].double().numpy(), atol=2e-5)


@pytest.mark.parametrize("arch", ("bert", "llama"))
def test_rollout_by_loops(arch, loaded_tiny):
    loaded = loaded_tiny[arch]
    weights = _measure(loaded, TEXT, "weights").weights.astype(np.float64)
    steps = []
    for layer in range(weights.shape[0]):
        n = weights.shape[-1]
        a = np.zeros((n, n))
        for i in range(n):
            for j in range(n):
                a[i, j] = weights[layer, :, i, j].mean() + (1.0 if i == j else 0.0)
            a[i] /= a[i].sum()
        steps.append(a)
    got = _measure(loaded, TEXT, "rollout")
    np.testing.assert_allclose(got.weights[:, 0], _composed(steps), atol=1e-6)
    np.testing.assert_allclose(got.weights.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("name", ("alti", "rollout"))
def test_a_chosen_layer_is_composed_from_layer_zero(name, loaded_tiny):
    loaded = loaded_tiny["bert"]
    every = _measure(loaded, TEXT, name)
    last = _measure(loaded, TEXT, name, layers=[1])
    assert last.layers == (1,)
    np.testing.assert_allclose(last.weights[0], every.weights[1], atol=1e-7)


@pytest.mark.parametrize("name", ("norm", "alti", "rollout"))
@pytest.mark.parametrize("arch", ("bert", "llama"))
def test_batched_equals_alone(name, arch, loaded_tiny):
    from attnviz.analysis.contributions import read_measure
    from attnviz.core.tokens import encode

    loaded = loaded_tiny[arch]
    batch = read_measure(loaded, [encode(loaded, TEXT), encode(loaded, OTHER)], name)
    for text, got in zip((TEXT, OTHER), batch):
        np.testing.assert_allclose(got.weights, _measure(loaded, text, name).weights, atol=1e-5)


@pytest.mark.parametrize("fusion", ("max", "min"))
def test_rollout_with_fusion_and_discard_batched_equals_alone(fusion, loaded_tiny):
    from attnviz.analysis.contributions import read_measure, with_rollout
    from attnviz.core.tokens import encode

    loaded = loaded_tiny["bert"]
    measure = with_rollout("rollout", fusion, 0.5)
    texts = (TEXT, OTHER)
    batch = read_measure(loaded, [encode(loaded, text) for text in texts], measure)
    for text, got in zip(texts, batch):
        alone = read_measure(loaded, [encode(loaded, text)], measure)[0]
        np.testing.assert_allclose(got.weights, alone.weights, atol=1e-6)
    plain = read_measure(loaded, [encode(loaded, TEXT)], "rollout")[0]
    assert np.abs(batch[0].weights - plain.weights).max() > 1e-3  # the options change it


@pytest.mark.parametrize(
    ("measure", "fusion", "discard", "said"),
    [
        ("rollout", "median", 0.0, "unknown --fusion 'median'"),
        ("rollout", "mean", 1.0, "--discard is a share of each map, 0 or more and below 1, not 1"),
        ("norm", "max", 0.0, "--fusion needs --measure rollout"),
        ("weights", "mean", 0.9, "--discard needs --measure rollout"),
    ],
)
def test_rollouts_options_out_of_place_get_one_line(measure, fusion, discard, said):
    from attnviz.analysis.contributions import with_rollout
    from attnviz.errors import InputError

    with pytest.raises(InputError, match=re.escape(said)):
        with_rollout(measure, fusion, discard)


def test_unknown_measure_names_the_choices():
    from attnviz.analysis.contributions import get
    from attnviz.errors import InputError

    with pytest.raises(InputError, match="unknown measure 'nrom'; choose one of: weights, norm"):
        get("nrom")


# ---------- through the command line, the files and the page ----------

SENTENCE = "The quick brown fox jumps over the lazy dog because it was bored."


def _invoke(*args):
    from typer.testing import CliRunner

    from attnviz.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_show_json_says_the_measure_and_finds_kobayashi_s_special_tokens(bundled):
    """On the bundled model, as Kobayashi et al. (2020) found on BERT: special tokens take much
    of the weight but little of the norm; ALTI's mixing ratios with the residual and the
    LayerNorm are far below those by weights (Kobayashi et al. 2021)."""
    import json

    result = _invoke("show", SENTENCE, "--no-images", "--json", "--measure", "alti")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert found["measure"]["name"] == "alti" and found["measure"]["per_layer"] is True
    assert {h["head"] for h in found["heads"]} == {0} and len(found["heads"]) == 6
    share = found["special_share"]
    assert share["weights"] > 2 * share["norm"] > 0
    mixing = found["mixing"]
    assert sorted(mixing) == [str(layer) for layer in range(6)]
    for ratios in mixing.values():
        assert 0 <= ratios["norm_residual_layernorm"] < ratios["norm"] <= 1
        assert 0 <= ratios["weights"] <= 1


def test_show_images_of_a_per_layer_measure_are_layers(tmp_path, bundled):
    result = _invoke("show", SENTENCE, "--measure", "rollout", "--out", tmp_path, "-j", "1")
    assert result.exit_code == 0, result.output
    (folder,) = tmp_path.iterdir()
    names = sorted(p.name for p in folder.glob("*.png"))
    assert names == [f"layer-{layer:02d}.png" for layer in range(6)] + ["overview.png"]
    assert "wrote 7 images" in result.output
    assert "rollout, composed" not in result.output  # the per-layer table, not a one-column map
    assert "What each layer's rollout does on this text" in result.output


def test_show_and_another_measure_keep_their_own_folders(tmp_path, bundled):
    for measure in ("weights", "norm"):
        result = _invoke("show", SENTENCE, "--measure", measure, "--out", tmp_path, "-l", "0")
        assert result.exit_code == 0, result.output
    folders = list(tmp_path.iterdir())
    assert len(folders) == 2 and all((f / "done.json").is_file() for f in folders)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--measure", "nrom"], "'nrom' is not one of"),
        (["--measure", "norm", "--hide-special"], "--hide-special renormalises rows"),
    ],
)
def test_bad_measures_exit_2_with_one_line_and_write_nothing(args, message, tmp_path):
    result = _invoke("show", SENTENCE, "--out", tmp_path, *args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not list(tmp_path.iterdir())


def test_export_saves_the_measure_s_values(tmp_path, bundled):
    from attnviz.analysis.contributions import read_measure
    from attnviz.core.tokens import encode

    sentences = tmp_path / "s.txt"
    sentences.write_text(f"{SENTENCE}\nIt was tired.\n", encoding="utf-8")
    for name in ("norm", "alti"):
        out = tmp_path / name
        result = _invoke(
            "export", "-f", sentences, "--measure", name, "--save-raw", "-o", out, "-j", "1"
        )
        assert result.exit_code == 0, result.output
        for folder, text in zip(sorted(out.glob("000*")), (SENTENCE, "It was tired.")):
            saved = np.load(folder / "attention.npz")
            assert str(saved["measure"]) == name
            expected = read_measure(bundled, [encode(bundled, text)], name)[0].weights
            if name == "alti":
                expected = expected[:, 0]  # (L, T, T): one map a layer
            # batched as export batches them: float32 rounding of the padded pass
            np.testing.assert_allclose(saved[name], expected, rtol=1e-5, atol=1e-6)


def test_the_page_s_norm_is_the_weights_times_each_key_s_length(bundled):
    """The page ships norm as ‖f^h(x_j)‖ per key and multiplies it into the weights: what it
    multiplies gives the norm measure."""
    import base64
    import zlib

    from attnviz.analysis.contributions import EveryMeasure
    from attnviz.core.extract import attend
    from attnviz.core.tokens import encode
    from attnviz.outputs.html.page import page_data

    encoded = encode(bundled, SENTENCE)
    every = EveryMeasure(bundled, list(range(6)), [encoded], "weights")
    att = attend(bundled, [encoded], also=list(every.recorders.values()))[0]
    page = every.page(att, att, lambda a: a)
    assert sorted(page.others) == ["alti", "norm", "rollout"]
    data = page_data(page.weights, measures=page.others, lengths=page.lengths)
    lengths = data["measures"]["norm"]["lengths"]
    for layer in (0, 5):
        for h in (0, 7):
            raw = zlib.decompress(base64.b64decode(lengths[layer][h]))
            key_lengths = np.frombuffer(raw, "<f4")
            product = att.weights[layer, h] * key_lengths[None, :]
            np.testing.assert_allclose(product, page.others["norm"].weights[layer, h], rtol=1e-6)
    assert data["measures"]["norm"]["top"] == pytest.approx(page.others["norm"].weights.max())
    assert data["measures"]["alti"]["per_layer"] and len(data["measures"]["alti"]["blobs"][0]) == 1


def test_a_measure_a_model_cannot_give_is_one_line(tiny_model_dirs, tmp_path):
    """BERT with relative position embeddings: its weights are not read (check refuses them),
    so norm and alti are refused with one line, and weights still work."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, position_embedding_type="relative_key",
    )  # fmt: skip
    folder = tmp_path / "relative"
    BertModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dirs["bert"]).save_pretrained(folder)
    for measure in ("norm", "alti"):
        result = _invoke("show", SENTENCE, "-m", folder, "--no-images", "--measure", measure)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and f"--measure {measure} is not defined here" in lines[0]
    result = _invoke("show", SENTENCE, "-m", folder, "--no-images", "--measure", "rollout")
    assert result.exit_code == 0, result.output


def test_export_page_of_a_measure_carries_the_weights_and_every_measure(tmp_path, bundled):
    import json
    import re

    out = tmp_path / "out"
    result = _invoke("export", SENTENCE, "It was tired.", "--measure", "alti", "--html", "-o", out)
    assert result.exit_code == 0, result.output
    for page in sorted(out.glob("*/attention.html")):
        text = page.read_text(encoding="utf-8")
        found = re.search(r'id="attnviz-data">(.*?)</script>', text, re.S)
        data = json.loads(found.group(1))
        assert data["measure"] == "alti" and data["heads"] == 12  # the weights, all heads
        assert sorted(data["measures"]) == ["alti", "norm", "rollout"]
        assert len(data["measures"]["alti"]["blobs"][0]) == 1  # one map a layer


# ---------- the pieces around the numbers, against plain loops ----------


@pytest.mark.parametrize("arch", ("bert", "llama"))
def test_special_shares_by_weight_and_by_norm_by_loops(arch, loaded_tiny):
    """The summary's line: per layer and head, the mean over non-special queries of the share
    special keys get, of the weights and of ‖α f(x)‖."""
    from attnviz.analysis.contributions import SpecialShares
    from attnviz.core.extract import attend
    from attnviz.core.tokens import encode

    loaded = loaded_tiny[arch]
    encoded = [encode(loaded, TEXT), encode(loaded, OTHER)]
    special = [np.array(e.special) for e in encoded]
    layers = list(range(loaded.info.n_layers))
    shares = SpecialShares(loaded, layers, special)
    found = attend(loaded, encoded, also=[shares])
    norm = [_measure(loaded, text, "norm").weights for text in (TEXT, OTHER)]
    by_weight, by_norm = shares.means()  # (B, L, H) each
    for row, (att, lengths) in enumerate(zip(found, norm)):
        keys, queries = np.flatnonzero(special[row]), np.flatnonzero(~special[row])
        assert len(keys) and len(queries)
        for layer in layers:
            for h in range(loaded.info.n_heads):
                for into, grid in ((by_weight, att.weights), (by_norm, lengths)):
                    expected = np.mean(
                        [grid[layer, h, q, keys].sum() / grid[layer, h, q].sum() for q in queries]
                    )
                    assert into[row, layer, h] == pytest.approx(expected, rel=1e-4, abs=1e-6)


def _special_inputs(n=300, heads=4, width=None, seed=0):
    """Random probabilities (1, H, W, W) over a text of `n` tokens padded to `width`, each
    key's length (1, H, W) and the text's special tokens (first, a third of the way, last)."""
    import torch

    width = width or n
    generator = torch.Generator().manual_seed(seed)
    probs = torch.rand(1, heads, width, width, generator=generator) ** 4
    probs[..., n:] = 0  # padding keys get nothing
    probs = probs / probs.sum(dim=-1, keepdim=True)
    lengths = torch.rand(1, heads, width, generator=generator) * 3
    marked = np.zeros(n, bool)
    marked[[0, n // 3, n - 1]] = True
    return probs, lengths, [marked]


def _special_by_blocks(probs, lengths, special, rows):
    """`special_rows` summed over blocks of `rows` query rows, as means (2, B, H)."""
    from attnviz.analysis.contributions import special_means, special_rows

    sums = sum(
        special_rows(probs[:, :, start : start + rows], start, lengths.numpy(), special)
        for start in range(0, probs.shape[2], rows)
    )
    return special_means(sums[:, :, None], special)[:, :, 0]


def test_special_shares_by_norm_from_blocks_of_rows_agree():
    """The special shares are summed a block of query rows at a time: blocks of one row, of
    seven rows and of every row give the loops' numbers (the mean over non-special queries of
    the share special keys get, by weight and by ‖α f(x)‖), padded or not."""
    for width in (None, 317):
        probs, lengths, special = _special_inputs(width=width)
        marked = special[0]
        n = len(marked)
        grid = probs[0, :, :n, :n].double().numpy()
        normed = grid * lengths[0, :, None, :n].double().numpy()
        queries = np.flatnonzero(~marked)
        expected = np.array(
            [
                [[g[q][marked].sum() / g[q].sum() for q in queries] for g in grid_set]
                for grid_set in (grid, normed)
            ]
        ).mean(axis=-1)  # (2, H)
        for rows in (1, 7, probs.shape[2]):
            found = _special_by_blocks(probs, lengths, special, rows)
            np.testing.assert_allclose(found[:, 0], expected, rtol=1e-6)


def test_special_shares_copy_no_layer():
    """The special shares of a layer hold no copy of its (H, T, T) probabilities: summed from
    blocks of 16 rows, the numpy memory they allocate at the peak is under the layer's size
    (a float64 copy alone is twice that)."""
    import tracemalloc

    probs, lengths, special = _special_inputs(400)
    tracemalloc.start()
    try:
        _special_by_blocks(probs, lengths, special, 16)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < probs.numpy().nbytes


def test_shares_divide_a_norm_s_rows_by_their_sums(loaded_tiny):
    from attnviz.analysis.contributions import shares

    loaded = loaded_tiny["bert"]
    weights = _measure(loaded, TEXT, "weights")
    assert shares(weights) is weights  # rows already sum to 1
    norm = _measure(loaded, TEXT, "norm")
    made = shares(norm)
    assert made.measure == "norm" and made.weights.dtype == np.float32
    expected = norm.weights / norm.weights.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(made.weights, expected, rtol=1e-6)
    zero = norm.weights.copy()
    zero[0, 0, 1] = 0.0  # a row of zeros stays zeros (no division by 0)
    from dataclasses import replace

    assert (shares(replace(norm, weights=zero)).weights[0, 0, 1] == 0).all()


def test_every_measure_page_of_a_batch_row_with_words_or_special_hidden(loaded_tiny):
    """Each row of a batch gets its own text's measures, transformed as the command's view
    is; the page's norm lengths only where the view is tokens, norm left out where special
    tokens are hidden."""
    from attnviz.analysis.contributions import EveryMeasure, read_measure
    from attnviz.analysis.transforms import transform
    from attnviz.core.tokens import encode

    loaded = loaded_tiny["bert"]
    batch = [encode(loaded, TEXT), encode(loaded, OTHER)]
    every = EveryMeasure(loaded, [0, 1], batch, "alti")
    found = read_measure(loaded, batch, "alti", also=list(every.recorders.values()))
    raw = found[1]  # the shorter text, padded in the batch
    alone = {m: _measure(loaded, OTHER, m) for m in ("weights", "norm", "rollout")}
    page = every.page(raw, raw, lambda a: a, row=1)
    assert page.weights.measure == "weights" and sorted(page.others) == ["alti", "norm", "rollout"]
    assert [page.others[m].per_layer for m in ("alti", "norm", "rollout")] == [True, False, True]
    assert [page.others[m].measure for m in ("alti", "norm", "rollout")] == [
        "alti",
        "norm",
        "rollout",
    ]
    np.testing.assert_allclose(page.weights.weights, alone["weights"].weights, atol=1e-5)
    np.testing.assert_allclose(page.others["norm"].weights, alone["norm"].weights, atol=1e-5)
    np.testing.assert_allclose(page.others["rollout"].weights, alone["rollout"].weights, atol=1e-5)
    assert page.lengths.shape == alone["weights"].weights.shape[:3]
    product = page.weights.weights * page.lengths[:, :, None, :]
    np.testing.assert_allclose(product, alone["norm"].weights, rtol=1e-4, atol=1e-6)
    words = every.page(raw, transform(raw, words=True), lambda a: transform(a, words=True), row=1)
    assert words.lengths is None and words.others["norm"].unit == "word"
    assert words.weights.weights.shape[-1] == len(words.weights.tokens)
    hidden = every.page(
        raw,
        transform(raw, hide_special_tokens=True),
        lambda a: transform(a, hide_special_tokens=True),
        row=1,
    )
    assert "norm" not in hidden.others and hidden.lengths is None
    assert hidden.weights.hidden_special and hidden.others["rollout"].hidden_special


@pytest.mark.parametrize("d_model", [48, 8])  # wider than a head, and narrower (QR's R wide)
def test_a_head_s_lengths_are_its_vectors_lengths(d_model):
    """‖v^h_j W_O^h‖ from QR's R (`maths.head_lengths`) equals the length of the product
    itself in float64, within float32's rounding."""
    import torch

    from attnviz.analysis.contributions.maths import head_lengths

    generator = torch.Generator().manual_seed(0)
    heads = torch.randn(2, 7, 3, 16, generator=generator)  # (B, T, H, d)
    w_o = torch.randn(3, 16, d_model, generator=generator) / 4
    exact = torch.einsum("bthk,hkd->bhtd", heads.double(), w_o.double()).norm(dim=-1)
    found = head_lengths(heads, w_o)
    assert found.shape == (2, 3, 7) and found.dtype == torch.float32
    torch.testing.assert_close(found.double(), exact, rtol=1e-6, atol=1e-6)
