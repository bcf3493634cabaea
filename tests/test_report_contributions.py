"""report's special shares per head and mixing ratios per layer, against independent
computations: plain loops over what `attnviz.attention` gives for each text (weights, and
`measure="norm"`), and the mixing ratios `show --measure alti` prints for one text."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app

runner = CliRunner()
# Three lengths, so that a mean over texts and a mean over tokens differ.
TEXTS = [
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog because it was bored.",
    "Birds sing!",
]
MIXING = ("weights", "norm", "norm_residual", "norm_residual_layernorm")


def _shares_by_loops(grids, specials, keys_of=None):
    """Per text, each head's mean over non-special queries of Σ_{special keys} / Σ_{all keys}
    of the row; then, per head, the mean over the texts: (L, H). Also the mean over every
    query of every text pooled, which weights long texts more (to show the two differ)."""
    per_text, pooled, queries_seen = [], 0.0, 0
    for grid, special in zip(grids, specials):
        keys = np.flatnonzero(special if keys_of is None else keys_of(special))
        queries = np.flatnonzero(~special)
        n_layers, n_heads = grid.shape[:2]
        share = np.zeros((n_layers, n_heads))
        summed = np.zeros((n_layers, n_heads))
        for layer in range(n_layers):
            for head in range(n_heads):
                rows = [grid[layer, head, q, keys].sum() / grid[layer, head, q].sum()
                        for q in queries]  # fmt: skip
                share[layer, head] = np.mean(rows)
                summed[layer, head] = np.sum(rows)
        per_text.append(share)
        pooled = pooled + summed
        queries_seen += len(queries)
    return np.mean(per_text, axis=0), pooled / queries_seen


def _columns(result, name):
    """A heads.csv column of a `Report` as (L, H) (every head chosen)."""
    grid = np.full((result.info.n_layers, result.info.n_heads), np.nan)
    for row in result.rows():
        grid[row["layer"], row["head"]] = row[name]
    return grid


def _show_mixing(model, text):
    """`show --measure alti --json`'s mixing ratios of one text and its token count."""
    args = ["show", text, "--no-images", "--json", "--measure", "alti", "--device", "cpu"]
    result = runner.invoke(app, args + (["-m", model] if model else []))
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    mixing = found["mixing"]
    rows = [[mixing[str(layer)][k] for layer in range(len(mixing))]
            for k in MIXING]  # fmt: skip
    return np.array(rows), len(found["tokens"])


@pytest.fixture(params=["bundled", "llama"])
def model(request, tiny_model_dirs):
    """The bundled encoder ([CLS] and [SEP] special) and a tiny Llama (BOS special)."""
    return None if request.param == "bundled" else str(tiny_model_dirs[request.param])


def test_special_shares_equal_loops_over_weights_and_norms(model):
    result = attnviz.report(TEXTS, model=model, device="cpu", batch_size=2)
    weights = [attnviz.attention(t, model=model, device="cpu") for t in TEXTS]
    norms = [attnviz.attention(t, model=model, device="cpu", measure="norm") for t in TEXTS]
    specials = [att.special for att in weights]
    assert all(s.any() and (~s).any() for s in specials)
    for name, grids in (("special_weight_share", weights), ("special_norm_share", norms)):
        expected, pooled = _shares_by_loops([a.weights.astype("f8") for a in grids], specials)
        got = _columns(result, name)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
        # the check can fail: pooling the queries of all texts gives other numbers
        assert np.abs(pooled - expected).max() > 1e-3
    # and a wrong special set ([CLS]/BOS alone, the first token) too, where there are others
    if any(s.sum() > 1 for s in specials):
        first_only, _ = _shares_by_loops(
            [a.weights.astype("f8") for a in weights], specials, lambda s: np.arange(len(s)) == 0
        )
        assert np.abs(first_only - _columns(result, "special_weight_share")).max() > 1e-2


