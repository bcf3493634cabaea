"""`attnviz needle`: which heads fetch a fact from a long context (retrieval heads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.app import Command, Panel, app, fail, out_console, progress, warn
from attnviz.cli.options import LOAD, STYLE, JsonOpt, briefly, grouped, valued
from attnviz.core.settings import Load
from attnviz.data import HAYSTACK_NAME
from attnviz.errors import AttnvizError
from attnviz.outputs.figures import Style

HaystackOpt = valued(
    str,
    "--haystack",
    metavar="PATH",
    help=briefly(
        f"A text file or a folder of .txt files. Default: {HAYSTACK_NAME}.",
        "The long text the needle is hidden in, cut at a sentence boundary to each length "
        "(read again from its start where it is shorter, and said).",
    ),
)
NeedleTextOpt = valued(
    str,
    "--needle-text",
    metavar="TEXT",
    help=briefly(
        "The sentence hidden in the haystack. Default: Kamradt's San Francisco sentence.",
        "“The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on "
        "a sunny day.” (Kamradt's test, as Wu et al. use it).",
    ),
)
QuestionOpt = valued(
    str,
    "--question",
    metavar="TEXT",
    help=briefly(
        "The question the needle answers.",
        "Default: “What is the best thing to do in San Francisco?”",
    ),
)
LengthsOpt = Annotated[
    str,
    typer.Option(
        "--lengths",
        metavar="N,N,…",
        help=briefly(
            "Prompt lengths in tokens (1k = 1,000).",
            "The whole prompt's tokens, at most (template, haystack, needle, question); each "
            "with the answer must fit the model's window and this machine's memory.",
        ),
    ),
]
DepthsOpt = Annotated[
    int,
    typer.Option(
        "--depths",
        min=1,
        metavar="N",
        help=briefly(
            "Needle depths from 0% to 100%.",
            "N depths evenly spaced through the haystack (0%: the needle first; 1: 50%).",
        ),
    ),
]
AnswerOpt = Annotated[
    int,
    typer.Option(
        "--answer-tokens",
        min=1,
        metavar="N",
        rich_help_panel=Panel.WRITING,
        help="The most tokens each greedy answer writes.",
    ),
]
AblateTopOpt = valued(
    str,
    "--ablate-top",
    metavar="K,K,…",
    panel=Panel.MEASURES,
    help=briefly(
        "Also answer with the K best heads removed, against K random.",
        "Every run answered again with the K best retrieval heads zero-ablated, and with K "
        "heads drawn at random (--seeds draws, none of the best): ablation.csv, ablation.png "
        "and a table (e.g. 5,10,20).",
    ),
)
SeedsOpt = Annotated[
    int,
    typer.Option(
        "--seeds",
        min=1,
        metavar="N",
        rich_help_panel=Panel.MEASURES,
        help="With --ablate-top: draws of random heads.",
    ),
]
NeedleOutOpt = Annotated[
    Path,
    typer.Option(
        "--out",
        "-o",
        help=briefly(
            "Output folder.",
            "Each run is written there as it finishes (runs/, ablation/): the same command "
            "again keeps them and does the rest.",
        ),
    ),
]


@app.command(cls=Command)
@grouped
def needle(
    out: NeedleOutOpt = Path("attnviz-out/needle"),
    load: Load = LOAD,
    haystack: HaystackOpt = None,
    needle_text: NeedleTextOpt = None,
    question: QuestionOpt = None,
    lengths: LengthsOpt = "1k,2k,4k,8k",
    depths: DepthsOpt = 11,
    answer_tokens: AnswerOpt = 48,
    ablate_top: AblateTopOpt = None,
    seeds: SeedsOpt = 3,
    style: Style = STYLE,
    as_json: JsonOpt = False,
) -> None:
    """Find a decoder's retrieval heads: the heads that fetch a fact from far back.

    A needle sentence is hidden in a long text at each length and depth, the model answers a
    question about it greedily, and a head scores each step where its most attended key is
    the needle's token being written (Wu et al. 2024). Writes needle.json, heads.csv,
    report.md and figures to OUT.
    \f
    The model must be a decoder that writes (an LLM: -m smollm2); its chat template frames
    the prompt where it has one. The rows that wrote each token are heard inside the model's
    attention call as it writes (never eager), and only each row's top key per head is kept.
    With --ablate-top, every run is answered again with the best heads removed, against as
    many random heads. docs/needle.md says how the score is defined and what SmolLM2 gives.
    """
    from attnviz.core.haystack import depths as every_depth
    from attnviz.core.haystack import parse_lengths
    from attnviz.outputs import terminal
    from attnviz.pipelines.needle import needle as run_needle
    from attnviz.pipelines.request import NeedleRequest

    try:
        request = NeedleRequest(
            load, haystack=haystack, needle=needle_text, question=question,
            lengths=parse_lengths(lengths), depths=every_depth(depths),
            answer_tokens=answer_tokens, ablate_top=parse_ks(ablate_top), seeds=seeds,
            out=out, style=style,
        )  # fmt: skip
        with progress("needle") as bar:
            tasks: dict[str, int] = {}

            def on_progress(phase: str, done: int, total: int) -> None:
                if phase not in tasks:
                    tasks[phase] = bar.add_task(phase, total=total)
                bar.update(tasks[phase], completed=done)

            result, written = run_needle(request, on_progress=on_progress, on_warning=warn)
    except AttnvizError as error:
        raise fail(error) from None
    if as_json:
        typer.echo(json.dumps(result.as_dict(), ensure_ascii=False, indent=2))
        return
    terminal.print_needle(out_console, result)
    names = ", ".join(path.name for path in written)
    out_console.print(f"wrote {len(written)} files to [bold]{out}/[/]: {names}", highlight=False)


def parse_ks(text: str | None) -> tuple[int, ...]:
    """ "5,10,20" -> (5, 10, 20); None -> ()."""
    from attnviz.errors import InputError

    if text is None:
        return ()
    try:
        found = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise InputError(f"--ablate-top '{text}': give numbers of heads, e.g. 5,10,20") from None
    return tuple(found)
