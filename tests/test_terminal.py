"""Terminal views rendered into a plain console: golden output."""

from __future__ import annotations

import io

import numpy as np
from rich.console import Console

from attnviz import terminal
from attnviz.summary import summarise
from tests.conftest import synthetic_attention


def _console(width=100):
    return Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)


def _attention():
    # One layer, two heads over [CLS] a b [SEP]: head 0 attends to the previous token,
    # head 1 mostly to [CLS].
    prev = np.array([[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]], float)
    sink = np.array([[0.7, 0.1, 0.1, 0.1]] * 4)
    return synthetic_attention(
        np.stack([prev, sink])[None], ["[CLS]", "a", "b", "[SEP]"], special=[1, 0, 0, 1]
    )


def test_detail_table_golden():
    att = _attention()
    console = _console()
    terminal.print_head_details(console, att, summarise(att, [0], [0, 1], top_k=2))
    assert [line.rstrip() for line in console.file.getvalue().splitlines()] == [
        "What each head attends to",
        "┏━━━┳━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓",
        "┃ L ┃ H ┃ top tokens (mean attention received) ┃ strongest link (query → key) ┃",
        "┡━━━╇━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩",
        "│ 0 │ 0 │ [CLS] .50 · a .25                    │ [CLS] @0 → [CLS] @0 1.00     │",
        "│ 0 │ 1 │ [CLS] .70 · a .10                    │ [CLS] @0 → [CLS] @0 .70      │",
        "└───┴───┴──────────────────────────────────────┴──────────────────────────────┘",
    ]


def test_head_map_reports_special_share_and_top_other_token():
    att = _attention()
    console = _console()
    terminal.print_head_map(console, att, summarise(att, [0], [0, 1]), [0], [0, 1])
    out = console.file.getvalue()
    # Head 0 sends half of its attention to [CLS] (rows 0 and 1), head 1 sends 0.7 + 0.1.
    assert "Special tokens take 65% of attention on average (50%–80% per head)" in out
    lines = out.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("L0"))
    assert lines[row].split() == ["L0", "a", "a"]
    assert lines[row + 1].split() == [".25", ".10"]


def test_heatmap_shades_without_colour():
    att = _attention()
    console = _console()
    assert terminal.print_heatmap(console, att, 0, 0)
    rows = [line for line in console.file.getvalue().splitlines() if line[:3].strip().isdigit()]
    assert rows[2].endswith("  " + "██" + "  " + "  ")  # token b (row 2) attends to a (column 1)
    assert rows[0].split()[-1] == "██"


def test_heatmap_too_wide_says_so():
    att = synthetic_attention(np.full((1, 1, 60, 60), 1 / 60), [f"t{i}" for i in range(60)])
    console = _console(width=80)
    assert not terminal.print_heatmap(console, att, 0, 0)
    message = " ".join(console.file.getvalue().split())
    assert "heatmap of 60 tokens needs 128 columns and this terminal has 80" in message


def test_colour_ramp_ends():
    assert terminal.colour(0.0) == "#440154" and terminal.colour(1.0) == "#fde725"
