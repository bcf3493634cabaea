"""`attnviz needle` in the terminal: the runs' grid (recall of the needle by length and
depth), the best retrieval heads with their scores, and the ablation's table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from attnviz.analysis.retrieval import NeedleResult


def _recall(value: float) -> Text:
    style = "green" if value >= 0.9 else "yellow" if value >= 0.5 else "red"
    return Text(f"{value:.2f}", style=style)


def print_needle(console: Console, result: NeedleResult, shown: int = 10) -> None:
    """The grid of runs, the `shown` best heads, and the ablation where it ran."""
    from attnviz.analysis.retrieval import HELD
    from attnviz.outputs.needle_files import ablation_table, recall_grid

    repeated = f", read {result.repeats}× over" if result.repeats > 1 else ""
    console.print(
        f"[bold]{result.model}[/] · needle in a haystack ({result.haystack}{repeated}) · "
        f"{len(result.runs)} runs, mean recall {result.recall():.2f}",
        highlight=False,
    )
    console.print("Recall of the needle: share of its words in the answer (rows: depth of the "
                  "needle; columns: prompt tokens)", highlight=False)  # fmt: skip
    grid = Table(box=None, padding=(0, 1, 0, 0))
    grid.add_column("depth", justify="right")
    for length in result.lengths:
        grid.add_column(f"{length:,}", justify="right")
    for depth, row in zip(result.depths, recall_grid(result)):
        grid.add_row(f"{depth:g}%", *(_recall(float(v)) for v in row))
    console.print(grid)
    found = result.retrieval
    if found is None:
        console.print(f"No answer recalled {HELD:.0%} of the needle: no head's retrieval score "
                      "can be measured.", highlight=False)  # fmt: skip
        return
    console.print(
        f"[bold]Retrieval heads[/] (mean over the {found.runs} of {found.of} runs that held the "
        f"needle; {found.share_above():.1%} of heads score above 0.1; definition in report.md)",
        highlight=False,
    )
    heads = Table(box=None, padding=(0, 2, 0, 0))
    heads.add_column("rank", justify="right")
    heads.add_column("head")
    heads.add_column("score", justify="right")
    for rank, (layer, head, score) in enumerate(found.ranked()[:shown], start=1):
        heads.add_row(str(rank), f"L{layer} H{head}", f"{score:.3f}")
    console.print(heads)
    if result.ablations:
        table = Table(title=f"Removing heads (recall, nothing removed: {result.recall():.2f})",
                      title_justify="left", box=None, padding=(0, 2, 0, 0))  # fmt: skip
        table.add_column("k", justify="right")
        table.add_column("k best removed", justify="right")
        table.add_column("k random removed: mean (draws)", justify="right")
        for k, top, draws in ablation_table(result):
            each = ", ".join(f"{d:.2f}" for d in draws)
            mean = sum(draws) / len(draws)
            table.add_row(str(k), _recall(top), Text.assemble(_recall(mean), f" ({each})"))
        console.print(table)
