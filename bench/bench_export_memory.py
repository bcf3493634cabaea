"""Peak memory of `attnviz export` is flat in the number of sentences: 50 against 1,000.

Each export runs in a fresh process; its peak RSS is read with getrusage. The sentences are
the samples corpus, repeated with a numbered suffix so that every one is distinct. One head
per sentence is drawn, so the run is about the pipeline's memory, not its drawing time.
Run: .venv/bin/python bench/bench_export_memory.py [--counts 50 1000]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAMPLES = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"


def peak_rss_mib(count: int, folder: Path) -> tuple[float, float]:
    lines = [s for s in SAMPLES.read_text().splitlines() if s.strip()]
    text = "\n".join(f"{lines[i % len(lines)]} (#{i})" for i in range(count))
    source = folder / f"sentences-{count}.txt"
    source.write_text(text + "\n")
    attnviz = str(Path(sys.executable).with_name("attnviz"))
    probe = (
        "import resource, subprocess, sys\n"
        "quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "subprocess.run(sys.argv[1:], check=True, **quiet)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    command = [attnviz, "export", "-f", str(source), "-o", str(folder / f"out-{count}"),
               "--figures", "heads", "--layers", "0", "--heads", "0"]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", probe, *command], check=True, capture_output=True, text=True
    )
    return int(done.stdout.strip()) / 1024, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--counts", type=int, nargs="+", default=[50, 1000])
    counts = parser.parse_args().counts
    assert resource  # getrusage is read in the probe process
    with tempfile.TemporaryDirectory() as tmp:
        results = [(n, *peak_rss_mib(n, Path(tmp))) for n in counts]
    base = results[0][1]
    print("| sentences | peak RSS MiB | vs first | wall s |")
    print("|---|---|---|---|")
    for n, rss, seconds in results:
        print(f"| {n} | {rss:.0f} | {100 * (rss / base - 1):+.1f}% | {seconds:.0f} |")


if __name__ == "__main__":
    main()