def test_mixing_ratios_on_one_text_are_show_alti_s(model):
    """One text: report's per-layer ratios are `show --measure alti`'s, with no composition."""
    result = attnviz.report(TEXTS[1], model=model, device="cpu")
    expected, _ = _show_mixing(model, TEXTS[1])
    np.testing.assert_allclose(result.mixing, expected, atol=1e-6)
    assert list(result.mixing_ratio()) == list(MIXING)


def test_mixing_ratios_weigh_every_token_equally_and_do_not_depend_on_the_batch(model, monkeypatch):
    """Means over every token of every text, whatever the batch and however many of its rows
    `mixing_ratios` takes at a time (BLOCK_FLOATS 1: one row at a time)."""
    from attnviz.analysis import contributions

    shown = [_show_mixing(model, text) for text in TEXTS]
    lengths = np.array([n for _, n in shown])
    expected = sum(ratios * n for ratios, n in shown) / lengths.sum()
    for batch_size, block in ((1, None), (3, None), (3, 1)):
        if block is not None:
            monkeypatch.setattr(contributions.maths, "BLOCK_FLOATS", block)
        result = attnviz.report(TEXTS, model=model, device="cpu", batch_size=batch_size)
        np.testing.assert_allclose(result.mixing, expected, atol=1e-6)
    # the check can fail: the mean of the texts' means is another number
    texts_mean = np.mean([ratios for ratios, _ in shown], axis=0)
    assert np.abs(texts_mean - expected).max() > 1e-3


