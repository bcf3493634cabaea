"""Where `attnviz show` spends its time: imports, model load, forward, terminal, images.

The steps are timed inside one process that draws the images itself; the whole command is
timed with `--jobs 1` (the same) and with its default drawing processes. Each run is a
fresh process (cold imports, as a user meets them); the four run in an order rotated every
round. Ratios within a round, then min / median / max over the rounds.
Run: .venv/bin/python bench/bench_show.py [--runs 5] [--quick]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread, wall

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


def main() -> None:
    options = parser(__doc__, runs=5)
    args = options.parse_args()
    if args.quick:
        args.runs = 2
    header("Where `attnviz show` spends its time", args)

    commands = {
        "phases": [sys.executable, "-c", PHASES, SENTENCE],
        "help": [ATTNVIZ, "--help"],
        "-j 1": [ATTNVIZ, "show", SENTENCE, "-o", "OUT", "-j", "1"],
        "default": [ATTNVIZ, "show", SENTENCE, "-o", "OUT"],
    }
    phases: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {name: [] for name in commands}
    with tempfile.TemporaryDirectory() as out:
        for order in rounds(args.runs, list(commands)):
            for name in order:
                command = [out if part == "OUT" else part for part in commands[name]]
                if name != "phases":
                    walls[name].append(wall(command))
                    continue
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"the timed steps failed: {done.stderr[-800:]}")
                for step, seconds in json.loads(done.stdout.strip().splitlines()[-1]).items():
                    phases.setdefault(step, []).append(seconds)

    in_process = [sum(steps) for steps in zip(*phases.values())]
    images = next(values for step, values in phases.items() if step.startswith("images"))
    print(f"sentence of 16 tokens, bundled model (6 layers × 12 heads), CPU; fresh processes; "
          f"ratios within a round, min / median / max over {args.runs} rounds\n")  # fmt: skip
    print("| ratio | min / median / max |")
    print("|---|---|")
    print(f"| `attnviz show` (default --jobs) ÷ `attnviz show -j 1` | "
          f"{spread(ratios(walls['default'], walls['-j 1']), bold=True)} |")  # fmt: skip
    print(f"| images ÷ all steps, one process | {spread(ratios(images, in_process))} |")
    print(
        f"| `attnviz --help` ÷ `attnviz show` | {spread(ratios(walls['help'], walls['default']))} |"
    )
    print("\nSeconds, this machine and load only:\n")
    print(f"| {'step':<34} | min / median / max s |")
    print(f"|{'-' * 36}|{'-' * 22}|")
    print(f"| {'`attnviz --help` (wall)':<34} | {spread(walls['help'])} |")
    for step, values in phases.items():
        print(f"| {'show: ' + step:<34} | {spread(values)} |")
    print(f"| {'`attnviz show -j 1` (wall)':<34} | {spread(walls['-j 1'])} |")
    print(f"| {'`attnviz show` (wall, default -j)':<34} | {spread(walls['default'])} |")
    print("\n* includes the modeling modules transformers imports lazily on first use")
    footer()


if __name__ == "__main__":
    main()
