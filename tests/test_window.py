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
