"""Peak memory of `attnviz export` is flat in the number of sentences: 20 against 100.

Each export runs in a fresh process into a fresh folder; its peak memory is the largest sum of
RSS over the process and its drawing workers (see _rss.py). The sentences are the samples
corpus, repeated with a numbered suffix so that every one is distinct. One head per sentence
is drawn, so the run is about the pipeline's memory, not its drawing time. A round runs each
count once, in an order rotated every round; the ratio is taken within a round, then
min / median / max over the rounds.
Run: .venv/bin/python bench/bench_export_memory.py [--runs 5] [--counts 20 100] [--quick]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread
from _rss import measure

SAMPLES = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"
ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))


def sentence_file(count: int, folder: Path) -> Path:
    lines = [s for s in SAMPLES.read_text().splitlines() if s.strip()]
    source = folder / f"sentences-{count}.txt"
    source.write_text("\n".join(f"{lines[i % len(lines)]} (#{i})" for i in range(count)) + "\n")
    return source


def main() -> None:
    options = parser(__doc__, runs=5)
    options.add_argument("--counts", type=int, nargs="+", default=[20, 100])
    args = options.parse_args()
    if args.quick:
        args.runs, args.counts = 2, [10, 50]
    header("`attnviz export`: memory against the number of sentences", args)
    names = [str(n) for n in args.counts]
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        sources = {name: sentence_file(int(name), Path(tmp)) for name in names}
        out = Path(tmp) / "out"
        for order in rounds(args.runs, names):
            for name in order:
                command = [ATTNVIZ, "export", "-f", str(sources[name]), "-o", str(out),
                           "--figures", "heads", "--layers", "0", "--heads", "0"]  # fmt: skip
                runs[name].append(measure(command))
                shutil.rmtree(out)

    def peaks(name: str) -> list[float]:
        return [peak for _, peak in runs[name]]

    first = names[0]
    print(f"Peak RSS of the process tree; ratios within a round, min / median / max over "
          f"{args.runs} rounds\n")  # fmt: skip
    print(f"| sentences | **peak ÷ peak at {first}** | peak RSS MiB | wall s |")
    print("|---|---|---|---|")
    for name in names:
        ratio = spread(ratios(peaks(name), peaks(first)), 3, bold=True)
        seconds = [wall for wall, _ in runs[name]]
        print(f"| {name} | {ratio} | {spread(peaks(name), 0)} | {spread(seconds, 1)} |")
    footer()


if __name__ == "__main__":
    main()
