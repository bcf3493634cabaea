"""What `attnviz needle` writes: needle.json (everything --json prints), heads.csv (every head
ranked by retrieval score), ablation.csv, report.md, and its figures (grid.png: the runs;
heads.png: the layer × head map of scores; ablation.png), each file written atomically."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING

from attnviz.outputs.files import write_text_atomic

if TYPE_CHECKING:
    from attnviz.analysis.retrieval import NeedleResult
    from attnviz.outputs.figures import Style

SHOWN = 20  # heads listed in report.md and the terminal


def recall_grid(result: NeedleResult):
    """(depths, lengths): each run's recall of the needle."""
    import numpy as np

    grid = np.full((len(result.depths), len(result.lengths)), np.nan)
    for run in result.runs:
        grid[result.depths.index(run.depth), result.lengths.index(run.length)] = run.recall
    return grid


def ablation_table(result: NeedleResult) -> list[tuple[int, float, list[float]]]:
    """Per k: (k, the mean recall with the k best heads removed, each random draw's)."""
    found = []
    for k in dict.fromkeys(a.k for a in result.ablations):
        top = next(a.recall for a in result.ablations if a.k == k and a.kind == "top")
        draws = [a.recall for a in result.ablations if a.k == k and a.kind == "random"]
        found.append((k, top, draws))
    return found


def write_needle(result: NeedleResult, out: Path, style: Style) -> list[Path]:
    """Every file of the test, in `out` (which exists)."""
    said = json.dumps(result.as_dict(), ensure_ascii=False, indent=1)
    written = [write_text_atomic(out / "needle.json", said)]
    if result.retrieval is not None:
        written.append(write_text_atomic(out / "heads.csv", _heads_csv(result)))
    if result.ablations:
        written.append(write_text_atomic(out / "ablation.csv", _ablation_csv(result)))
    written += _figures(result, out, style)
    written.append(write_text_atomic(out / "report.md", _report(result, style)))
    return written


def _heads_csv(result: NeedleResult) -> str:
    text = io.StringIO()
    rows = csv.writer(text, lineterminator="\n")
    rows.writerow(["rank", "layer", "head", "retrieval_score"])
    assert result.retrieval is not None
    for rank, (layer, head, score) in enumerate(result.retrieval.ranked(), start=1):
        rows.writerow([rank, layer, head, f"{score:.6f}"])
    return text.getvalue()


def _ablation_csv(result: NeedleResult) -> str:
    text = io.StringIO()
    rows = csv.writer(text, lineterminator="\n")
    rows.writerow(["k", "heads", "seed", "recall", "removed"])
    for a in result.ablations:
        removed = " ".join(f"{layer}.{head}" for layer, head in a.heads)
        rows.writerow([a.k, a.kind, "" if a.seed is None else a.seed, f"{a.recall:.4f}", removed])
    return text.getvalue()


def _figures(result: NeedleResult, out: Path, style: Style) -> list[Path]:
    from attnviz.outputs.figures import save_figure
    from attnviz.outputs.figures.needle import ablation_figure, grid_figure
    from attnviz.outputs.figures.report import importance_figure

    ext = style.fmt
    title = f"{result.model}: recall of the needle in each answer"
    written = [save_figure(grid_figure(recall_grid(result), result.lengths, result.depths, title,
                                       style), out / f"grid.{ext}", style)]  # fmt: skip
    found = result.retrieval
    if found is not None:
        import numpy as np

        n_layers, n_heads = found.scores.shape
        ranks = np.zeros(found.scores.shape, dtype=int)
        for rank, (layer, head, _) in enumerate(found.ranked(), start=1):
            ranks[layer, head] = rank
        figure = importance_figure(
            found.scores, ranks, list(range(n_layers)), list(range(n_heads)),
            f"{result.model}: retrieval score per head ({found.runs} of {found.of} runs)",
            "retrieval score", style, ranked="best retrieval heads",
        )  # fmt: skip
        written.append(save_figure(figure, out / f"heads.{ext}", style))
    if result.ablations:
        table = ablation_table(result)
        figure = ablation_figure([k for k, _, _ in table], [t for _, t, _ in table],
                                 [d for _, _, d in table], result.recall(),
                                 f"{result.model}: removing retrieval heads", style)  # fmt: skip
        written.append(save_figure(figure, out / f"ablation.{ext}", style))
    return written


def _report(result: NeedleResult, style: Style) -> str:
    from attnviz.analysis.retrieval import DEFINITION, HELD

    ext = style.fmt
    found = result.retrieval
    lines = [
        f"# Retrieval heads of {result.model}",
        "",
        f"Needle: “{result.needle}”  ",
        f"Question: “{result.question}”  ",
        f"Haystack: {result.haystack}"
        + (f" (read {result.repeats} times over)" if result.repeats > 1 else ""),
        f"Runs: {len(result.lengths)} lengths × {len(result.depths)} depths, greedy answers of "
        f"at most {result.answer_tokens} tokens; mean recall of the needle "
        f"{result.recall():.2f}.",
        "",
        f"Score: {DEFINITION} (held: recall ≥ {HELD}).",
        "",
        "## The runs",
        "",
        f"![grid](grid.{ext})",
        "",
        "| depth | " + " | ".join(f"{n:,}" for n in result.lengths) + " |",
        "|---|" + "---|" * len(result.lengths),
    ]
    grid = recall_grid(result)
    for i, depth in enumerate(result.depths):
        lines.append(f"| {depth:g}% | " + " | ".join(f"{v:.2f}" for v in grid[i]) + " |")
    lines += ["", "## Retrieval heads", ""]
    if found is None:
        lines.append("No answer held the needle: no head's retrieval score can be measured.")
    else:
        lines += [
            f"Mean over the {found.runs} of {found.of} runs whose answer held the needle. "
            f"{found.share_above():.1%} of the heads score above 0.1.",
            "",
            f"![heads](heads.{ext})",
            "",
            "| rank | head | score |",
            "|---|---|---|",
        ]
        for rank, (layer, head, score) in enumerate(found.ranked()[:SHOWN], start=1):
            lines.append(f"| {rank} | {layer}.{head} | {score:.3f} |")
        lines.append("")
        lines.append("Every head: heads.csv.")
    if result.ablations:
        lines += ["", "## Removing them", "",
                  "Every run answered again with heads zero-ablated: the k best retrieval heads, "
                  "or k heads drawn at random (none of the k best).", "",
                  f"![ablation](ablation.{ext})", "",
                  "| k | k best removed | k random removed (mean; draws) |",
                  "|---|---|---|"]  # fmt: skip
        for k, top, draws in ablation_table(result):
            each = ", ".join(f"{d:.2f}" for d in draws)
            lines.append(f"| {k} | {top:.2f} | {sum(draws) / len(draws):.2f} ({each}) |")
        lines.append(f"\nNothing removed: {result.recall():.2f}.")
    return "\n".join(lines) + "\n"
