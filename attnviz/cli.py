"""The `attnviz` command line: parse options, call one core function, render its result.

Heavy libraries (torch, transformers, matplotlib) are imported inside the core functions, so
`attnviz --help` starts fast.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from attnviz.errors import AttnvizError, InputError


class _HelpAsFlag:
    """Show -h/--help as a flag in help screens (Typer's own shows it with a `<bool>` value)."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option


class _Group(_HelpAsFlag, TyperGroup):
    pass


class _Command(_HelpAsFlag, TyperCommand):
    pass


app = typer.Typer(
    cls=_Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)
out_console = Console()
err_console = Console(stderr=True)


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class ImageFormat(str, Enum):
    png = "png"
    svg = "svg"
    pdf = "pdf"


class Scale(str, Enum):
    absolute = "absolute"
    head = "head"


def _flag(name: str, help: str) -> Any:
    """An on/off option, shown in help as a flag (no value)."""
    return typer.Option(name, help=help, metavar="")


ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Local model directory, Hugging Face hub id (cached or online), a .gguf file, "
        "or smollm2 (a bundled decoder LLM). Default: the bundled all-MiniLM-L6-v2.",
        show_default=False,
    ),
]
DeviceOpt = Annotated[Device, typer.Option(help="Where to run the model.")]
LayerOpt = Annotated[
    list[int] | None,
    typer.Option(
        "--layer",
        "--layers",
        "-l",
        metavar="N",
        help="A layer to use; repeat for more (-l 0 -l 5). Default: all.",
        show_default=False,
    ),
]
HeadOpt = Annotated[
    list[int] | None,
    typer.Option(
        "--head",
        "--heads",
        "-H",
        metavar="N",
        help="A head to use; repeat for more (-H 2 -H 7). Default: all.",
        show_default=False,
    ),
]
SentencesArg = Annotated[
    list[str] | None,
    typer.Argument(help="Sentences (or use --file).", show_default=False),
]
FileOpt = Annotated[
    str | None,
    typer.Option("--file", "-f", help="Text file, one sentence per line; - reads stdin."),
]
WordsOpt = Annotated[
    bool, _flag("--words", "Merge word pieces into words (to-word sums, from-word averages).")
]
HideOpt = Annotated[
    bool, _flag("--hide-special", "Hide [CLS]/[SEP]/BOS tokens and renormalise each row.")
]
TruncateOpt = Annotated[
    bool, _flag("--truncate", "Cut text longer than the model's limit (and say so).")
]
JsonOpt = Annotated[bool, _flag("--json", "Print the result as JSON on stdout.")]
CmapOpt = Annotated[str, typer.Option(help="Matplotlib colour map for heatmaps.")]
DpiOpt = Annotated[int, typer.Option(min=20, max=600, help="Image resolution (dots per inch).")]
FormatOpt = Annotated[ImageFormat, typer.Option("--format", help="Image file format.")]
ScaleOpt = Annotated[
    Scale,
    typer.Option(
        "--scale",
        help="Heatmap colours: absolute (0–1 for every head) or head (each head to its own "
        "max; the pattern of diffuse heads shows).",
    ),
]
QueryOpt = Annotated[
    str | None,
    typer.Option(
        "--query",
        "-q",
        metavar="TOKEN",
        help="Ask about one token: where it looks in every head. A token as written "
        "(first occurrence), it#2 for the second, or a position.",
        show_default=False,
    ),
]
BatchOpt = Annotated[
    int, typer.Option("--batch-size", "-b", min=1, help="Sentences per forward pass.")
]


def _version(value: bool) -> None:
    if value:
        from attnviz import __version__

        typer.echo(f"attnviz {__version__}")
        raise typer.Exit()


@app.callback()
def cli(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version and exit.",
            callback=_version,
            is_eager=True,
            metavar="",
        ),
    ] = False,
) -> None:
    """See, measure and verify multi-head attention in Hugging Face transformers.

    Every command takes --model (default: the bundled all-MiniLM-L6-v2 encoder). Input and
    usage errors exit with code 2 and one line on stderr.
    """


def _fail(error: AttnvizError) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
    return typer.Exit(error.exit_code)


def _warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)


