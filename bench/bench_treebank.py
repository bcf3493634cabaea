"""Cost of `attnviz report --treebank` against plain transformers forward passes, and its memory.

Side by side in one process, on the same sentences (a CoNLL-U file, by default the shipped
EWT excerpt repeated up to --sentences), batches of 16:
(a) plain transformers: the given words tokenised (is_split_into_words), the model called with
    output_attentions=True and eager attention, no hooks (_common.plain_forward), the baseline;
(b) attnviz's own extraction: encode the words, the hooked forward pass, each sentence's
    attention copied out and cropped;
(c) (b) plus the word view and the syntax and coreference sums (attnviz.analysis.linguistics);
(d) the whole measurement of `report --treebank`: (c) plus every positional head metric;
(e) then writing its files and figures.
Each side is warmed up once; a round runs (a) to (d) once each, in an order rotated every
round, then (e). Ratios within a round; min / median / max over the rounds.
Memory: peak RSS of a fresh `attnviz report --treebank` process (and its children) on the file
as it is and repeated up to --sentences, in rounds of both, rotated.
Run: .venv/bin/python bench/bench_treebank.py [--treebank FILE.conllu] [--sentences 200]
     [--runs 5] [--quick]
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from _common import batches, footer, header, parser, plain_forward, ratios, rounds, spread
from _rss import measure

EXCERPT = Path(__file__).parent.parent / "samples" / "en_ewt-dev-excerpt.conllu"
ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))
BATCH = 16


def timings(args, bank) -> None:
    from attnviz.analysis.linguistics import LinguisticSums
    from attnviz.analysis.transforms import word_view
    from attnviz.core.extract import attend, batched
    from attnviz.core.models import load_model
    from attnviz.core.tokens import encode_words
    from attnviz.outputs.figures import Style
    from attnviz.outputs.report_files import write_report
    from attnviz.pipelines.report import build_report

    loaded = load_model(None, "cpu")
    plain = plain_forward()

    def encoded(items):
        for s in items:
            yield encode_words(loaded, s.words, s.space_after, s.text)

    def extracted(items):
        for batch in batched(encoded(items), BATCH):
            yield from attend(loaded, batch)

    def hooked(n: int) -> None:
        for _att in extracted(bank.items[:n]):
            pass

    def linguistic(n: int) -> None:
        sums = LinguisticSums()
        items = bank.items[:n]
        for sentence, att in zip(items, extracted(items)):
            sums.add(word_view(att), sentence)
        sums.result(replace(bank, items=items), 100, 0.1)

    reports = []  # the last one, for its files

    def measured(n: int) -> None:
        reports[:] = [build_report(loaded, replace(bank, items=bank.items[:n]), batch_size=BATCH)]

    words = [list(s.words) for s in bank.items]
    sides = {
        "plain": lambda n: plain(batches(words[:n], BATCH), is_split_into_words=True),
        "hooked": hooked,
        "linguistic": linguistic,
        "report": measured,
    }
    for side in sides.values():  # warm-up
        side(2 * BATCH)
    times: dict[str, list[float]] = {name: [] for name in [*sides, "files"]}
    for order in rounds(args.runs, list(sides)):
        for name in order:
            start = time.perf_counter()
            sides[name](len(bank.items))
            times[name].append(time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            write_report(reports[-1], Path(tmp), Style())
            times["files"].append(time.perf_counter() - start)

    plain_s = times["plain"]
    n_words = sum(len(s.words) for s in bank.items)
    print(f"{len(bank.items)} sentences ({n_words} words) of {Path(args.treebank).name}, bundled "
          f"model, CPU, batch {BATCH}; ratios to the plain transformers forward passes of the "
          f"same round, min / median / max over {args.runs} rounds\n")  # fmt: skip
    print("| step | **÷ plain forward** | seconds |")
    print("|---|---|---|")
    rows = [
        ("plain transformers forward passes (tokenise words + forward, no hooks)", plain_s),
        ("attnviz extraction (encode words + hooked forward + copy out)", times["hooked"]),
        ("+ word view, syntax and coreference sums", times["linguistic"]),
        ("**report --treebank: all measurement** (+ positional metrics)", times["report"]),
        ("writing files and figures", times["files"]),
    ]
    for label, values in rows:
        ratio = "1" if values is plain_s else spread(ratios(values, plain_s), bold=True)
        print(f"| {label} | {ratio} | {spread(values)} |")


def memory(args, n_file: int) -> None:
    text = Path(args.treebank).read_text(encoding="utf-8")
    repeats = max(1, -(-args.sentences // n_file))
    counts = {str(n_file): 1, str(n_file * repeats): repeats}
    peaks: dict[str, list[float]] = {name: [] for name in counts}
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, times in counts.items():
            files[name] = Path(tmp) / f"bank-{name}.conllu"
            files[name].write_text((text.rstrip("\n") + "\n\n") * times, encoding="utf-8")
        for number, order in enumerate(rounds(args.runs, list(counts))):
            for name in order:
                out = Path(tmp) / f"r-{number}-{name}"
                command = [ATTNVIZ, "report", "--treebank", str(files[name]), "-o", str(out)]
                peaks[name].append(measure(command)[1])
    first = next(iter(counts))
    print("\nPeak RSS of a fresh `attnviz report --treebank` process (and its children), the "
          "file as it is and repeated; ratio within a round, min / median / max:\n")  # fmt: skip
    print(f"| sentences | **peak ÷ peak at {first}** | peak RSS MiB |")
    print("|---|---|---|")
    for name in counts:
        ratio = spread(ratios(peaks[name], peaks[first]), 3, bold=True)
        print(f"| {name} | {ratio} | {spread(peaks[name], 0)} |")


def main() -> None:
    options = parser(__doc__, runs=5)
    options.add_argument("--treebank", default=str(EXCERPT))
    options.add_argument("--sentences", type=int, default=200, help="0: the file as it is")
    args = options.parse_args()
    if args.quick:
        args.runs, args.sentences = 2, 150  # memory: 100 against 200
    header("`attnviz report --treebank` against plain transformers forward passes", args)

    from attnviz.core.treebank import read_treebank

    bank = read_treebank(args.treebank)
    n_file = len(bank.items)
    if args.sentences:
        repeats = -(-args.sentences // n_file)
        bank = replace(bank, items=(bank.items * repeats)[: args.sentences])
    timings(args, bank)
    memory(args, n_file)
    footer()


if __name__ == "__main__":
    main()
