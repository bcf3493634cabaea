"""Long texts (issue 33): a run that holds no map whole gives the summary, the special-token
shares, the query's rows and the views of a run that holds them, from blocks of rows; long
maps are drawn pooled, with a window's exact cells."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.analysis.pooling import pool
from attnviz.core import memory
from attnviz.core.settings import Load
from attnviz.pipelines.request import ShowRequest
from attnviz.pipelines.show import show

TEXT = "the cat sat on the mat and the dog sat on the log , then the cat ran to the dog"


def _both(tiny_model_dirs, arch, monkeypatch, **fields):
    """The same request held whole and streamed (every run streams over 0 bytes)."""
    request = ShowRequest(Load(str(tiny_model_dirs[arch]), "cpu"), text=TEXT, out=None,
                      **fields)  # fmt: skip
    held = show(request)
    monkeypatch.setattr(memory, "STREAM_ABOVE", 0)
    streamed = show(request)
    monkeypatch.undo()
    return held, streamed


@pytest.mark.parametrize("arch", ["bert", "llama", "gpt2", "mistral"])
def test_a_streamed_run_summarises_as_one_that_holds_every_map(tiny_model_dirs, arch,
                                                                 monkeypatch):  # fmt: skip
    held, streamed = _both(tiny_model_dirs, arch, monkeypatch, query="sat#2")
    assert streamed.attention.tokens == held.attention.tokens
    for a, b in zip(held.summaries, streamed.summaries, strict=True):
        assert (a.layer, a.head, a.pattern.role, a.pattern.key) == (
            b.layer, b.head, b.pattern.role, b.pattern.key)  # fmt: skip
        assert [t.index for t in a.top] == [t.index for t in b.top]
        assert [t.weight for t in b.top] == pytest.approx([t.weight for t in a.top], abs=1e-6)
        assert b.special_share == pytest.approx(a.special_share, abs=1e-6)
        assert (a.link.query, a.link.key) == (b.link.query, b.link.key)
        assert b.link.weight == pytest.approx(a.link.weight, abs=1e-6)
        for name, score in a.scores.items():
            assert (score is None) == (b.scores[name] is None)
            if score is not None:
                assert b.scores[name] == pytest.approx(score, abs=1e-6)
    for one, other in ((held.special_by_weight, streamed.special_by_weight),
                       (held.special_by_norm, streamed.special_by_norm)):  # fmt: skip
        np.testing.assert_allclose(other, one, atol=1e-6)
    for a, b in zip(held.query.heads, streamed.query.heads, strict=True):
        assert [t.index for t in a.top] == [t.index for t in b.top]
        assert [t.weight for t in b.top] == pytest.approx([t.weight for t in a.top], abs=1e-6)
    # the figures' maps: the exact cells, kept from the blocks (a short text is not pooled)
    assert streamed.drawn.pooled is None
    np.testing.assert_allclose(streamed.drawn.weights, held.attention.weights, atol=1e-6)


@pytest.mark.parametrize("how", ["max", "mean"])
def test_long_maps_are_drawn_pooled_alike_held_or_streamed(tiny_model_dirs, monkeypatch, how):
    from attnviz.analysis import pooling

    monkeypatch.setattr(pooling, "MAX_SIDE", 7)  # a 24-token text's maps: 4 × 4 blocks
    held, streamed = _both(tiny_model_dirs, "llama", monkeypatch, pool=how)
    n = len(held.attention.tokens)
    size = -(-n // 7)
    assert held.drawn.pooled == streamed.drawn.pooled == (size, how)
    for layer in range(held.attention.weights.shape[0]):
        expected = pool(held.attention.weights[layer], size, how, causal=True).values
        np.testing.assert_allclose(held.drawn.weights[layer], expected, atol=1e-7)
        np.testing.assert_allclose(streamed.drawn.weights[layer], expected, atol=1e-6)
    assert held.drawn.tokens == held.attention.tokens[::size]
    assert any("maps pooled: each cell the" in note for note in held.drawn.notes)


@pytest.mark.parametrize("stream", [False, True])
def test_maps_nothing_draws_are_not_pooled(tiny_model_dirs, monkeypatch, stream):
    """Without images (`--no-images`) the figures' pooled maps are not made (`drawn` None),
    held or streamed, and everything else is the run's with images; one layer and one head
    are still drawn pooled (the terminal's heatmap)."""
    from attnviz.analysis import pooling

    monkeypatch.setattr(pooling, "MAX_SIDE", 7)  # a 24-token text's maps: 4 × 4 blocks
    if stream:
        monkeypatch.setattr(memory, "STREAM_ABOVE", 0)
    load = Load(str(tiny_model_dirs["llama"]), "cpu")
    drawn = show(ShowRequest(load, text=TEXT, out=None))
    undrawn = show(ShowRequest(load, text=TEXT, out=None, images=False))
    assert drawn.drawn.pooled is not None and undrawn.drawn is None
    assert undrawn.as_dict() == drawn.as_dict()
    np.testing.assert_array_equal(undrawn.attention.weights, drawn.attention.weights)
    one = show(ShowRequest(load, text=TEXT, out=None, images=False, layers=(1,), heads=(2,)))
    assert one.drawn.pooled == drawn.drawn.pooled  # (layer 1 read alone: within float32's)
    np.testing.assert_allclose(one.drawn.weights[0], drawn.drawn.weights[1], atol=1e-6)


def test_a_window_is_the_exact_cells_held_or_streamed(tiny_model_dirs, monkeypatch):
    held, streamed = _both(tiny_model_dirs, "bert", monkeypatch, window=(3, 9))
    expected = held.attention.weights[:, :, 3:9, 3:9]
    np.testing.assert_array_equal(held.window.weights, expected)
    np.testing.assert_allclose(streamed.window.weights, expected, atol=1e-6)
    assert held.window.span == streamed.window.span == (3, 9)
    assert held.window.tokens == held.attention.tokens[3:9]


def test_a_window_outside_the_text_is_one_line(tiny_model_dirs, tmp_path):
    from typer.testing import CliRunner

    from attnviz.cli import app

    for window, said in (("3:900", "--window 3:900 is outside the text"),
                         ("9-3", "give START:END")):  # fmt: skip
        args = ["show", TEXT, "-m", str(tiny_model_dirs["bert"]), "--window", window]
        result = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "o")])
        assert result.exit_code == 2 and said in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_a_streamed_run_asks_the_pass_for_no_whole_map(tiny_model_dirs, monkeypatch):
    """No recorder of a streamed run asks for a layer's probabilities whole: the capture then
    never assembles one (`core.capture`), and every number comes from blocks of rows. (How
    much memory a long run takes is measured by bench/bench_long.py.)"""
    from attnviz.core import capture

    asked, real = [], capture.run

    def watched(loaded, inputs, recorders, *args, **kwargs):
        asked.extend(kind for r in recorders for kinds in r.wants.values() for kind in kinds)
        return real(loaded, inputs, recorders, *args, **kwargs)

    monkeypatch.setattr(capture, "run", watched)
    monkeypatch.setattr(memory, "STREAM_ABOVE", 0)
    request = ShowRequest(Load(str(tiny_model_dirs["llama"]), "cpu"), text=TEXT,
                      query="cat", out=None)  # fmt: skip
    found = show(request)
    assert "rows" in asked and "probs" not in asked
    assert not found.attention.weights.flags.owndata  # a stand-in of the shape, nothing held


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_a_report_of_long_texts_sums_from_blocks_what_one_that_holds_them_does(
    tiny_model_dirs, arch, monkeypatch
):
    """A batch whose maps would not fit is read in blocks of rows: the report's metrics, roles,
    special shares, mixing ratios and reach are those of the same batch held whole."""
    from attnviz.core import models
    from attnviz.core.inputs import read_sentences
    from attnviz.pipelines import corpus as corpus_module
    from attnviz.pipelines.corpus import read_corpus, run_part

    loaded = models.get(Load(str(tiny_model_dirs[arch]), "cpu")).load()
    sentences = read_sentences(None, [TEXT, "the dog ran .", "a cat and a dog sat on a mat ."])
    corpus = read_corpus(loaded, sentences, batch_size=2)
    every = range(len(corpus.batches))
    held = run_part(loaded, sentences, corpus, every)
    monkeypatch.setattr(memory, "STREAM_ABOVE", 0)
    read = corpus_module._Streamed.read
    widths = []  # each streamed pass's texts: one at a time, whatever --batch-size
    monkeypatch.setattr(corpus_module._Streamed, "read",
                        lambda self, loaded, rows, also: widths.append(len(rows))
                        or read(self, loaded, rows, also))  # fmt: skip
    streamed = run_part(loaded, sentences, corpus, every)
    assert widths == [1, 1, 1]
    np.testing.assert_allclose(streamed.metrics.means(), held.metrics.means(), atol=1e-6)
    np.testing.assert_allclose(streamed.contributions.special(), held.contributions.special(),
                               atol=1e-6)  # fmt: skip
    assert held.contributions.mixing() is not None  # the tiny models' weights are readable
    np.testing.assert_allclose(streamed.contributions.mixing(), held.contributions.mixing(),
                               atol=1e-6)  # fmt: skip
    np.testing.assert_allclose(streamed.reach.result().distance_mean,
                               held.reach.result().distance_mean, atol=1e-6)  # fmt: skip
    # the example figures draw the first tokens' exact cells
    n = streamed.example.weights.shape[-1]
    np.testing.assert_allclose(streamed.example.weights,
                               held.example.weights[..., :n, :n], atol=1e-6)  # fmt: skip
