"""What every benchmark shares: its options, the header that says where and when it ran, and
ratios with their spread.

Each benchmark prints, before its results: the date, the exact command, the machine (CPU
model, cores, memory), the load at start (load average, and the share of the cores busy in
the second before it starts), and the versions. Results lead with ratios
of things timed side by side in the same round, given as min / median / max over the rounds
(one ratio per round, so a slow moment of the machine hits both sides of it), then the
absolute figures, which hold only for that machine and load.

Quick mode (`--quick`, or BENCH_QUICK=1 in the environment, e.g. `BENCH_QUICK=1 make bench`)
runs each benchmark on small inputs with 2 rounds (1 for bench_smollm2, whose cold loads take
~15 s each), to check that it works in a minute or two on an idle machine: its figures are
not to be reported.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUICK_RUNS = 2  # both orders of an alternated pair, once each
VERSIONS = ("torch", "transformers", "numpy", "matplotlib")
IDLE_BUSY = 0.1  # the share of the cores busy before a run under which a machine counts as idle


def parser(doc: str | None, runs: int) -> argparse.ArgumentParser:
    """The options every benchmark takes: --runs (rounds) and --quick."""
    options = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    options.add_argument(
        "--runs", type=int, default=runs, help=f"rounds, each timing every side (default {runs})"
    )
    options.add_argument(
        "--quick",
        action="store_true",
        default=os.environ.get("BENCH_QUICK", "") not in ("", "0"),
        help="small inputs and 2 rounds (1 for SmolLM2), to check the benchmark works "
        "(also BENCH_QUICK=1); "
        "its figures are not to be reported",
    )
    options.add_argument(
        "--torch-ops",
        action="store_true",
        help="blocks of rows made by torch's operations, not attnviz's compiled pass "
        "(ATTNVIZ_KERNEL=0, for this process and those it starts): the before of core/fused.py",
    )
    if "--torch-ops" in sys.argv:  # before any pass asks for the compiled one
        os.environ["ATTNVIZ_KERNEL"] = "0"
    return options


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> str:
    try:
        with open("/proc/meminfo") as info:
            kib = int(info.readline().split()[1])  # MemTotal, the first line
        return f"{kib / 2**20:.1f} GiB RAM"
    except (OSError, ValueError, IndexError):
        return "RAM unknown"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _commit() -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or "unknown"


def _busy(seconds: float = 1.0) -> float:
    """The share of all cores busy over `seconds` (from /proc/stat), before the benchmark
    starts any work: the other work on the machine. The load average cannot tell it: under
    `make bench` it still holds the previous benchmark's own work for a minute or more."""

    def times() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]  # the "cpu" line, in ticks
        return sum(fields), fields[3] + fields[4]  # all, idle + iowait

    try:
        total, idle = times()
        time.sleep(seconds)
        total2, idle2 = times()
    except OSError:
        return float("nan")
    return 1 - (idle2 - idle) / max(1, total2 - total)


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min)"


_started: list[float] = []  # when header() ran, for footer()


def header(title: str, args: argparse.Namespace) -> None:
    """Print what ran, where, when, under what load, with which versions."""
    _started[:] = [time.perf_counter()]
    command = shlex.join([".venv/bin/python", os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])
    if args.quick and "--quick" not in sys.argv:
        command = "BENCH_QUICK=1 " + command
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    versions = ", ".join(f"{name} {_version(name)}" for name in VERSIONS)
    now = datetime.datetime.now(datetime.timezone.utc)
    print(f"## {title}\n")
    print(f"- date: {now:%Y-%m-%d %H:%M} UTC")
    print(f"- command: `{command}`")
    print(
        f"- machine: {cpu_model()}, {os.cpu_count()} logical CPUs ({usable} usable), "
        f"{_memory_gib()}, {platform.system()} {platform.release()}"
    )
    busy = _busy()
    print(f"- load at start: load average {_load()}; cores busy over 1 s before starting: "
          f"{busy:.0%}")  # fmt: skip
    if busy > IDLE_BUSY:
        print(f"- **not idle** (over {IDLE_BUSY:.0%} of the cores busy with other work): take "
              "these figures as a check, not to report")  # fmt: skip
    print(
        f"- versions: Python {platform.python_version()}, {versions}, "
        f"attnviz {_version('attnviz')} at {_commit()}"
    )
    print(
        f"- rounds: {args.runs}"
        + ("  **QUICK MODE: a check that it runs, not figures**" if args.quick else "")
    )
    print()
    sys.stdout.flush()


def footer() -> None:
    """Print the load average at the end, which includes the benchmark's own, and how long
    the benchmark took."""
    print(f"\nload average at the end (the benchmark's own included): {_load()}")
    if _started:
        print(f"the benchmark took {time.perf_counter() - _started[0]:.0f} s")


def rounds(runs: int, sides: Sequence[str]) -> Iterator[list[str]]:
    """The order of the sides in each round: rotated by one each round (A B, B A, A B, … for
    two), so that no side always runs first or last."""
    for i in range(runs):
        shift = i % len(sides)
        yield list(sides[shift:]) + list(sides[:shift])


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """One ratio per round: the two sides of each round met the same machine state."""
    return [a / b for a, b in zip(numerators, denominators, strict=True)]


def spread(values: Sequence[float], digits: int = 2, bold: bool = False) -> str:
    """`min / median / max` of `values`, the median in bold if asked."""
    low, mid, high = min(values), statistics.median(values), max(values)
    middle = f"**{mid:.{digits}f}**" if bold else f"{mid:.{digits}f}"
    return f"{low:.{digits}f} / {middle} / {high:.{digits}f}"


def wall(command: list[str], **kwargs) -> float:
    """Wall seconds of one fresh run of `command`, which must succeed."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{command[:2]} failed: {done.stderr[-500:]}")
    return seconds


def plain_forward():
    """A function that runs plain transformers forward passes over batches of texts (or of
    word lists, with is_split_into_words=True): the bundled model loaded as AutoModel with eager
    attention, output_attentions=True, no hooks, nothing kept; what anyone would write."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from attnviz.core.models import bundled_model_path

    path = bundled_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()

    def forward(batches, **tokenizer_options) -> None:
        with torch.inference_mode():
            for batch in batches:
                inputs = tokenizer(batch, padding=True, return_tensors="pt", **tokenizer_options)
                out = model(**inputs, output_attentions=True)
                assert len(out.attentions) == model.config.num_hidden_layers

    return forward


def batches(items: Sequence, size: int) -> list[list]:
    """`items` in lists of `size` (the last may be shorter)."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]
