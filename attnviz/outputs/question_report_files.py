"""Writing a report over pictures and questions (`analysis.picture_heads.QuestionReport`):
heads.csv and heads.json (one row per head), sinks.csv (the most drawn image tokens,
ranked), report.md, the picture's share against layer (picture-share.png) and done.json
listing them, each file written whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from attnviz.outputs.files import clear_previous, prepare_dir, write_text_atomic
from attnviz.outputs.report_files import csv_text, write_report_done

if TYPE_CHECKING:
    from attnviz.analysis.picture_heads import QuestionReport
    from attnviz.outputs.figures import Style

FIGURE = "picture-share"  # the figure's name, before its format's suffix
SINK_COLUMNS = ["picture", "token", "cell", "least_draw", "mean_draw", "questions", "sink"]


def write_question_report(report: QuestionReport, out: Path, style: Style) -> list[Path]:
    """Write the report's files into `out`, then `done.json` listing them; the files of an
    earlier report into `out` are removed first."""
    from attnviz.outputs.figures import save_figure, share_figure

    prepare_dir(out)
    clear_previous(out)
    heads = list(report.heads)
    as_json = json.dumps(report.as_dict(), ensure_ascii=False, indent=1)
    sinks = csv_text([s.as_dict() for s in report.sinks], SINK_COLUMNS)
    written = [write_text_atomic(out / "heads.csv", csv_text(report.rows())),
               write_text_atomic(out / "heads.json", as_json),
               write_text_atomic(out / "sinks.csv", sinks)]  # fmt: skip
    figure = share_figure(report.share[:, heads], report.sink_share[:, heads],
                          list(report.layers), figure_title(report), style)  # fmt: skip
    written.append(save_figure(figure, out / f"{FIGURE}.{style.fmt}", style))
    written.append(write_text_atomic(out / "report.md", markdown(report, written[-1].name)))
    write_report_done(out, report.info.name, style, written)
    return written


def figure_title(report: QuestionReport) -> str:
    """The figure's title: what it shows, the model, and what it averages over."""
    return (f"The picture's share of attention per head — {report.info.name}\n"
            f"{_over(report)} · one dot per head")  # fmt: skip


def _over(report: QuestionReport) -> str:
    """What the means are over: questions, pictures, and how many were answered."""
    questions = f"{report.questions} question{'s' * (report.questions != 1)}"
    pictures = f"{report.pictures} picture{'s' * (report.pictures != 1)}"
    return f"{questions} about {pictures}, {report.answered} answered"


def markdown(report: QuestionReport, figure: str) -> str:
    """report.md: what was read, how each number is made, each layer's means, the heads that
    give the picture most, and the ranked image tokens that draw attention whatever the
    question."""
    heads = list(report.heads)
    k = report.top_k
    lines = [
        f"# The picture's share of attention — {report.info.name}",
        "",
        f"{_over(report)}"
        + (f" (--generate {report.generate})" if report.generate is not None else "")
        + ".",
        "",
        "Per head of the language model, over the answer's rows (the rows that wrote each "
        "token of the answer; a question without one: the prompt's tokens after the "
        "picture), the mean over the rows, then over the questions:",
        "",
        "- **picture share**: what the row gives the picture's image tokens;",
        "- **patch entropy**: the row over the picture's patches, renormalised, its entropy "
        "over ln(patches): 1 is uniform over the patches, 0 one patch;",
        f"- **top-{k} patch share**: the part of the picture's share its {k} most attended "
        "patches hold;",
        "- **sink share**: the part of the picture's share its sink tokens hold.",
        "",
        f"![The picture's share against layer]({figure})",
        "",
        "## Per layer (mean over the heads)",
        "",
        f"| layer | picture share | patch entropy | top-{k} patch share | sink share |",
        "|---|---|---|---|---|",
    ]
    for slot, layer in enumerate(report.layers):
        values = [getattr(report, name)[slot, heads].mean()
                  for name in ("share", "entropy", "top", "sink_share")]  # fmt: skip
        lines.append(f"| {layer} | " + " | ".join(f"{v:.3f}" for v in values) + " |")
    lines += ["", "## The heads that give the picture most", "",
              "| layer | head | picture share | patch entropy | sink share |",
              "|---|---|---|---|---|"]  # fmt: skip
    rows = sorted(report.rows(), key=lambda row: -row["picture_share"])[:10]
    for row in rows:
        lines.append(f"| {row['layer']} | {row['head']} | {row['picture_share']:.3f} | "
                     f"{row['patch_entropy']:.3f} | {row['sink_share']:.3f} |")  # fmt: skip
    lines += [
        "",
        "## Visual sink tokens",
        "",
        "Image tokens that draw attention whatever the question asks (Kang et al., ICLR 2025, "
        "*See What You Are Told: Visual Attention Sink in Large Multimodal Models*). A "
        "token's **draw** in one question is its received attention (the mean over the "
        "answer's rows, every chosen layer and head) over the mean of its picture's image "
        "tokens: 1 is a uniform share of the picture's attention. A **sink** draws at "
        f"least {report.sink_draw:g} in every question about its picture, which needs two "
        "questions or more. Ranked by the least draw (sinks.csv):",
        "",
    ]
    if not report.sinks:
        lines.append("(no image token)")
    else:
        lines += ["| picture | cell | least draw | mean draw | questions | sink |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for s in report.sinks:
            lines.append(f"| {s.picture} | {s.label} | {s.least:.2f} | {s.mean:.2f} | "
                         f"{s.questions} | {'yes' if s.sink else 'no'} |")  # fmt: skip
    return "\n".join(lines) + "\n"
