"""`attnviz report`: what every head does over a corpus, and its role."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from attnviz.analysis.importance import ABLATIONS
from attnviz.analysis.importance import CHOICES as IMPORTANCE_CHOICES
from attnviz.analysis.roles import threshold_help
from attnviz.cli import parts
from attnviz.cli.app import Command, app, out_console, warn
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
    ImageFormat,
    JsonOpt,
    LayerOpt,
    ModelOpt,
    Scale,
    ScaleOpt,
    TruncateOpt,
    WordsOpt,
    style,
)
from attnviz.core import models
from attnviz.data import CORPUS, CORPUS_NAME
from attnviz.errors import AttnvizError, InputError


@app.command(cls=Command)
def report(
    sentences: Annotated[
        list[str] | None,
        typer.Argument(
            help=f"Sentences to analyse (default: the corpus {CORPUS_NAME}).", show_default=False
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
            help=threshold_help(),
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
    importance: Annotated[
        str | None,
        typer.Option(
            "--importance",
            metavar="|".join(IMPORTANCE_CHOICES),
            help="Also measure which heads matter to the model's objective on the same texts: "
            + "; ".join(f"{k.name}: {k.help}" for k in IMPORTANCE_CHOICES.values())
            + ". Adds importance columns, importance.png and a section to report.md.",
            show_default=False,
        ),
    ] = None,
    ablation: Annotated[
        str,
        typer.Option(
            "--ablation",
            metavar="|".join(ABLATIONS),
            help="With --importance: what a removed head's output becomes; "
            + "; ".join(f"{k.name}: {k.help}" for k in ABLATIONS.values())
            + ".",
        ),
    ] = "zero",
    batch_size: BatchOpt = 16,
    truncate: TruncateOpt = False,
    fmt: FormatOpt = ImageFormat.png,
    dpi: DpiOpt = 100,
    cmap: CmapOpt = "viridis",
    scale: ScaleOpt = Scale.absolute,
    device: DeviceOpt = Device.auto,
    attention: AttentionOpt = AttentionImpl.sdpa,
    as_json: JsonOpt = False,
    shard: parts.ShardOpt = None,
    partial: parts.PartialOpt = None,
    resume: parts.ResumeOpt = False,
) -> None:
    """Measure what every head does over a corpus and give each head a role.

    Metrics (means over all non-special query tokens): attention to the previous, next and
    same token, to the first token ([CLS]/BOS), to separators, to punctuation, within ±2
    tokens; entropy; attention distance; confidence. Writes report.md, heads.csv,
    heads.json and figures to OUT. --layer/--head restrict the report to those heads.

    With --treebank FILE.conllu, also which heads find syntactic heads and dependents
    (per relation, against the best fixed-offset baseline) and antecedents of mentions:
    syntax.csv, syntax.json, coreference.csv, sections and figures in report.md.

    With --importance, also how much the model's objective (next-token loss for decoders,
    masked-LM loss or the sentence embedding for encoders) depends on each head, on the same
    texts: heads.csv's importance columns, importance.png and "Which heads matter".

    An encoder-decoder model (T5, BART, Marian) reads `source<TAB>target` lines: roles for its
    encoder and decoder self-attention, and for cross-attention how monotone each head's
    alignment is and how much it rests on the source's EOS; heads.csv has a stack column.
    """
    from rich.progress import TimeRemainingColumn

    from attnviz.analysis.importance import methods_of
    from attnviz.analysis.report import Seq2SeqReport
    from attnviz.analysis.roles import Thresholds
    from attnviz.core.inputs import read_sentences
    from attnviz.core.treebank import read_treebank
    from attnviz.pipelines.report import report as run_report

    try:
        if importance is not None:
            methods_of(importance)  # a bad choice stops here, before anything loads
        if ablation not in ABLATIONS:
            raise InputError(f"unknown --ablation '{ablation}'; known: {', '.join(ABLATIONS)}")
        thresholds = Thresholds.parse(threshold)
        if treebank is not None:
            if sentences or file:
                raise InputError("give --treebank or sentences/--file, not both")
            chosen = read_treebank(treebank)
        else:
            if not sentences and not file:
                if not CORPUS.is_file():
                    raise InputError(
                        f"the default corpus {CORPUS_NAME} is missing from this installation "
                        f"({CORPUS}); give sentences or --file"
                    )
                file = str(CORPUS)
            chosen = read_sentences(file, sentences)
        chosen_style = style(fmt, dpi, cmap, scale)
        bar = parts.bar("report", TimeRemainingColumn())
        tasks: dict[str, Any] = {}

        def on_importance(done: int, total: int) -> None:
            if "importance" not in tasks or bar.tasks[tasks["importance"]].total != total:
                tasks["importance"] = bar.add_task("importance", total=total)
            bar.update(tasks["importance"], completed=done)

        with bar:
            # a launched run's ranks each have a bar (parts.RankBars); a shard, some texts
            total = len(chosen.items) if shard is None else None
            task = bar.add_task("report", total=total) if parts.rank() is None else None
            result, written = run_report(
                models.model(model, device.value, attention.value),
                chosen,
                out,
                chosen_style,
                layers=layer,
                heads=head,
                words=words,
                thresholds=thresholds,
                batch_size=batch_size,
                truncate=truncate,
                min_count=min_count,
                margin=margin,
                importance=importance,
                ablation=ablation,
                on_importance=on_importance,
                on_progress=lambda n: bar.advance(task, n),
                on_warning=warn,
                shard=shard,
                partial=partial,
                resume=resume,
                on_ranks=parts.RankBars(bar),
            )
    except AttnvizError as error:
        raise parts.failed(error) from None
    if result is None:  # a rank other than 0 of a launched run
        return
    if isinstance(result, dict):  # --shard: its partial
        parts.say_shard(result, written, as_json)
        return
    if as_json:
        typer.echo(json.dumps(result.as_dict(), ensure_ascii=False, indent=2))
        return
    if isinstance(result, Seq2SeqReport):
        _print_seq2seq(result)
        out_console.print(
            f"wrote {len(written)} files to [bold]{out}/[/]: report.md, heads.csv, heads.json, "
            "figures per stack",
            highlight=False,
        )
        return
    print_report(result, written, out)


def print_report(result: Any, written: list[Path], out: Path) -> None:
    """A one-stack model's report in the terminal, and the files written (`report`, `merge`)."""
    from attnviz.outputs import terminal

    terminal.print_report(out_console, result)
    if result.linguistics is not None:
        terminal.print_linguistics(out_console, result)
    terminal.print_importance(out_console, result)
    out_console.print(
        f"wrote {len(written)} files to [bold]{out}/[/]: report.md, heads.csv, heads.json, figures",
        highlight=False,
    )


def _print_seq2seq(result: Any, shown: int = 5) -> None:
    """Each self-attention stack's role map, then the most monotone cross-attention heads
    (of a `Seq2SeqReport`)."""
    from attnviz.core.adapters import STACK_TITLES
    from attnviz.outputs import terminal

    for stack, report in result.stacks.items():
        out_console.rule(STACK_TITLES[stack], align="left")
        terminal.print_report(out_console, report)
    out_console.rule(STACK_TITLES["cross"], align="left")
    terminal.print_alignment(out_console, result.cross, shown)
