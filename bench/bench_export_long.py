"""`attnviz export` of long texts against the bare forward passes they need.

Each text is 512 tokens (the samples corpus, starting at a different sentence each), all 79
figures of each. The bare script imports torch and transformers, loads the bundled model and
runs one forward pass with attentions per text, leaving without the interpreter's teardown
as attnviz does. Fresh processes, interleaved; medians of --runs.
Run: .venv/bin/python bench/bench_export_long.py [--runs 3] [--texts 6] [--jobs 1 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_show_vs_bare import text_of

ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))

BARE = r"""
import os, sys
import torch
from transformers import AutoModel, AutoTokenizer
path, source = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
with torch.inference_mode():
    for text in open(source, encoding="utf-8").read().splitlines():
        out = model(**tokenizer(text, return_tensors="pt"), output_attentions=True)
        assert len(out.attentions) == 6
os._exit(0)
"""


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{cmd[:2]} failed: {done.stderr[-500:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--texts", type=int, default=6)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()

    from transformers import AutoTokenizer
    from transformers.utils import logging

    from attnviz.core.models import bundled_model_path

    logging.set_verbosity_error()  # the corpus is longer than the model's limit, on purpose
    path = str(bundled_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = [text_of(512, tokenizer, start) for start in range(args.texts)]
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "texts.txt"
        source.write_text("\n".join(texts) + "\n", encoding="utf-8")
        commands = {"bare forward passes": [sys.executable, "-c", BARE, path, str(source)]}
        for jobs in args.jobs:
            out = Path(tmp) / f"out-{jobs}"
            commands[f"`export --jobs {jobs}`"] = [
                ATTNVIZ, "export", "-f", str(source), "-o", str(out), "--overwrite",
                "--jobs", str(jobs),
            ]  # fmt: skip
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):  # interleaved: all meet the same machine load
            for name, cmd in commands.items():
                times[name].append(wall(cmd))
        files = len(list((Path(tmp) / f"out-{args.jobs[0]}").glob("*/*.png")))

    bare = statistics.median(times["bare forward passes"])
    print(f"{len(texts)} texts of 512 tokens, {files} figures in all; fresh processes, median "
          f"of {args.runs}; load average {os.getloadavg()[0]:.1f} at the end\n")  # fmt: skip
    print("| run | wall s | s per text | × bare |")
    print("|---|---|---|---|")
    for name, runs in times.items():
        median = statistics.median(runs)
        print(f"| {name} | {median:.2f} | {median / len(texts):.2f} | {median / bare:.2f} |")


if __name__ == "__main__":
    main()
