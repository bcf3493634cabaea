"""`attnviz report`: what every head does over a corpus, and its role."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from attnviz.analysis.importance import ABLATIONS
from attnviz.analysis.importance import CHOICES as IMPORTANCE_CHOICES
from attnviz.analysis.roles import threshold_help
from attnviz.cli import parts
from attnviz.cli.app import Command, Panel, app, out_console, warn
from attnviz.cli.options import (
    LOAD,
    SELECT,
    STYLE,
    BatchOpt,
    FileOpt,
    GenerateOpt,
    JsonOpt,
    TruncateOpt,
    WordsOpt,
    briefly,
    grouped,
    valued,
)
from attnviz.core.settings import Load
from attnviz.data import CORPUS_NAME
from attnviz.errors import AttnvizError, InputError
from attnviz.outputs.figures import Style

CorpusArg = Annotated[
    list[str] | None,
    typer.Argument(
        help=briefly(
            f"Sentences (default: the corpus {CORPUS_NAME}), or pictures.",
            "With a vision model, picture files and folders of them.",
        ),
        show_default=False,
    ),
]
ReportOutOpt = Annotated[Path, typer.Option("--out", "-o", help="Report folder.")]
ThresholdOpt = valued(
    list[str],
    "--threshold",
    "-t",
    metavar="NAME=VALUE",
    help=briefly("A role's threshold in [0, 1]; repeat for more.", threshold_help()),
)
TreebankOpt = valued(
    str,
    "--treebank",
    metavar="FILE.conllu",
    panel=Panel.TREEBANK,
    help=briefly(
        "A CoNLL-U corpus; heads measured on its syntax too.",
        "Its sentences are the corpus (- reads stdin), and heads are also measured on its "
        "syntax (HEAD, DEPREL) and coreference (CorefUD Entity=).",
    ),
)
MinCountOpt = Annotated[
    int,
    typer.Option(
        "--min-count",
        min=1,
        metavar="N",
        rich_help_panel=Panel.TREEBANK,
        help=briefly(
            "Arcs a relation needs to be reported.",
            "With --treebank: arcs a relation needs (mentions, for coreference) for a table "
            "row and to name a head.",
        ),
    ),
]
MarginOpt = Annotated[
    float,
    typer.Option(
        "--margin",
        min=0.0,
        max=1.0,
        metavar="SHARE",
        rich_help_panel=Panel.TREEBANK,
        help=briefly(
            "Accuracy over baseline to name a head.",
            "With --treebank: a head is named for a relation by this much over its baseline.",
        ),
    ),
]
ImportanceOpt = valued(
    str,
    "--importance",
    metavar="|".join(IMPORTANCE_CHOICES),
    panel=Panel.MEASURES,
    help=briefly(
        "Also which heads matter to the model's objective.",
        "On the same texts: "
        + "; ".join(f"{k.name}: {k.help}" for k in IMPORTANCE_CHOICES.values())
        + ". Adds importance columns, importance.png and a section to report.md.",
    ),
)
AblationOpt = Annotated[
    str,
    typer.Option(
        "--ablation",
        metavar="|".join(ABLATIONS),
        rich_help_panel=Panel.MEASURES,
        help=briefly(
            "How --importance removes a head.",
            "What a removed head's output becomes: "
            + "; ".join(f"{k.name}: {k.help}" for k in ABLATIONS.values())
            + ".",
        ),
    ),
]


@app.command(cls=Command)
@grouped
def report(
    sentences: CorpusArg = None,
    file: FileOpt = None,
    out: ReportOutOpt = Path("attnviz-out/report"),
    load: Load = LOAD,
    select: dict = SELECT,
    words: WordsOpt = False,
    threshold: ThresholdOpt = None,
    treebank: TreebankOpt = None,
    min_count: MinCountOpt = 100,
    margin: MarginOpt = 0.1,
    importance: ImportanceOpt = None,
    ablation: AblationOpt = "zero",
    batch_size: BatchOpt = 16,
    generate: GenerateOpt = None,
    truncate: TruncateOpt = False,
    style: Style = STYLE,
    as_json: JsonOpt = False,
    shard: parts.ShardOpt = None,
    partial: parts.PartialOpt = None,
    resume: parts.ResumeOpt = False,
) -> None:
    """Measure what every head does over a corpus and give each head a role.

    Metrics (means over all non-special query tokens): attention to the previous, next and
    same token, to the first token ([CLS]/BOS), to separators, to punctuation, within ±2
    tokens; entropy; attention distance; confidence. Writes report.md, heads.csv,
    heads.json and figures to OUT. An encoder-decoder model reads `source<TAB>target` lines.
    \f
    --layer/--head restrict the report to those heads.

    With --treebank FILE.conllu, also which heads find syntactic heads and dependents
    (per relation, against the best fixed-offset baseline) and antecedents of mentions:
    syntax.csv, syntax.json, coreference.csv, sections and figures in report.md.

    With --importance, also how much the model's objective (next-token loss for decoders,
    masked-LM loss or the sentence embedding for encoders) depends on each head, on the same
    texts: heads.csv's importance columns, importance.png and "Which heads matter".

    An encoder-decoder model (T5, BART, Marian) gets roles for its encoder and decoder
    self-attention, and for cross-attention how monotone each head's alignment is and how
    much it rests on the source's EOS; heads.csv has a stack column.

    A vision model (ViT, DeiT, DINOv2, BEiT, CLIP, SigLIP) reads picture files and folders of
    them: per head, the mean attention distance in pixels, CLS's entropy and shares, the
    patches' sink and local shares, averaged over the pictures, and a role; heads.csv,
    heads.json and mean-distance.png (docs/vision.md).

    A vision-language model reads a JSONL file of pictures and prompts (--generate N answers
    them): each head's share of attention on the picture, and visual sinks (vision-language.md).
    """
    from attnviz.analysis.importance import methods_of
    from attnviz.analysis.roles import Thresholds
    from attnviz.core.inputs import report_input
    from attnviz.pipelines.report import report as run_report
    from attnviz.pipelines.request import ReportRequest

    try:
        if importance is not None:
            methods_of(importance)  # a bad choice stops here, before anything loads
        if ablation not in ABLATIONS:
            raise InputError(f"unknown --ablation '{ablation}'; known: {', '.join(ABLATIONS)}")
        corpus, pictures, questions = report_input(sentences, file, treebank)
        request = ReportRequest(load, sentences=corpus, pictures=pictures, questions=questions,
            generate=generate, treebank=treebank is not None, **select, words=words,
            thresholds=Thresholds.parse(threshold), min_count=min_count, margin=margin,
            importance=importance, ablation=ablation, truncate=truncate, out=out, style=style,
            batch_size=batch_size, shard=shard, partial=partial, resume=resume)  # fmt: skip
        with _progress(request) as callbacks:
            result, written = run_report(request, on_warning=warn, **callbacks)
    except AttnvizError as error:
        raise parts.failed(error) from None
    if result is None:  # a rank other than 0 of a launched run
        return
    if isinstance(result, dict):  # --shard: its partial
        parts.say_shard(result, written, as_json)
    elif as_json:
        typer.echo(json.dumps(result.as_dict(), ensure_ascii=False, indent=2))
    else:
        print_report(result, written, out)


@contextmanager
def _progress(request: Any) -> Iterator[dict[str, Any]]:
    """The report's progress: a bar over the corpus (in a launched run, rank 0's bar per
    rank; with --shard, a count), and one over importance's batches; yields the callbacks."""
    from rich.progress import TimeRemainingColumn

    bar = parts.bar("report", TimeRemainingColumn())
    tasks: dict[str, Any] = {}

    def on_importance(done: int, total: int) -> None:
        if "importance" not in tasks or bar.tasks[tasks["importance"]].total != total:
            tasks["importance"] = bar.add_task("importance", total=total)
        bar.update(tasks["importance"], completed=done)

    with bar:
        if request.questions is not None:
            read = request.questions.items
        else:
            read = request.pictures.paths if request.pictures else request.sentences.items
        total = len(read) if request.shard is None else None
        task = bar.add_task("report", total=total) if parts.rank() is None else None
        yield dict(on_progress=lambda n: bar.advance(task, n), on_importance=on_importance,
                   on_ranks=parts.RankBars(bar))  # fmt: skip


def print_report(result: Any, written: list[Path], out: Path) -> None:
    """A report in the terminal (a one-stack model's, or an encoder-decoder model's per stack),
    and the files written (`report`, `merge`)."""
    from attnviz.analysis.picture_heads import QuestionReport
    from attnviz.analysis.report import Seq2SeqReport
    from attnviz.analysis.vision_report import PictureReport
    from attnviz.outputs import terminal

    if isinstance(result, QuestionReport):
        terminal.print_question_report(out_console, result)
        what = "report.md, heads.csv, heads.json, sinks.csv, picture-share.png"
    elif isinstance(result, PictureReport):
        terminal.print_picture_report(out_console, result)
        what = "heads.csv, heads.json, mean-distance.png"
    elif isinstance(result, Seq2SeqReport):
        terminal.print_seq2seq_report(out_console, result)
        what = "report.md, heads.csv, heads.json, figures per stack"
    else:
        terminal.print_report(out_console, result)
        if result.linguistics is not None:
            terminal.print_linguistics(out_console, result)
        terminal.print_importance(out_console, result)
        what = "report.md, heads.csv, heads.json, figures"
    out_console.print(f"wrote {len(written)} files to [bold]{out}/[/]: {what}", highlight=False)
