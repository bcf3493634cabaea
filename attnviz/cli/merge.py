"""`attnviz merge`: one report from the partials of `report --shard I/N` runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.app import Command, app, fail
from attnviz.cli.options import STYLE, JsonOpt, grouped
from attnviz.errors import AttnvizError
from attnviz.outputs.figures import Style


@app.command(cls=Command)
@grouped
def merge(
    folders: Annotated[
        list[Path],
        typer.Argument(
            help="Folders holding the partials (report --shard I/N --partial FOLDER).",
            show_default=False,
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Report folder.")] = Path(
        "attnviz-out/report"
    ),
    style: Style = STYLE,
    as_json: JsonOpt = False,
) -> None:
    """Merge the partials of `attnviz report --shard I/N` runs into one report.

    Any complete set (one partial of every shard of one run) gives the files one process's
    report would: report.md, heads.csv, heads.json and figures, the numbers the same to the
    last digit. A missing or repeated shard, or partials of another model, corpus or option
    set, are refused. No model is loaded.
    """
    from attnviz.cli.report import print_report
    from attnviz.pipelines.merge import merge as run_merge

    try:
        result, written = run_merge(folders, out, style)
    except AttnvizError as error:
        raise fail(error) from None
    if as_json:
        typer.echo(json.dumps(result.as_dict(), ensure_ascii=False, indent=2))
        return
    print_report(result, written, out)
