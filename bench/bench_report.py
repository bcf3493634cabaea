"""Cost of `attnviz report` against the bare forward passes it needs, and its memory.

Side by side in one run, on the same sentences (the samples corpus repeated with a numbered
suffix up to --sentences): (a) tokenise + batched forward passes only; (b) the whole report:
the same forward passes plus every metric, then the files (Markdown, CSV, JSON, figures).
Medians of --runs. Peak RSS of `attnviz report` on 50 and on --sentences sentences, each in
a fresh process.
Run: .venv/bin/python bench/bench_report.py [--sentences 1000] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAMPLES = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"


def corpus(count: int) -> list[str]:
    lines = [s for s in SAMPLES.read_text().splitlines() if s.strip()]
    return [f"{lines[i % len(lines)]} (#{i})" for i in range(count)]


def peak_rss_mib(texts: list[str], folder: Path) -> float:
    source = folder / f"corpus-{len(texts)}.txt"
    source.write_text("\n".join(texts) + "\n")
    attnviz = str(Path(sys.executable).with_name("attnviz"))
    probe = (
        "import resource, subprocess, sys\n"
        "subprocess.run(sys.argv[1:], check=True, capture_output=True)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    command = [attnviz, "report", "-f", str(source), "-o", str(folder / f"r-{len(texts)}")]
    out = subprocess.run([sys.executable, "-c", probe, *command], check=True, capture_output=True)
    return int(out.stdout.decode().strip()) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    from attnviz.core.extract import extract_many
    from attnviz.core.inputs import Sentence, Sentences
    from attnviz.core.models import load_model
    from attnviz.core.tokens import encode
    from attnviz.outputs.figures import Style
    from attnviz.pipelines.report import build_report, write_report

    texts = corpus(args.sentences)
    chosen = Sentences(tuple(Sentence(i + 1, i + 1, t) for i, t in enumerate(texts)), 0, "bench")
    loaded = load_model(None, "cpu")
    bare, metrics, files = [], [], []
    for _ in range(args.runs):
        start = time.perf_counter()
        for _att in extract_many(loaded, (encode(loaded, t) for t in texts), 16):
            pass
        bare.append(time.perf_counter() - start)
        start = time.perf_counter()
        report = build_report(loaded, chosen, batch_size=16)
        metrics.append(time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            write_report(report, Path(tmp), Style())
            files.append(time.perf_counter() - start)
    b, m, f = (statistics.median(x) for x in (bare, metrics, files))
    print(f"{args.sentences} sentences, bundled model, CPU, batch 16, median of {args.runs} runs\n")
    print("| step | seconds | × bare forward |")
    print("|---|---|---|")
    print(f"| bare forward passes (tokenise + forward) | {b:.2f} | 1.00 |")
    print(f"| report: forward passes + metrics | {m:.2f} | {m / b:.2f} |")
    print(f"| report: writing files and figures | {f:.2f} | {f / b:.2f} |")
    print(f"| **whole report** | {m + f:.2f} | **{(m + f) / b:.2f}** |")
    with tempfile.TemporaryDirectory() as tmp:
        small, large = (peak_rss_mib(corpus(n), Path(tmp)) for n in (50, args.sentences))
    print(f"\npeak RSS of `attnviz report`: {small:.0f} MiB for 50 sentences, {large:.0f} MiB for "
          f"{args.sentences} ({100 * (large / small - 1):+.1f}%)")  # fmt: skip


if __name__ == "__main__":
    main()
