"""`--window START:END` (`attnviz.analysis.window`): the exact cells, the same from blocks of
rows as cut from the whole attention, and bad windows refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.analysis.window import (
    WindowCells,
    around,
    check_window,
    parse_window,
    window_attention,
    window_of,
)
from attnviz.errors import InputError


@pytest.fixture(scope="module")
def sentence(bundled):
    from attnviz.core.extract import extract

    return extract(bundled, "The quick brown fox jumps over the lazy dog because it was bored.")


def test_the_window_is_the_whole_attentions_cells(sentence):
    found = window_of(sentence, 3, 9)
    assert found.tokens == sentence.tokens[3:9]
    np.testing.assert_array_equal(found.weights, sentence.weights[:, :, 3:9, 3:9])
    assert found.weights.sum(axis=-1).max() < 1.0 + 1e-6  # keys outside are left out
    assert any("window 3:9" in note and "do not sum to 1" in note for note in found.notes)
    assert found.word_labels[found.words[0]] == sentence.word_labels[sentence.words[3]]


@pytest.mark.parametrize("block", [1, 7, 16])
def test_blocks_of_rows_keep_the_same_cells(sentence, block):
    n_layers, n_heads, n, _ = sentence.weights.shape
    cells = WindowCells(range(n_layers), n_heads, 3, 9)
    for layer in range(n_layers):
        for first in range(0, n, block):
            cells.add(layer, first, sentence.weights[layer, :, first : first + block])
    streamed = window_attention(sentence, cells.held, 3, 9)
    np.testing.assert_array_equal(streamed.weights, window_of(sentence, 3, 9).weights)


@pytest.mark.parametrize(
    "text, said",
    [
        ("3-9", "give START:END"),
        ("9:3", "END must be after START"),
        ("4:4", "END must be after START"),
        ("a:b", "give START:END"),
    ],
)
def test_bad_windows_are_refused_in_one_line(text, said):
    with pytest.raises(InputError, match=said):
        parse_window(text)


def test_a_window_past_the_text_is_refused():
    assert parse_window(" 3 : 9 ") == (3, 9)
    check_window(0, 16, 16)
    with pytest.raises(InputError, match="outside the text: it has 16 tokens"):
        check_window(10, 17, 16)
    assert (
        around(5, 100, 3) == (2, 9)
        and around(1, 100, 3) == (0, 5)
        and around(98, 100, 3) == (95, 100)
    )


def _texts(fig) -> list[str]:
    """Every text a figure shows: its titles and its axes' tick labels."""
    found = [text.get_text() for text in fig.texts]
    for ax in fig.axes:
        found += [label.get_text() for label in ax.get_xticklabels() + ax.get_yticklabels()]
    return found


def test_a_windows_query_figure_gives_text_positions(sentence):
    """The query's figure in a window names the query's position in the text, labels its keys
    with text positions and is named by that position, as the head figures are."""
    from attnviz.outputs.figures import Labels, Style
    from attnviz.outputs.render import query_file
    from tests.conftest import query_of

    window = window_of(sentence, 2, 8)  # quick brown fox jumps over the
    assert window.tokens[2] == sentence.tokens[4] == "fox"
    texts = _texts(query_of(window, 2, [0], [0, 1], Style()))
    assert "where “fox” (position 4) looks, in every head" in texts
    assert "4: fox" in texts and "2: quick" in texts
    assert query_file(Labels.of(window), 2, "png") == "query-fox-4.png"
    # the whole text's, the same
    assert query_file(Labels.of(sentence), 4, "png") == "query-fox-4.png"


def test_pooled_figures_count_the_texts_tokens(sentence):
    """An overview and a layer grid of pooled maps count the text's tokens, not the cells."""
    from attnviz.analysis.pooling import pool, pooled_attention
    from attnviz.outputs.figures import Labels, LayerFigure, Style
    from tests.conftest import overview_of

    pooled = pooled_attention(sentence, pool(sentence.weights, 3))
    assert len(pooled.tokens) == 6 and len(sentence.tokens) == 16
    assert pooled.token_counts() == (16, 16)
    layers, heads = list(range(len(sentence.weights))), [0, 1, 2]
    said = " ".join(_texts(overview_of(pooled, layers, heads, Style())))
    assert "· 16 tokens ·" in said and " 6 tokens" not in said
    grid = LayerFigure(Labels.of(pooled), heads, Style())
    said = " ".join(_texts(grid.draw(pooled.weights[0], 0)))
    assert "16 tokens" in said and " 6 tokens" not in said
    grid.close()


@pytest.mark.slow  # the bundled model and figures, end to end
def test_a_query_outside_the_window_is_said(bundled, tmp_path):
    """A query the window does not hold gets no figure (it is drawn in the window), and the
    run says so; one inside it gets its figure, named by its position in the text."""
    import json

    from typer.testing import CliRunner

    from attnviz.cli import app

    text = "The quick brown fox jumps over the lazy dog because it was bored."
    runner = CliRunner()
    for query, drawn in (("fox", True), ("dog", False)):
        out = tmp_path / query
        args = ["show", text, "--window", "2:8", "-q", query, "-l", "0", "-H", "0", "--json"]
        result = runner.invoke(app, [*args, "-o", str(out)])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        figures = [p for p in map(str, data["images"]) if "query-" in p]
        note = [n for n in data["notes"] if n.startswith("no query figure")]
        if drawn:
            assert len(figures) == 1 and figures[0].endswith("query-fox-4.png") and not note
        else:
            assert not figures
            assert note == [
                "no query figure: it is drawn in the window, and --window 2:8 does not hold "
                "position 9; widen it, or leave --window out"
            ]


def test_the_terminal_says_how_the_images_show_a_long_text(sentence):
    """Under "wrote N images": pooled maps and their block, and where the exact cells are."""
    from rich.console import Console

    from attnviz.analysis.pooling import pool, pooled_attention
    from attnviz.outputs.terminal import print_written

    pooled = pooled_attention(sentence, pool(sentence.weights, 3, "max"))
    said = []
    for drawn, window in ((pooled, None), (pooled, window_of(sentence, 2, 8)), (sentence, None)):
        console = Console(record=True, width=200)
        print_written(console, ["a.png"], "out", drawn=drawn, window=window)
        said.append(console.export_text())
    assert "the maps pooled: each cell the max of 3 × 3 tokens" in said[0]
    assert "pooled (each cell the max of 3 × 3 tokens); head figures: exact cells 2:8" in said[1]
    assert "pooled" not in said[2] and said[2].startswith("wrote 1 images to out/")
