"""`attnviz export`: heatmaps for many sentences, batched and resumable."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from attnviz.cli.app import Command, Panel, app, fail, out_console, progress, warn
from attnviz.cli.options import (
    LOAD,
    MEASURING,
    SELECT,
    STYLE,
    WRITING,
    BatchOpt,
    FileOpt,
    HideOpt,
    NoTowerOpt,
    QueryOpt,
    SentencesArg,
    StackName,
    TruncateOpt,
    WordsOpt,
    briefly,
    flag,
    grouped,
    valued,
)
from attnviz.core.settings import Load
from attnviz.errors import AttnvizError, Interrupted
from attnviz.outputs.figures import Style
from attnviz.outputs.render import FIGURES

# The choices of --figures, from the one list of figure kinds (attnviz.outputs.render.FIGURES).
FigureKind = Enum("FigureKind", {kind: kind for kind in FIGURES}, type=str)
FIGURES_HELP = "; ".join(f"{kind}: {shows}" for kind, shows in FIGURES.items())
FiguresOpt = valued(
    list[FigureKind],
    "--figures",
    metavar="KIND",
    panel=Panel.OUTPUT,
    help=briefly("Figures to write; repeat for more. Default: all.", f"{FIGURES_HELP}."),
)
ExportStackOpt = valued(
    StackName,
    "--stack",
    panel=Panel.WRITING,
    help=briefly(
        "The stack of an encoder-decoder. Default: cross.",
        "Encoder-decoder models: the attention to export, encoder (source × source), decoder "
        "(target × target) or cross (target × source).",
    ),
)
SaveRawOpt = Annotated[
    bool,
    flag(
        "--save-raw",
        briefly(
            "Also write attention.npz, the numbers drawn.",
            "The weights [layer, head, q, k], or the --measure's values under its name (alti, "
            "rollout: [layer, q, k]).",
        ),
        Panel.OUTPUT,
    ),
]
PagesOpt = Annotated[
    bool,
    flag("--html", briefly("Also write attention.html per sentence.", "Interactive, offline.")),
]
ExportJobsOpt = Annotated[
    int,
    typer.Option(
        "--jobs",
        "-j",
        min=1,
        metavar="N",
        rich_help_panel=Panel.OUTPUT,
        help=briefly(
            "Drawing processes; 1 draws in this process.",
            "Each draws whole sentences while this one runs the model.",
        ),
    ),
]
OverwriteOpt = Annotated[
    bool,
    flag(
        "--overwrite",
        briefly(
            "Redo every sentence; replace another export in --out.",
            "An earlier export of other sentences is removed first (only the files attnviz wrote).",
        ),
    ),
]
ExportOutOpt = Annotated[Path, typer.Option("--out", "-o", help="Output folder.")]
SummaryJsonOpt = Annotated[bool, flag("--json", "Print the run's summary as JSON on stdout.")]


@app.command(cls=Command)
@grouped
def export(
    sentences: SentencesArg = None,
    file: FileOpt = None,
    out: ExportOutOpt = Path("attnviz-out/export"),
    load: Load = LOAD,
    select: dict = SELECT,
    figures: FiguresOpt = None,
    query: QueryOpt = None,
    stack: ExportStackOpt = None,
    writing: dict = WRITING,
    style: Style = STYLE,
    words: WordsOpt = False,
    measuring: dict = MEASURING,
    hide_special: HideOpt = False,
    truncate: TruncateOpt = False,
    save_raw: SaveRawOpt = False,
    html: PagesOpt = False,
    jobs: ExportJobsOpt = 1,
    batch_size: BatchOpt = 8,
    overwrite: OverwriteOpt = False,
    as_json: SummaryJsonOpt = False,
    no_tower: NoTowerOpt = False,
) -> None:
    """Write heatmaps for many sentences: one folder each, plus manifest.json and manifest.csv.

    Each folder `NNNN-slug-hash/` holds overview, one grid per layer and one figure per head.
    A re-run skips sentences already complete with the same settings and finishes the rest.
    An encoder-decoder model reads `source<TAB>target` lines.
    \f
    Blank lines are skipped and counted; an interrupted run leaves no half-written file.
    An output folder holds one sentence list: more sentences added at the end are exported
    there too, another list is refused (use another --out, or --overwrite to replace it).

    With a decoder, --generate N continues each sentence and exports the attention over it
    and what the model wrote (one sentence a pass); done.json and manifest.json hold where
    each continuation starts and its tokens' probabilities (attention.npz too).
    An encoder-decoder model (T5, BART, Marian) exports one --stack of each pair; --save-raw's
    attention.npz then also holds source_tokens, target_tokens and key_tokens.
    A vision model (ViT, DeiT, DINOv2, BEiT, CLIP, SigLIP) reads picture files and folders of
    them: each picture's folder also holds its views over the picture (docs/vision.md).
    A vision-language model reads a JSONL file of pictures and questions, one
    {"picture": PATH, "prompt": TEXT} a line ("target" optional; --generate N answers the
    others): each question's folder also holds layout.json (each image token's cell) and its
    vision tower's heads, unless --no-tower (docs/vision-language.md).
    """
    from attnviz.core.inputs import export_input, export_questions
    from attnviz.outputs import terminal
    from attnviz.pipelines.export import export as run_export
    from attnviz.pipelines.request import ExportRequest

    try:
        questions, asked = None, export_questions(file, sentences)
        if asked is not None:
            (texts, questions), pictures = asked, None
        else:
            texts, pictures = export_input(file, sentences)
        request = ExportRequest(load, sentences=texts, pictures=pictures, questions=questions,
            **select,
            stack=stack.value if stack else None,
            truncate=truncate, words=words, hide_special=hide_special, **measuring,
            query=query, html=html, figures=tuple(k.value for k in figures) if figures else None,
            save_raw=save_raw, out=out, style=style, jobs=jobs,
            batch_size=batch_size, overwrite=overwrite, **writing, tower=not no_tower,
        )  # fmt: skip
        with _progress(len(request.sentences.items)) as advance:
            summary = run_export(request, on_progress=advance, on_warning=warn)
    except AttnvizError as error:
        raise fail(error) from None
    if as_json:
        typer.echo(json.dumps(summary.as_dict(), ensure_ascii=False, indent=2))
    else:
        terminal.print_export(out_console, summary)
    if summary.interrupted:
        done = summary.written + summary.complete
        raise fail(Interrupted(f"{done} of {summary.sentences} {summary.unit} are complete; run "
                               "the same command again to finish"))  # fmt: skip
    if not as_json:
        out_console.print(
            f"manifest: {summary.out / 'manifest.json'} and manifest.csv", highlight=False
        )


@contextmanager
def _progress(total: int) -> Iterator[Callable[[Any, int], None]]:
    """A progress bar over `total` sentences, with sentences and figures per second; yields
    what export calls with each sentence's record and figures."""
    from rich.progress import TextColumn

    bar = progress("export", TextColumn("{task.fields[rates]}"))
    with bar:
        task = bar.add_task("export", total=total, rates="")
        counted = {"figures": 0}

        def advance(record: Any, n_figures: int) -> None:
            counted["figures"] += n_figures
            elapsed = max(bar.tasks[0].elapsed or 0.0, 1e-9)
            done = bar.tasks[0].completed + 1
            rates = (
                f"{done / elapsed:.2f} sentences/s · {counted['figures'] / elapsed:.0f} figures/s"
            )
            bar.update(task, advance=1, rates=rates)

        yield advance
