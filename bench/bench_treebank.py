"""Cost of `attnviz report --treebank` against the bare forward passes over the same sentences.

Side by side in one run, on the same sentences (a CoNLL-U file, by default the shipped EWT
excerpt repeated up to --sentences): (a) encode the given words + batched forward passes only;
(b) the same plus the word view and the syntax and coreference sums (attnviz.analysis.linguistics);
(c) the whole measurement of `report --treebank`: (b) plus every positional head metric;
(d) writing its files and figures. Medians of --runs.
Run: .venv/bin/python bench/bench_treebank.py [--treebank FILE.conllu] [--sentences N] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

EXCERPT = Path(__file__).parent.parent / "samples" / "en_ewt-dev-excerpt.conllu"
BATCH = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--treebank", default=str(EXCERPT))
    parser.add_argument("--sentences", type=int, default=1000, help="0: the file as it is")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    from attnviz.analysis.linguistics import LinguisticSums
    from attnviz.analysis.transforms import word_view
    from attnviz.core.extract import extract_many
    from attnviz.core.models import load_model
    from attnviz.core.tokens import encode_words
    from attnviz.core.treebank import read_treebank
    from attnviz.outputs.figures import Style
    from attnviz.pipelines.report import build_report, write_report

    bank = read_treebank(args.treebank)
    if args.sentences:
        repeats = -(-args.sentences // len(bank.items))
        bank = replace(bank, items=(bank.items * repeats)[: args.sentences])
    loaded = load_model(None, "cpu")

    def encoded():
        for s in bank.items:
            yield encode_words(loaded, s.words, s.space_after, s.text)

    bare, linguistic, whole, files = [], [], [], []
    for _ in range(args.runs):
        start = time.perf_counter()
        for _att in extract_many(loaded, encoded(), BATCH):
            pass
        bare.append(time.perf_counter() - start)

        start = time.perf_counter()
        sums = LinguisticSums()
        for sentence, att in zip(bank.items, extract_many(loaded, encoded(), BATCH)):
            sums.add(word_view(att), sentence)
        sums.result(bank, 100, 0.1)
        linguistic.append(time.perf_counter() - start)

        start = time.perf_counter()
        report = build_report(loaded, bank, batch_size=BATCH)
        whole.append(time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            write_report(report, Path(tmp), Style())
            files.append(time.perf_counter() - start)
    b, g, w, f = (statistics.median(x) for x in (bare, linguistic, whole, files))
    words = sum(len(s.words) for s in bank.items)
    print(f"{len(bank.items)} sentences ({words} words) of {args.treebank}, bundled model, CPU, "
          f"batch {BATCH}, median of {args.runs} runs\n")  # fmt: skip
    print("| step | seconds | × bare forward |")
    print("|---|---|---|")
    print(f"| bare forward passes (encode words + forward) | {b:.2f} | 1.00 |")
    print(f"| + word view, syntax and coreference sums | {g:.2f} | {g / b:.2f} |")
    print(f"| **report --treebank: all measurement** (+ positional metrics) | {w:.2f} | "
          f"**{w / b:.2f}** |")  # fmt: skip
    print(f"| writing files and figures | {f:.2f} | {f / b:.2f} |")


if __name__ == "__main__":
    main()