def test_report_json_csv_and_markdown_carry_the_columns(tiny_model_dirs, tmp_path):
    import csv

    from markdown_it import MarkdownIt

    tiny = str(tiny_model_dirs["bert"])
    out = tmp_path / "r"
    result = runner.invoke(
        app, ["report", *TEXTS, "-m", tiny, "-o", str(out), "-l", "1", "-H", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data == json.loads((out / "heads.json").read_text())
    # one value per layer of the model (index: the layer), whatever --layer chose
    assert list(data["mixing_ratio"]) == list(MIXING)
    assert all(len(values) == 2 for values in data["mixing_ratio"].values())
    assert all(0 <= v <= 1 for values in data["mixing_ratio"].values() for v in values)
    (head,) = data["heads"]
    assert 0 < head["special_norm_share"] < 1 and 0 < head["special_weight_share"] < 1
    with open(out / "heads.csv", newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert float(row["special_weight_share"]) == pytest.approx(head["special_weight_share"])
    markdown = (out / "report.md").read_text()
    html = MarkdownIt().enable("table").render(markdown)
    ratios = [f"{data['mixing_ratio'][name][1]:.1%}" for name in MIXING]
    assert f"<tr>\n<td>1</td>\n<td>{ratios[0]}</td>\n<td>{ratios[1]}</td>" in html
    assert "<td>0</td>" not in html.split("mixing ratio")[1]  # the chosen layer only
    for what in ("Attn-W", "Attn-N", "AttnRes-N"):
        assert f"<em>{what}</em>" in html
    assert f"take <strong>{head['special_weight_share']:.1%}</strong>" in html


def test_unreadable_value_weights_leave_norm_and_mixing_out(tiny_model_dirs, monkeypatch):
    """Where the value weights cannot be read, the share by weight stays, the rest is null."""
    from attnviz.analysis import contributions

    model = str(tiny_model_dirs["bert"])
    result = attnviz.report(TEXTS, model=model, device="cpu")
    monkeypatch.setattr(contributions.recorders, "values_of", lambda *args: None)
    without = attnviz.report(TEXTS, model=model, device="cpu")
    assert without.mixing is None and without.as_dict()["mixing_ratio"] is None
    rows = without.rows()
    assert all(row["special_norm_share"] is None for row in rows)
    got = [row["special_weight_share"] for row in rows]
    assert got == pytest.approx([row["special_weight_share"] for row in result.rows()])


@pytest.mark.parametrize("arch", ["bart", "t5"])
def test_seq2seq_special_shares_per_self_attention_stack(loaded_seq2seq, arch):
    """Encoder and decoder rows have both shares (the source's, the target's special tokens),
    equal to loops over each stack's weights and norms; cross-attention rows and the mixing
    ratios are left out."""
    from attnviz.analysis.contributions import stack_values
    from attnviz.core.extract import attend_stacks
    from attnviz.core.inputs import Sentence, Sentences
    from attnviz.core.seq2seq import encode_source_target
    from attnviz.pipelines.report import build_seq2seq_report

    pairs = [("The cat sat on the mat.", "Die Katze saß auf der Matte."),
             ("A quick brown fox!", "Ein schneller Fuchs!")]  # fmt: skip
    loaded = loaded_seq2seq[arch]
    corpus = Sentences(
        tuple(Sentence(i + 1, i + 1, s, t) for i, (s, t) in enumerate(pairs)), 0, "pairs"
    )
    result = build_seq2seq_report(loaded, corpus, batch_size=2)
    stacks = ("encoder", "decoder")
    encoded = [encode_source_target(loaded, s, t) for s, t in pairs]
    weights = [attend_stacks(loaded, [item], stacks)[0] for item in encoded]
    values = stack_values(loaded, "norm")
    norms = [attend_stacks(loaded, [item], stacks, values=values)[0] for item in encoded]
    for stack in stacks:
        report = result.stacks[stack]
        assert report.mixing is None
        specials = [found[stack].special for found in weights]
        assert all(s.any() and (~s).any() for s in specials)
        for name, grids in (("special_weight_share", weights), ("special_norm_share", norms)):
            expected, _ = _shares_by_loops([g[stack].weights.astype("f8") for g in grids], specials)
            np.testing.assert_allclose(_columns(report, name), expected, rtol=1e-4, atol=1e-6)
    data = result.as_dict()
    assert "mixing_ratio" not in data
    cross = [row for row in data["heads"] if row["stack"] == "cross"]
    assert cross and all("special_weight_share" not in row for row in cross)


REPEATED = ["the cat sat on the mat and the cat sat on the mat", "a dog ran , a dog ran far"]


@pytest.mark.parametrize("streamed", [False, True])
def test_induction_on_the_corpus_s_own_repeats_pools_the_texts_queries(
    tiny_model_dirs, monkeypatch, streamed
):
    """induction_texts and duplicate_texts: the probe's recipe on each text's own repeated
    tokens (`metrics.repeat_totals`, what `show` scores one text by), summed over the texts
    and divided by every counted query; held and streamed alike; none for an encoder."""
    from attnviz.analysis.metrics import repeat_totals
    from attnviz.core import memory

    model = str(tiny_model_dirs["llama"])
    found = [attnviz.attention(text, model=model, device="cpu") for text in REPEATED]
    totals = [repeat_totals(att) for att in found]
    sums = sum(total[0] for total in totals)
    counts = sum(total[1] for total in totals)
    if streamed:
        monkeypatch.setattr(memory, "STREAM_ABOVE", 0)
    report = attnviz.report(REPEATED, model=model, device="cpu")
    assert report.repeat_queries == (int(counts[0]), int(counts[1])) and counts[0] >= 3
    np.testing.assert_allclose(report.repeats, sums / counts[:, None, None], atol=1e-6)
    row = report.rows()[0]
    assert row["induction_texts"] == pytest.approx(report.repeats[0, row["layer"], row["head"]])
    assert report.as_dict()["repeat_queries"] == {
        "induction_texts": int(counts[0]), "duplicate_texts": int(counts[1])}  # fmt: skip
    encoder = attnviz.report(REPEATED, model=str(tiny_model_dirs["bert"]), device="cpu")
    assert encoder.repeats is None and "induction_texts" not in encoder.rows()[0]