def _progress(label: str, *columns):
    """A progress bar on stderr, so stdout stays clean for results."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        *columns,
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )


def _style(fmt: ImageFormat, dpi: int, cmap: str, scale: Scale = Scale.absolute):
    from attnviz.outputs.figures import Style, check_cmap

    return Style(fmt=fmt.value, dpi=dpi, cmap=check_cmap(cmap), scale=scale.value)


@app.command(cls=_Command)
def show(
    text: Annotated[
        str,
        typer.Argument(help="The sentence to look at; - reads it from stdin.", show_default=False),
    ],
    model: ModelOpt = None,
    layer: LayerOpt = None,
    head: HeadOpt = None,
    query: QueryOpt = None,
    pair: Annotated[
        str | None,
        typer.Option(
            "--pair",
            metavar="TEXT",
            help="A second sentence (encoders): the model reads [CLS] TEXT [SEP] PAIR [SEP] "
            "with token types; the --html page can restrict to A→B, B→A, A→A, B→B.",
            show_default=False,
        ),
    ] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, help="Tokens listed per head.")] = 3,
    words: WordsOpt = False,
    hide_special: HideOpt = False,
    truncate: TruncateOpt = False,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the heatmap images.")] = Path(
        "attnviz-out"
    ),
    no_images: Annotated[bool, _flag("--no-images", "Do not write images.")] = False,
    html: Annotated[
        bool, _flag("--html", "Also write attention.html, an interactive page that works offline.")
    ] = False,
    fmt: FormatOpt = ImageFormat.png,
    dpi: DpiOpt = 100,
    cmap: CmapOpt = "viridis",
    scale: ScaleOpt = Scale.absolute,
    device: DeviceOpt = Device.auto,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            metavar="N",
            help="Drawing processes, started while the model loads [default: one per core, "
            "at most 4]; 1 draws in this process.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show what every attention head looks at in one sentence, and write heatmaps.

    Prints, for each head, the tokens it attends to most; with one --layer and one --head it
    also draws that head's heatmap in the terminal. Images go to `OUT/<slug>-<hash>/` (one
    folder per distinct text, holding only its last run's files): an overview of all heads,
    one grid per layer, one figure per head.
    """
    from attnviz.core.inputs import read_text
    from attnviz.outputs import terminal
    from attnviz.outputs.render import default_jobs
    from attnviz.pipelines.show import show as run_show

    def print_summary(result: Any) -> None:
        console = out_console
        terminal.print_header(console, result.view)
        layers, heads, info = result.layers, result.heads, result.view.info
        if result.query is not None:
            terminal.print_query(console, result.view, result.query, layers, heads)
        elif len(layers) == info.n_layers and len(heads) == info.n_heads:
            terminal.print_head_map(console, result.view, result.summaries, layers, heads)
        else:
            terminal.print_head_details(console, result.view, result.summaries)
        if len(layers) == 1 and len(heads) == 1:
            terminal.print_heatmap(console, result.view, layers[0], heads[0], scale.value)

    try:
        result = run_show(
            read_text(text),
            model=model,
            layers=layer,
            heads=head,
            top_k=top_k,
            words=words,
            hide_special_tokens=hide_special,
            truncate=truncate,
            out=None if no_images and not html else out,
            style=_style(fmt, dpi, cmap, scale),
            device=device.value,
            query=query,
            images=not no_images,
            html=html,
            pair=pair,
            jobs=jobs or default_jobs(),
            on_summary=None if as_json else print_summary,  # printed while figures are drawn
        )
    except AttnvizError as error:
        raise _fail(error) from None

    if as_json:
        typer.echo(json.dumps(result.as_dict(), ensure_ascii=False, indent=2))
        return
    if result.images:
        out_console.print(
            f"wrote {len(result.images)} images to [bold]{result.folder}/[/]", highlight=False
        )
    if result.page is not None:
        out_console.print(
            f"wrote the interactive page [bold]{result.page}[/]", highlight=False, soft_wrap=True
        )


@app.command(cls=_Command)
def check(
    text: Annotated[
        str,
        typer.Argument(
            help="The sentence to run through the model; - reads it from stdin.",
            show_default=False,
        ),
    ],
    layer: LayerOpt = None,
    all_layers: Annotated[bool, _flag("--all-layers", "Check every layer (the default).")] = False,
    tolerance: Annotated[
        float, typer.Option(min=0.0, help="Largest absolute error that still passes.")
    ] = 1e-5,
    model: ModelOpt = None,
    truncate: TruncateOpt = False,
    device: DeviceOpt = Device.auto,
    as_json: JsonOpt = False,
) -> None:
    """Recompute attention layers from scratch (textbook formulas) and compare with the model.

    For each head h: Q_h = X W_Q^h + b, K_h, V_h alike; softmax(Q_h K_hᵀ / √d_k + mask) V_h;
    heads concatenated and multiplied by W_O. Compares each head's attention probabilities
    and the block's output (after W_O, before residual and LayerNorm) with the model's own.
    Exit code 0 when everything is within the tolerance, 1 on a mismatch.
    """
    from attnviz.core.inputs import read_text
    from attnviz.outputs import terminal
    from attnviz.pipelines.check import check as run_check

    if layer and all_layers:
        raise _fail(InputError("give either --layer or --all-layers, not both"))
    try:
        result = run_check(
            read_text(text),
            model=model,
            layers=layer,
            tolerance=tolerance,
            truncate=truncate,
            device=device.value,
        )
    except AttnvizError as error:
        raise _fail(error) from None
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=2))
    else:
        terminal.print_check(out_console, result)
    raise typer.Exit(0 if result.passed else 1)


