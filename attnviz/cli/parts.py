"""`report` in parts at the command line: the options --shard, --partial and --resume, who
speaks in a launched run (rank 0 alone: its progress shows every rank's count), and what a
shard says when it is done."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from attnviz.cli.app import Panel, fail, out_console, progress
from attnviz.cli.options import briefly, flag, valued
from attnviz.errors import AttnvizError, RankFailed

ShardOpt = valued(
    str,
    "--shard",
    metavar="I/N",
    panel=Panel.PARTS,
    help=briefly(
        "Run shard I of N alone, for `attnviz merge`.",
        "Shard I (0 ≤ I < N) of the corpus, its sums written to --partial DIR (job arrays "
        "and other schedulers without a launcher).",
    ),
)
PartialOpt = valued(
    Path,
    "--partial",
    metavar="DIR",
    panel=Panel.PARTS,
    help=briefly(
        "Where shards keep their sums.",
        "With --shard, its folder; under torchrun or accelerate launch, each rank's "
        "(default: OUT/.partials, removed once the report is written).",
    ),
)
ResumeOpt = Annotated[
    bool,
    flag(
        "--resume",
        briefly(
            "Skip what the sums in --partial hold already.",
            "After a run that failed, with the same command: what the shards' sums hold is "
            "not run again.",
        ),
        Panel.PARTS,
    ),
]


def rank() -> tuple[int, int] | None:
    """(rank, world size) in a launched run, else None."""
    from attnviz.pipelines.distributed import launched

    return launched()


def quiet() -> bool:
    """Whether this process is a rank other than 0 of a launched run: it prints nothing."""
    found = rank()
    return found is not None and found[0] != 0


def bar(label: str, *columns: Any) -> Any:
    """The command's progress bar; in a launched run, one with a column for each bar's name
    (`RankBars` names them by rank) on rank 0, and none on the others."""
    from rich.progress import Progress, TextColumn

    if rank() is None:
        return progress(label, *columns)
    if quiet():
        return Progress(disable=True)
    return progress(label, TextColumn("{task.description}"), *columns)


class RankBars:
    """Rank 0's progress: a bar for each rank, from their counts and totals (`on_ranks`)."""

    def __init__(self, shown: Any) -> None:
        self.shown, self.tasks = shown, {}

    def __call__(self, counts: list[int], totals: list[int]) -> None:
        for at, (count, total) in enumerate(zip(counts, totals)):
            if at not in self.tasks:
                self.tasks[at] = self.shown.add_task(f"rank {at}", total=total or None)
            self.shown.update(self.tasks[at], completed=count, total=total or None)


def failed(error: AttnvizError) -> typer.Exit:
    """An error in one line, from rank 0 only: another rank says nothing, unless rank 0 is
    the one that stopped (no one else could say so)."""
    if quiet() and not (isinstance(error, RankFailed) and error.rank == 0):
        return typer.Exit(error.exit_code)
    return fail(error)


def say_shard(found: dict[str, Any], written: list[Path], as_json: bool) -> None:
    """What `report --shard` wrote."""
    import json

    index, count = found["shard"]
    if as_json:
        data = {"shard": [index, count], "texts": found["texts"], "partial": str(written[0])}
        typer.echo(json.dumps(data, ensure_ascii=False, indent=2))
        return
    out_console.print(
        f"wrote shard {index} of {count} ({found['texts']} texts) to [bold]{written[0]}[/]; "
        "attnviz merge makes the report once every shard is there",
        highlight=False,
    )
