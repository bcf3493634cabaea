"""Where `attnviz show` spends its time: imports, model load, forward, terminal, images.

The steps are timed inside one process that draws the images itself; the whole command is
timed with `--jobs 1` (the same) and with its default drawing processes. Each run is a
fresh process (cold imports, as a user meets them); medians of --runs runs.
Run: .venv/bin/python bench/bench_show.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SENTENCE = "The quick brown fox jumps over the lazy dog because it was bored."
ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))

PHASES = r"""
import io, json, sys, tempfile, time
from pathlib import Path
t0 = time.perf_counter()
import torch, transformers, matplotlib
from attnviz.core import extract, models
from attnviz.outputs import figures, render, terminal
from attnviz.analysis import summary
t1 = time.perf_counter()
loaded = models.load_model(None, "cpu")
t2 = time.perf_counter()
att = extract.extract(loaded, sys.argv[1])
t3 = time.perf_counter()
from rich.console import Console
info = loaded.info
summaries = summary.summarise(att, list(range(info.n_layers)), list(range(info.n_heads)))
console = Console(file=io.StringIO(), width=100)
every_layer, every_head = list(range(info.n_layers)), list(range(info.n_heads))
terminal.print_head_map(console, att, summaries, every_layer, every_head)
t4 = time.perf_counter()
files = render.render_text(att, Path(tempfile.mkdtemp()), list(range(info.n_layers)),
                            list(range(info.n_heads)), figures.Style())
t5 = time.perf_counter()
print(json.dumps({"imports": t1 - t0, "model load *": t2 - t1, "forward": t3 - t2,
                  "summary + terminal": t4 - t3, f"images, one process ({len(files)})": t5 - t4}))
"""


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs

    phases: dict[str, list[float]] = {}
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", PHASES, SENTENCE], check=True, capture_output=True, text=True
        )
        for name, seconds in json.loads(out.stdout.strip().splitlines()[-1]).items():
            phases.setdefault(name, []).append(seconds)
    help_times = [wall([ATTNVIZ, "--help"]) for _ in range(runs)]
    show_times: dict[str, list[float]] = {"-j 1": [], "": []}
    with tempfile.TemporaryDirectory() as out:
        for _ in range(runs):  # interleaved
            show_times["-j 1"].append(wall([ATTNVIZ, "show", SENTENCE, "-o", out, "-j", "1"]))
            show_times[""].append(wall([ATTNVIZ, "show", SENTENCE, "-o", out]))

    print(f"attnviz show timing, median of {runs} fresh processes; sentence of 16 tokens,")
    print("bundled model (6 layers × 12 heads), CPU\n")
    print(f"| {'step':<34} | {'median s':>8} |")
    print(f"|{'-' * 36}|{'-' * 10}|")
    print(f"| {'`attnviz --help` (wall)':<34} | {statistics.median(help_times):>8.2f} |")
    for name, values in phases.items():
        print(f"| {'show: ' + name:<34} | {statistics.median(values):>8.2f} |")
    for name, values in show_times.items():
        label = f"`attnviz show {name}` (wall)" if name else "`attnviz show` (wall, default -j)"
        print(f"| {label:<34} | {statistics.median(values):>8.2f} |")
    print("\n* includes the modeling modules transformers imports lazily on first use (~1.5 s)")


if __name__ == "__main__":
    main()
