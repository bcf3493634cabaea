"""`attnviz report` in 2 processes (torchrun, gloo) against 1, on one machine: wall time, peak
memory, and whether the files are the same; then what a scaling estimate needs.

Side by side, each a fresh process tree, on the same sentences (the samples corpus repeated
with a numbered suffix up to --sentences), batches of 16, in an order rotated every round:
(a) `attnviz report`, one process with torch's default threads (the usual run);
(b) the same with OMP_NUM_THREADS=1 (what each torchrun rank gets by default);
(c) `torchrun --nproc-per-node 2 -m attnviz report` (2 ranks, 1 thread each, gloo).
Wall time of each whole command (imports, model load and files included) and the peak of
the sum of RSS over its process tree (`_rss.py`: torchrun's agent and both ranks for (c)).
Ratios within a round; min / median / max over the rounds. Identity: heads.csv, report.md and
heads.json (less `texts_per_rank`) of (c) against (b) and against (a), byte for byte.
Then, in this process: the seconds per text of reading (tokenising) the corpus and of the
pass (one process, every batch), and the bytes each rank sends to rank 0 (its partial; rank
0's own is kept), for the scaling sketch in docs/distributed.md.
Run: .venv/bin/python bench/bench_distributed.py [--sentences 200] [--runs 5] [--quick]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread
from _rss import measure

SAMPLES = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"
BIN = Path(sys.executable).parent
BATCH = 16


def corpus(count: int) -> list[str]:
    lines = [s for s in SAMPLES.read_text().splitlines() if s.strip()]
    return [f"{lines[i % len(lines)]} (#{i})" for i in range(count)]


def _files(folder: Path) -> dict[str, object]:
    """What must be the same: the tables and the Markdown as bytes, heads.json as a document
    without `texts_per_rank`."""
    found: dict[str, object] = {
        name: (folder / name).read_bytes() for name in ("heads.csv", "report.md")
    }
    document = json.loads((folder / "heads.json").read_text())
    found["texts_per_rank"] = document.pop("texts_per_rank")
    found["heads.json"] = document
    return found


def _same(a: dict[str, object], b: dict[str, object]) -> str:
    differ = [name for name in ("heads.csv", "report.md", "heads.json") if a[name] != b[name]]
    return "byte for byte the same" if not differ else f"**differ**: {', '.join(differ)}"


def processes(args, source: Path, tmp: Path) -> None:
    one_thread = {**os.environ, "OMP_NUM_THREADS": "1"}
    report = ["report", "-f", str(source), "-b", str(BATCH), "-o"]
    sides = {
        "1 process, default threads": ([str(BIN / "attnviz"), *report], None),
        "1 process, 1 thread": ([str(BIN / "attnviz"), *report], one_thread),
        "2 ranks (torchrun), 1 thread each": (
            [str(BIN / "torchrun"), "--nproc-per-node", "2", "-m", "attnviz", *report],
            None,
        ),
    }
    walls: dict[str, list[float]] = {name: [] for name in sides}
    peaks: dict[str, list[float]] = {name: [] for name in sides}
    outputs: dict[str, dict[str, object]] = {}
    for number, order in enumerate(rounds(args.runs, list(sides))):
        for name in order:
            command, env = sides[name]
            out = tmp / f"{number}-{list(sides).index(name)}"
            seconds, peak = measure([*command, str(out)], env=env)
            walls[name].append(seconds)
            peaks[name].append(peak)
            outputs[name] = _files(out)
    base = next(iter(sides))
    print(f"{args.sentences} sentences, bundled model, CPU, batch {BATCH}; each side a fresh "
          f"process tree; ratios to '{base}' in the same round, min / median / max over "
          f"{args.runs} rounds\n")  # fmt: skip
    print("| run | **wall ÷ 1 process** | wall s | **peak RSS ÷ 1 process** | peak RSS MiB |")
    print("|---|---|---|---|---|")
    for name in sides:
        wall = "1" if name == base else spread(ratios(walls[name], walls[base]), bold=True)
        peak = "1" if name == base else spread(ratios(peaks[name], peaks[base]), bold=True)
        print(f"| {name} | {wall} | {spread(walls[name])} | {peak} | {spread(peaks[name], 0)} |")
    two, one = walls["2 ranks (torchrun), 1 thread each"], walls["1 process, 1 thread"]
    print(f"\n2 ranks ÷ 1 process of 1 thread, wall: {spread(ratios(two, one), bold=True)}.")
    ranks = outputs["2 ranks (torchrun), 1 thread each"]
    print(f"\nTexts per rank: {ranks['texts_per_rank']}. Files of the 2 ranks against 1 "
          f"process, 1 thread: {_same(ranks, outputs['1 process, 1 thread'])}; against 1 "
          f"process, default threads: {_same(ranks, outputs[base])}.")  # fmt: skip


def sketch(args, texts: list[str]) -> None:
    """Seconds per text of reading the corpus (what every rank does for all texts) and of the
    pass in one process, and each rank's bytes to rank 0."""
    from attnviz.core.inputs import Sentence, Sentences
    from attnviz.core.models import model
    from attnviz.outputs.partials import encode
    from attnviz.pipelines import corpus as passes
    from attnviz.pipelines.shards import Share, run_share

    chosen = model(None, "cpu")
    loaded = chosen.load()
    sentences = Sentences(tuple(Sentence(i, i + 1, t) for i, t in enumerate(texts)), 0, "bench")
    read = passes.read_corpus(loaded, sentences, BATCH)
    passes.run_part(loaded, sentences, read, range(2))  # warm-up
    reading, seconds = [], []
    for _ in range(args.runs):
        start = time.perf_counter()
        read = passes.read_corpus(loaded, sentences, BATCH)
        reading.append((time.perf_counter() - start) / len(texts))
        start = time.perf_counter()
        passes.run_part(loaded, sentences, read, range(len(read.batches)))
        seconds.append((time.perf_counter() - start) / len(texts))
    print(f"\nIn this process (default threads), min / median / max over {args.runs} runs: "
          f"reading the corpus (tokenising) {spread([s * 1000 for s in reading], 3)} ms per "
          f"text; the pass {spread([s * 1000 for s in seconds])} ms per text.\n")  # fmt: skip
    print("| ranks | bytes each of ranks 1…N−1 sends rank 0 (min / max) | rank 0's own (kept) |")
    print("|---|---|---|")
    for count in (2, 4, 8):
        sizes = []
        for index in range(count):
            found = run_share(
                chosen, loaded, sentences, Share(index, count), None, batch_size=BATCH
            )
            sizes.append(len(encode(*found)))
        print(f"| {count} | {min(sizes[1:]):,} / {max(sizes[1:]):,} | {sizes[0]:,} |")


def main() -> None:
    options = parser(__doc__, runs=5)
    options.add_argument("--sentences", type=int, default=200)
    args = options.parse_args()
    if args.quick:
        args.runs, args.sentences = 2, 40
    header("`attnviz report` in 2 processes against 1", args)
    texts = corpus(args.sentences)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "corpus.txt"
        source.write_text("\n".join(texts) + "\n")
        processes(args, source, Path(tmp))
    sketch(args, texts)
    footer()


if __name__ == "__main__":
    main()