class FigureKind(str, Enum):
    overview = "overview"
    layers = "layers"
    heads = "heads"


@app.command(cls=_Command)
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
            help="overview, layers or heads; repeat for more. Default: all three.",
            show_default=False,
        ),
    ] = None,
    query: QueryOpt = None,
    fmt: FormatOpt = ImageFormat.png,
    dpi: DpiOpt = 100,
    cmap: CmapOpt = "viridis",
    scale: ScaleOpt = Scale.absolute,
    words: WordsOpt = False,
    hide_special: HideOpt = False,
    truncate: TruncateOpt = False,
    save_raw: Annotated[
        bool, _flag("--save-raw", "Also write attention.npz [layer, head, q, k].")
    ] = False,
    html: Annotated[
        bool, _flag("--html", "Also write attention.html (interactive, offline) per sentence.")
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
        bool, _flag("--overwrite", "Redo sentences that are already complete.")
    ] = False,
    device: DeviceOpt = Device.auto,
    as_json: Annotated[bool, _flag("--json", "Print the run's summary as JSON on stdout.")] = False,
) -> None:
    """Write heatmaps for many sentences: one folder each, plus manifest.json and manifest.csv.

    Each folder `NNNN-slug-hash/` holds overview, one grid per layer and one figure per head.
    Blank lines are skipped and counted. A re-run skips sentences already complete with the
    same settings and finishes the rest; an interrupted run leaves no half-written file.
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
            fmt=fmt.value,
            dpi=dpi,
            cmap=_style(fmt, dpi, cmap).cmap,
            scale=scale.value,
            query=query,
        )
        progress = _progress("export", TextColumn("{task.fields[rates]}"))
        with progress:
            task = progress.add_task("export", total=len(chosen.items), rates="")
            counted = {"figures": 0}

            def advance(record, n_figures: int) -> None:
                counted["figures"] += n_figures
                elapsed = max(progress.tasks[0].elapsed or 0.0, 1e-9)
                done = progress.tasks[0].completed + 1
                figures_rate = counted["figures"] / elapsed
                rates = f"{done / elapsed:.2f} sentences/s · {figures_rate:.0f} figures/s"
                progress.update(task, advance=1, rates=rates)

            summary = run_export(
                chosen,
                out,
                model=model,
                options=options,
                batch_size=batch_size,
                jobs=jobs,
                overwrite=overwrite,
                device=device.value,
                on_progress=advance,
                on_warning=_warn,
            )
    except AttnvizError as error:
        raise _fail(error) from None

    if as_json:
        typer.echo(json.dumps(summary.as_dict(), ensure_ascii=False, indent=2))
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
    if summary.interrupted:
        err_console.print(
            f"[bold red]interrupted[/]: {summary.written + summary.complete} of "
            f"{summary.sentences} sentences are complete; run the same command again to finish"
        )
        raise typer.Exit(130)
    if not as_json:
        out_console.print(
            f"manifest: {summary.out / 'manifest.json'} and manifest.csv", highlight=False
        )


@app.command(cls=_Command)
def report(
    sentences: Annotated[
        list[str] | None,
        typer.Argument(
            help="Sentences to analyse (default: samples/sentences.txt).", show_default=False
        ),
    ] = None,
    file: FileOpt = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Report folder.")] = Path(
        "attnviz-out/report"
    ),
    model: ModelOpt = None,
    layer: LayerOpt = None,
    head: HeadOpt = None,
    words: WordsOpt = False,
    threshold: Annotated[
        list[str] | None,
        typer.Option(
            "--threshold",
            "-t",
            metavar="NAME=VALUE",
            help="Role threshold in [0, 1]; repeat for more. NAME: previous, next, self, "
            "first, separator, punctuation, induction (decoders), local, broad.",
            show_default=False,
        ),
    ] = None,
    treebank: Annotated[
        str | None,
        typer.Option(
            "--treebank",
            metavar="FILE.conllu",
            help="Annotated corpus (CoNLL-U; - reads stdin): its sentences are the corpus, and "
            "heads are also measured on its syntax (HEAD, DEPREL) and coreference (CorefUD "
            "Entity=).",
            show_default=False,
        ),
    ] = None,
    min_count: Annotated[
        int,
        typer.Option(
            "--min-count",
            min=1,
            help="With --treebank: arcs a relation needs (mentions, for coreference) for a table "
            "row and to name a head.",
        ),
    ] = 100,
    margin: Annotated[
        float,
        typer.Option(
            "--margin",
            min=0.0,
            max=1.0,
            help="With --treebank: accuracy over a relation's baseline that names a head for it.",
        ),
    ] = 0.1,
    batch_size: BatchOpt = 16,
    truncate: TruncateOpt = False,
    fmt: FormatOpt = ImageFormat.png,
    dpi: DpiOpt = 100,
    cmap: CmapOpt = "viridis",
    scale: ScaleOpt = Scale.absolute,
    device: DeviceOpt = Device.auto,
    as_json: JsonOpt = False,
) -> None:
    """Measure what every head does over a corpus and give each head a role.

    Metrics (means over all non-special query tokens): attention to the previous, next and
    same token, to the first token ([CLS]/BOS), to separators, to punctuation, within ±2
    tokens; entropy; attention distance; confidence. Writes report.md, heads.csv,
    heads.json and figures to OUT. --layer/--head restrict the report to those heads.

    With --treebank FILE.conllu, also which heads find syntactic heads and dependents
    (per relation, against the best fixed-offset baseline) and antecedents of mentions:
    syntax.csv, syntax.json, coreference.csv, sections and figures in report.md.
    """
    from attnviz.analysis.metrics import Thresholds
    from attnviz.core.inputs import read_sentences
    from attnviz.core.treebank import read_treebank
    from attnviz.outputs import terminal
    from attnviz.pipelines.report import DEFAULT_CORPUS
    from attnviz.pipelines.report import report as run_report

    try:
        thresholds = Thresholds.parse(threshold)
        if treebank is not None:
            if sentences or file:
                raise InputError("give --treebank or sentences/--file, not both")
            chosen = read_treebank(treebank)
        else:
            if not sentences and not file:
                if not DEFAULT_CORPUS.is_file():
                    raise InputError(
                        "the default corpus samples/sentences.txt is not here; use --file"
                    )
                file = str(DEFAULT_CORPUS)
            chosen = read_sentences(file, sentences)
        style = _style(fmt, dpi, cmap, scale)
        progress = _progress("report")
        with progress:
            task = progress.add_task("report", total=len(chosen.items))
            result, written = run_report(
                chosen,
                out,
                style,
                model=model,
                device=device.value,
                layers=layer,
                heads=head,
                words=words,
                thresholds=thresholds,
                batch_size=batch_size,
                truncate=truncate,
                min_count=min_count,
                margin=margin,
                on_progress=lambda n: progress.advance(task, n),
                on_warning=_warn,
            )
    except AttnvizError as error:
        raise _fail(error) from None
    if as_json:
        typer.echo(json.dumps(result.as_dict(), ensure_ascii=False, indent=2))
        return
    terminal.print_report(out_console, result)
    if result.linguistics is not None:
        terminal.print_linguistics(out_console, result)
    out_console.print(
        f"wrote {len(written)} files to [bold]{out}/[/]: report.md, heads.csv, heads.json, figures",
        highlight=False,
    )


def main() -> None:
    """The console entry point: run the command, then leave at once.

    The interpreter's own teardown frees torch's and transformers' objects one by one (about
    0.8 s) and frees nothing the operating system does not free at exit; by then every file
    attnviz writes is closed, so the clean-ups that matter run first and the process exits
    without the teardown. An unexpected error still leaves the normal way, with its traceback.
    """
    try:
        app()
        code: Any = 0
    except SystemExit as stop:
        code = stop.code
    _leave(code)


def _leave(code: Any) -> None:
    import atexit
    import os
    import sys

    if isinstance(code, str):  # SystemExit("message"): Python prints it and exits with 1
        print(code, file=sys.stderr)
        code = 1
    from attnviz.outputs.render import stop_workers

    stop_workers()  # drawing processes finish their task and exit
    atexit._run_exitfuncs()  # registered clean-ups: logging, multiprocessing's semaphores
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`): nothing more to say
            pass
    os._exit(code or 0)
