"""`attnviz compare`: two texts through one model, or one text through two models, head by
head."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.app import Command, Panel, app, fail, out_console
from attnviz.cli.options import (
    LOAD,
    STYLE,
    WRITING,
    JsonOpt,
    MeasureName,
    MeasureOpt,
    NoImagesOpt,
    QueryOpt,
    RawOpt,
    TargetOpt,
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

TextAArg = Annotated[
    str | None, typer.Argument(help="Text A; - reads it from stdin.", show_default=False)
]
TextBArg = Annotated[
    str | None,
    typer.Argument(help="Text B (default with --against-model: text A again).", show_default=False),
]
QuestionArg = Annotated[
    str | None,
    typer.Argument(
        help=briefly(
            "With a vision-language model: the question.",
            'After two pictures, the question about each (compare a.png b.png "What is on '
            'the table?"); after a picture and a question, question B (compare a.png "What '
            'is on it?" "What colour is it?"). docs/vision-language.md.',
        ),
        show_default=False,
    ),
]
AgainstOpt = valued(
    str,
    "--against-model",
    metavar="MODEL",
    help=briefly(
        "A second model that reads text B.",
        "Same layers and heads; a different tokenizer needs --words.",
    ),
)
PairsOpt = valued(
    str,
    "--file",
    "-f",
    metavar="FILE",
    help=briefly(
        "A file of pairs, one a line (A, a TAB, B); - reads stdin.",
        "With --against-model, a line without a TAB is one text for both. Figures are means "
        "over the pairs.",
    ),
)
TopOpt = Annotated[
    int,
    typer.Option(
        "--top", min=1, metavar="N", help="Heads listed and drawn: those that moved most."
    ),
]
KeysOpt = Annotated[
    int, typer.Option("--top-k", "-k", min=1, metavar="N", help="Keys listed per head.")
]
ImportanceOpt = Annotated[
    bool,
    flag(
        "--importance",
        briefly(
            "Also each head's importance, by ablation.",
            "Zero ablation, one pass per head, of each model's objective on its texts: to tell "
            "a head that moved from a head that matters.",
        ),
        Panel.MEASURES,
    ),
]
ImagesOutOpt = Annotated[Path, typer.Option("--out", "-o", help="Folder for the images.")]
PageOpt = Annotated[
    bool,
    flag(
        "--html",
        briefly(
            "Also write compare.html, the interactive page.",
            "With -f, compare-N.html a pair: A, B and B − A in every view; it works offline.",
        ),
    ),
]


@app.command(cls=Command)
@grouped
def compare(
    text_a: TextAArg = None,
    text_b: TextBArg = None,
    question: QuestionArg = None,
    load: Load = LOAD,
    against_model: AgainstOpt = None,
    file: PairsOpt = None,
    words: WordsOpt = False,
    measure: MeasureOpt = MeasureName.weights,
    query: QueryOpt = None,
    top: TopOpt = 6,
    top_k: KeysOpt = 3,
    importance: ImportanceOpt = False,
    truncate: TruncateOpt = False,
    out: ImagesOutOpt = Path("attnviz-out"),
    no_images: NoImagesOpt = False,
    html: PageOpt = False,
    style: Style = STYLE,
    writing: dict = WRITING,
    target: TargetOpt = None,
    raw: RawOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Compare attention head by head: two texts through one model (a minimal pair), or a
    text through two models (--against-model).

    Prints how far each head's pattern moved (the Jensen–Shannon divergence between A's and
    B's rows, in nats), and the heads that moved most with their top keys in A and in B.
    Images go to `OUT/<slug>-<hash>/`: the divergence per head, and A, B and B − A for each
    head that moved most. With a vision-language model: two pictures and a question, or a
    picture and two questions.
    \f
    The divergence is between A's and B's row of each aligned query, averaged over the
    aligned queries. Tokens are aligned where both texts have them; words put for one
    another are aligned whole; what has no partner is listed. With a decoder, --generate N
    continues each text (or the text, in each model) and compares the attention over what
    each wrote. With a vision model, two picture files: their patches are aligned by grid
    position. With a vision-language model, two pictures and a question, or a picture and two
    questions: the picture's share of the answer's attention in A and in B, and how far each
    head's look over the picture's cells moved (docs/vision-language.md).
    """
    try:
        from attnviz.core.inputs import compare_input, question_pair
        from attnviz.outputs import terminal
        from attnviz.pipelines.compare import compare as run_compare
        from attnviz.pipelines.request import CompareRequest

        against = replace(load, model=against_model) if against_model else None
        questions = question_pair(text_a, text_b, question, file)
        pairs, pictures = ([], None) if questions else compare_input(text_a, text_b, file,
                                                                     bool(against))  # fmt: skip
        found = run_compare(
            CompareRequest(load, pairs=tuple(pairs), pictures=pictures, questions=questions,
                against=against, target=target, raw=raw, truncate=truncate, words=words,
                measure=measure.value,
                query=query, html=html, images=not no_images,
                importance="ablation" if importance else None, top=top, top_k=top_k,
                out=None if no_images and not html else out, style=style, **writing,
            )
        )  # fmt: skip
    except AttnvizError as error:
        raise fail(error) from None
    except KeyboardInterrupt:
        raise fail(Interrupted("nothing was written")) from None
    if as_json:
        typer.echo(json.dumps(found.as_dict(), ensure_ascii=False, indent=2))
    elif questions is not None:
        terminal.print_picture_compare(out_console, found)
    else:
        terminal.print_compare(out_console, found, top)
