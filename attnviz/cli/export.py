"""`attnviz export`: heatmaps for many sentences, batched and resumable."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.app import Command, app, fail, out_console, progress, warn
from attnviz.cli.options import (
    AttentionImpl,
    AttentionOpt,
    BatchOpt,
    CmapOpt,
    Device,
    DeviceOpt,
    DpiOpt,
    FileOpt,
    FormatOpt,
    HeadOpt,
    HideOpt,
    ImageFormat,
    LayerOpt,
    MeasureName,
    MeasureOpt,
    ModelOpt,
    QueryOpt,
    Scale,
    ScaleOpt,
    SentencesArg,
    TruncateOpt,
    WordsOpt,
    flag,
    style,
)
from attnviz.core import models
from attnviz.core.adapters import STACKS
from attnviz.errors import AttnvizError, Interrupted
from attnviz.outputs.render import FIGURES

# The choices of --figures, from the one list of figure kinds (attnviz.outputs.render.FIGURES).
FigureKind = Enum("FigureKind", {kind: kind for kind in FIGURES}, type=str)
FIGURES_HELP = "; ".join(f"{kind}: {shows}" for kind, shows in FIGURES.items())
# The choices of --stack (encoder-decoder models), from the adapters' one list.
StackName = Enum("StackName", {stack: stack for stack in STACKS}, type=str)


@app.command(cls=Command)
def export(
    sentences: SentencesArg = None,
    file: FileOpt = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder.")] = Path(
        "attnviz-out/export"
    ),
    model: ModelOpt = None,
    layer: LayerOpt = None,
    head: HeadOpt = None,
    figures: Annotated[
        list[FigureKind] | None,
        typer.Option(
            "--figures",
            metavar="KIND",
            help=f"Figures to write; repeat for more ({FIGURES_HELP}). Default: all.",
            show_default=False,
        ),
    ] = None,
    query: QueryOpt = None,
    stack: Annotated[
        StackName | None,
        typer.Option(
            "--stack",
            help="Encoder-decoder models: the attention to export, encoder (source × source), "
            "decoder (target × target) or cross (target × source). Default: cross.",
            show_default=False,
        ),
    ] = None,
    fmt: FormatOpt = ImageFormat.png,
    dpi: DpiOpt = 100,
    cmap: CmapOpt = "viridis",
    scale: ScaleOpt = Scale.absolute,
    words: WordsOpt = False,
    measure: MeasureOpt = MeasureName.weights,
    hide_special: HideOpt = False,
    truncate: TruncateOpt = False,
    save_raw: Annotated[
        bool,
        flag(
            "--save-raw",
            "Also write attention.npz: the weights [layer, head, q, k], or the --measure's "
            "values under its name (alti, rollout: [layer, q, k]).",
        ),
    ] = False,
    html: Annotated[
        bool, flag("--html", "Also write attention.html (interactive, offline) per sentence.")
    ] = False,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            metavar="N",
            help="Drawing processes, each drawing whole sentences while this one runs the "
            "model; 1 draws in this process.",
        ),
    ] = 1,
    batch_size: BatchOpt = 8,
    overwrite: Annotated[
        bool,
        flag(
            "--overwrite",
            "Redo every sentence, and first remove an earlier export of other sentences from "
            "--out (only the files attnviz wrote).",
        ),
    ] = False,
    device: DeviceOpt = Device.auto,
    attention: AttentionOpt = AttentionImpl.sdpa,
    as_json: Annotated[bool, flag("--json", "Print the run's summary as JSON on stdout.")] = False,
) -> None:
    """Write heatmaps for many sentences: one folder each, plus manifest.json and manifest.csv.

    Each folder `NNNN-slug-hash/` holds overview, one grid per layer and one figure per head.
    Blank lines are skipped and counted. A re-run skips sentences already complete with the
    same settings and finishes the rest; an interrupted run leaves no half-written file.
    An output folder holds one sentence list: more sentences added at the end are exported
    there too, another list is refused (use another --out, or --overwrite to replace it).

    An encoder-decoder model (T5, BART, Marian) reads `source<TAB>target` lines and exports
    one --stack of each pair; --save-raw's attention.npz then also holds source_tokens,
    target_tokens and key_tokens.
    """
    from rich.progress import TextColumn

    from attnviz.core.inputs import read_sentences
    from attnviz.pipelines.export import ExportOptions
    from attnviz.pipelines.export import export as run_export

    try:
        chosen = read_sentences(file, sentences)
        options = ExportOptions(
            layers=tuple(layer) if layer else None,
            heads=tuple(head) if head else None,
            figures=tuple(k.value for k in figures) if figures else ("overview", "layers", "heads"),
            words=words,
            hide_special=hide_special,
            truncate=truncate,
            save_raw=save_raw,
            html=html,
            measure=measure.value,
            fmt=fmt.value,
            dpi=dpi,
            cmap=style(fmt, dpi, cmap).cmap,
            scale=scale.value,
            query=query,
            stack=stack.value if stack else None,
        )
        bar = progress("export", TextColumn("{task.fields[rates]}"))
        with bar:
            task = bar.add_task("export", total=len(chosen.items), rates="")
            counted = {"figures": 0}

            def advance(record, n_figures: int) -> None:
                counted["figures"] += n_figures
                elapsed = max(bar.tasks[0].elapsed or 0.0, 1e-9)
                done = bar.tasks[0].completed + 1
                figures_rate = counted["figures"] / elapsed
                rates = f"{done / elapsed:.2f} sentences/s · {figures_rate:.0f} figures/s"
                bar.update(task, advance=1, rates=rates)

            summary = run_export(
                models.model(model, device.value, attention.value),
                chosen,
                out,
                options=options,
                batch_size=batch_size,
                jobs=jobs,
                overwrite=overwrite,
                on_progress=advance,
                on_warning=warn,
            )
    except AttnvizError as error:
        raise fail(error) from None

    if as_json:
        typer.echo(json.dumps(summary.as_dict(), ensure_ascii=False, indent=2))
    elif summary.nothing_to_do:
        too_long = f", {summary.too_long} too long (skipped)" if summary.too_long else ""
        out_console.print(
            f"nothing to do: {summary.complete} sentences already complete with these "
            f"settings{too_long} · {summary.seconds:.1f} s (--overwrite redoes them)",
            highlight=False,
        )
    else:
        parts = [
            f"{summary.sentences} sentences",
            f"{summary.written} written",
            f"{summary.complete} already complete",
            f"{summary.too_long} too long (skipped)",
            f"{summary.truncated} truncated",
            f"{summary.blank} blank lines skipped",
            f"{summary.figures} figures",
            f"{summary.seconds:.1f} s",
        ]
        out_console.print(" · ".join(parts), highlight=False)
    if summary.removed and not as_json:
        out_console.print(
            f"removed {summary.removed} sentence folders of an earlier export (--overwrite)",
            highlight=False,
        )
    if summary.interrupted:
        raise fail(
            Interrupted(
                f"{summary.written + summary.complete} of {summary.sentences} sentences are "
                "complete; run the same command again to finish"
            )
        )
    if not as_json:
        out_console.print(
            f"manifest: {summary.out / 'manifest.json'} and manifest.csv", highlight=False
        )
