"""`attnviz report` end to end, and its numbers tied to what `show` draws."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app

runner = CliRunner()
SENTENCE = "The quick brown fox jumps over the lazy dog because it was bored."


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_report_on_tiny_models_writes_everything(tiny_model_dirs, tmp_path):
    for arch in ("bert", "gpt2"):
        out = tmp_path / arch
        result = runner.invoke(
            app,
            ["report", "The cat sat on the mat.", "Birds sing, loudly!", "-m",
             str(tiny_model_dirs[arch]), "-o", str(out)],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert "Head roles" in result.output and "L1" in result.output
        with open(out / "heads.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert len(rows) == 2 * 4 and rows[0]["layer"] == "0" and "entropy_norm" in rows[0]
        data = json.loads((out / "heads.json").read_text())
        assert data["sentences"] == 2 and len(data["heads"]) == 8
        markdown = (out / "report.md").read_text()
        for name in ("roles.png", "metric-previous.png", "metric-confidence.png"):
            assert f"]({name})" in markdown and (out / name).is_file()
        if arch == "gpt2":  # no separators in a GPT-2 text: that metric is 0 for every head
            assert all(float(row["separator"]) == 0.0 for row in rows)


def test_json_output_and_word_view(tiny_model_dirs, tmp_path):
    result = runner.invoke(
        app,
        ["report", "Unbelievably, it worked.", "-m", str(tiny_model_dirs["bert"]), "-o",
         str(tmp_path), "--json", "--words"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["unit"] == "word" and data["queries"] == 5  # Unbelievably , it worked .
    assert {"layer", "head", "role", "role_score", "previous", "confidence"} <= set(
        data["heads"][0]
    )


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_report_numbers_and_figures_match_show(bundled, tmp_path):
    from attnviz.core.extract import extract

    report = runner.invoke(app, ["report", SENTENCE, "-o", str(tmp_path / "r"), "--json"])
    assert report.exit_code == 0, report.output
    heads = json.loads(report.stdout)["heads"]
    best = max(heads, key=lambda h: h["previous"])
    layer, head = best["layer"], best["head"]
    assert best["role"] == "previous-token"

    att = extract(bundled, SENTENCE)  # what `show` draws
    grid = att.weights[layer, head].astype(np.float64)
    queries = [i for i in range(len(att.tokens)) if not att.special[i]]
    assert best["previous"] == pytest.approx(np.mean([grid[i, i - 1] for i in queries]), abs=1e-12)
    assert best["confidence"] == pytest.approx(np.mean([grid[i].max() for i in queries]), abs=1e-12)

    show = runner.invoke(
        app, ["show", SENTENCE, "-l", layer, "-H", head, "-o", str(tmp_path / "s")]
    )
    assert show.exit_code == 0, show.output
    shown = next((tmp_path / "s").glob(f"*/layer-{layer:02d}-head-{head:02d}.png"))
    example = tmp_path / "r" / f"example-previous-token-layer-{layer:02d}-head-{head:02d}.png"
    _same_picture(example, shown, _map_box(att, grid))  # the report's picture is show's


def _map_box(att, grid) -> tuple[int, int, int, int]:
    """The map's pixels (top, bottom, left, right) in a head figure of `att`."""
    from attnviz.outputs.figures import HeadFigure, Labels, Style

    figure = HeadFigure(Labels.of(att), Style())
    figure.draw(grid, "")
    box = figure.image.axes.get_window_extent()
    height = figure.frames.canvas.get_width_height()[1]
    figure.close()
    return round(height - box.y1), round(height - box.y0), round(box.x0), round(box.x1)


def _same_picture(path_a, path_b, box: tuple[int, int, int, int]) -> None:
    """Two PNGs show the same figure: the same size, the map's cells pixel for pixel, and
    elsewhere at most a few glyph pixels' anti-aliasing (CI once drew one tick label a shade
    apart in the long-lived test process from the same label drawn in a fresh worker)."""
    from PIL import Image

    with Image.open(path_a) as a, Image.open(path_b) as b:
        x, y = np.asarray(a.convert("RGBA")), np.asarray(b.convert("RGBA"))
    assert x.shape == y.shape, (x.shape, y.shape)
    differ = (x != y).any(axis=2)
    top, bottom, left, right = box
    where = np.argwhere(differ)
    assert not differ[top:bottom, left:right].any(), f"the maps differ at {where[:5].tolist()}"
    assert differ.sum() <= 0.002 * differ.size, f"{differ.sum()} pixels differ: {where[:5]}"


def test_bad_input(tiny_model_dirs, tmp_path):
    tiny = str(tiny_model_dirs["bert"])
    cases = [
        (["-t", "broad=2"], "outside the valid range [0, 1]"),
        (["-t", "wobbly=0.3"], "NAME one of previous"),
        (["-f", str(tmp_path / "none.txt")], "no such file"),
        (["-f", str(tmp_path)], "is a folder"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["report", *args, "-m", tiny, "-o", str(tmp_path / "o")])
        assert result.exit_code == 2, (args, result.output)
        assert message in " ".join(result.output.split()) and "Traceback" not in result.output
    too_long = runner.invoke(
        app, ["report", " ".join(["w"] * 100), "-m", tiny, "-o", str(tmp_path / "x")]
    )
    assert too_long.exit_code == 2 and "no sentence fits the model" in too_long.output


def test_report_md_tables_keep_their_cells(tiny_model_dirs, tmp_path):
    """Rendered as Markdown, every table row keeps its cells: `|i − j|` is escaped."""
    from markdown_it import MarkdownIt

    out = tmp_path / "r"
    result = runner.invoke(
        app, ["report", "The cat sat.", "-m", str(tiny_model_dirs["bert"]), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    tokens = MarkdownIt().enable("table").parse((out / "report.md").read_text())
    tables, cells, rows = 0, 0, []
    for token in tokens:
        if token.type == "table_open":
            tables += 1
        elif token.type == "tr_open":
            cells = 0
        elif token.type in ("th_open", "td_open"):
            cells += 1
        elif token.type == "tr_close":
            rows.append((tables, cells))
    assert tables == 5  # roles, strongest heads, mixing ratios, sinks and reach, metrics
    for table in (1, 2, 3, 4, 5):
        widths = {c for t, c in rows if t == table}
        assert len(widths) == 1, (table, widths)
    html = MarkdownIt().enable("table").render((out / "report.md").read_text())
    assert "<td>Σ a[j] over non-special tokens with |i − j| ≤ 2</td>" in html


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_report_layer_head_and_format(tiny_model_dirs, tmp_path):
    out = tmp_path / "r"
    result = runner.invoke(
        app,
        ["report", "The cat sat on the mat.", "-m", str(tiny_model_dirs["bert"]), "-o", str(out),
         "-l", "1", "-H", "0", "-H", "3", "--format", "svg", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(h["layer"], h["head"]) for h in data["heads"]] == [(1, 0), (1, 3)]
    assert (out / "roles.svg").is_file() and (out / "metric-previous.svg").is_file()
    assert not list(out.glob("*.png"))
    markdown = (out / "report.md").read_text()
    assert "](metric-previous.svg)" in markdown and "covers layers 1 and heads 0, 3" in markdown
    again = runner.invoke(
        app, ["report", "Birds sing.", "-m", str(tiny_model_dirs["bert"]), "-o", str(out)]
    )
    assert again.exit_code == 0, again.output
    assert not list(out.glob("*.svg")) and (out / "roles.png").is_file()  # no stale files
