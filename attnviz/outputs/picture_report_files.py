"""Writing a report over pictures (`analysis.vision_report.PictureReport`): heads.csv and
heads.json as the text report writes them (one row per head), the mean attention distance
against depth (mean-distance.png) and done.json listing them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from attnviz.outputs.files import clear_previous, prepare_dir, write_text_atomic
from attnviz.outputs.report_files import csv_text, write_report_done

if TYPE_CHECKING:
    from attnviz.analysis.vision_report import PictureReport
    from attnviz.outputs.figures import Style

FIGURE = "mean-distance"  # the figure's name, before its format's suffix


def write_picture_report(report: PictureReport, out: Path, style: Style) -> list[Path]:
    """Write heads.csv, heads.json and the figure into `out`, then `done.json` listing them;
    the files of an earlier report into `out` are removed first."""
    from attnviz.outputs.figures import distance_figure, save_figure

    prepare_dir(out)
    clear_previous(out)
    as_json = json.dumps(report.as_dict(), ensure_ascii=False, indent=1)
    written = [write_text_atomic(out / "heads.csv", csv_text(report.rows())),
               write_text_atomic(out / "heads.json", as_json)]  # fmt: skip
    heads = list(report.heads)
    roles = [[report.role(layer, head) for head in heads] for layer in report.layers]
    figure = distance_figure(report.distance[:, heads], roles, list(report.layers),
                             report.uniform, figure_title(report), style)  # fmt: skip
    written.append(save_figure(figure, out / f"{FIGURE}.{style.fmt}", style))
    write_report_done(out, report.info.name, style, written)
    return written


def figure_title(report: PictureReport) -> str:
    """The figure's title: what it shows, the model, and what it averages over."""
    grids = " or ".join(f"{rows} × {cols}" for rows, cols in report.grids)
    pictures = f"{report.pictures} picture{'s' * (report.pictures != 1)}"
    return (f"Mean attention distance per head — {report.info.name}\n"
            f"{pictures} · {grids} patches of {report.patch} px · one dot per head")  # fmt: skip
