"""Cost of `attnviz report` against plain transformers forward passes, and its memory.

Side by side in one process, on the same sentences (the samples corpus repeated with a
numbered suffix up to --sentences), batches of 16:
(a) plain transformers: tokenise, then the model called with output_attentions=True and eager
    attention, no hooks (_common.plain_forward), the baseline;
(b) attnviz's own extraction: encode, the hooked forward pass, each text's attention copied
    out and cropped (core.extract.attend over core.extract.batched);
(c) the report's measurement: (b) plus every metric, the special shares and the mixing
    ratios from the same pass (pipelines.report.build_report);
(d) then writing its files (Markdown, CSV, JSON, figures).
Each side is warmed up once; a round runs (a), (b) and (c) once each, in an order rotated
every round, then (d). Ratios within a round; min / median / max over the rounds.
Memory: peak RSS of a fresh `attnviz report` process (and its children) on 50 and on
--sentences sentences, in rounds of both, rotated.
Run: .venv/bin/python bench/bench_report.py [--sentences 200] [--runs 5] [--quick]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from _common import batches, footer, header, parser, plain_forward, ratios, rounds, spread
from _rss import measure

SAMPLES = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"
ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))
BATCH = 16


def corpus(count: int) -> list[str]:
    lines = [s for s in SAMPLES.read_text().splitlines() if s.strip()]
    return [f"{lines[i % len(lines)]} (#{i})" for i in range(count)]


def timings(args) -> None:
    from attnviz.core.extract import attend, batched
    from attnviz.core.inputs import Sentence, Sentences
    from attnviz.core.models import load_model
    from attnviz.core.tokens import encode
    from attnviz.outputs.figures import Style
    from attnviz.outputs.report_files import write_report
    from attnviz.pipelines.report import build_report

    texts = corpus(args.sentences)
    loaded = load_model(None, "cpu")
    plain = plain_forward()

    def chosen(n: int) -> Sentences:
        return Sentences(tuple(Sentence(i + 1, i + 1, t) for i, t in enumerate(texts[:n])), 0, "b")

    def hooked(n: int) -> None:
        for batch in batched((encode(loaded, t) for t in texts[:n]), BATCH):
            attend(loaded, batch)

    reports = []  # the last one, for its files

    def measured(n: int) -> None:
        reports[:] = [build_report(loaded, chosen(n), batch_size=BATCH)]

    sides = {
        "plain": lambda n: plain(batches(texts[:n], BATCH)),
        "hooked": hooked,
        "report": measured,
    }
    for side in sides.values():  # warm-up
        side(2 * BATCH)
    times: dict[str, list[float]] = {name: [] for name in [*sides, "files"]}
    for order in rounds(args.runs, list(sides)):
        for name in order:
            start = time.perf_counter()
            sides[name](len(texts))
            times[name].append(time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            write_report(reports[-1], Path(tmp), Style())
            times["files"].append(time.perf_counter() - start)

    plain_s = times["plain"]
    whole = [m + f for m, f in zip(times["report"], times["files"])]
    print(f"{args.sentences} sentences, bundled model, CPU, batch {BATCH}; ratios to the plain "
          f"transformers forward passes of the same round, min / median / max over {args.runs} "
          "rounds\n")  # fmt: skip
    print("| step | **÷ plain forward** | seconds |")
    print("|---|---|---|")
    rows = [
        ("plain transformers forward passes (tokenise + forward, no hooks)", plain_s),
        ("attnviz extraction (encode + hooked forward + copy out)", times["hooked"]),
        ("report: extraction + every metric", times["report"]),
        ("report: writing files and figures", times["files"]),
        ("**whole report** (metrics + files)", whole),
    ]
    for label, values in rows:
        ratio = "1" if values is plain_s else spread(ratios(values, plain_s), bold=True)
        print(f"| {label} | {ratio} | {spread(values)} |")


def memory(args) -> None:
    names = [str(n) for n in sorted({50, args.sentences})]
    peaks: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        sources = {}
        for name in names:
            sources[name] = Path(tmp) / f"corpus-{name}.txt"
            sources[name].write_text("\n".join(corpus(int(name))) + "\n")
        for number, order in enumerate(rounds(args.runs, names)):
            for name in order:
                out = Path(tmp) / f"r-{number}-{name}"
                peaks[name].append(
                    measure([ATTNVIZ, "report", "-f", str(sources[name]), "-o", str(out)])[1]
                )
    first = names[0]
    print("\nPeak RSS of a fresh `attnviz report` process (and its children); ratio within a "
          "round, min / median / max:\n")  # fmt: skip
    print(f"| sentences | **peak ÷ peak at {first}** | peak RSS MiB |")
    print("|---|---|---|")
    for name in names:
        ratio = spread(ratios(peaks[name], peaks[first]), 3, bold=True)
        print(f"| {name} | {ratio} | {spread(peaks[name], 0)} |")


def main() -> None:
    options = parser(__doc__, runs=5)
    options.add_argument("--sentences", type=int, default=200)
    args = options.parse_args()
    if args.quick:
        args.runs, args.sentences = 2, 100
    header("`attnviz report` against plain transformers forward passes", args)
    timings(args)
    memory(args)
    footer()


if __name__ == "__main__":
    main()
