"""`attnviz export` of long texts against the bare forward passes they need.

Each text is 512 tokens (the samples corpus, starting at a different sentence each), all 79
figures of each. The bare script imports torch and transformers, loads the bundled model and
runs one forward pass with attentions per text, leaving without the interpreter's teardown
as attnviz does. Fresh processes, each export into a fresh folder; a round runs every side
once, in an order rotated every round; each ratio is taken within a round, then min / median
/ max over the rounds.
Run: .venv/bin/python bench/bench_export_long.py [--runs 5] [--texts 2] [--jobs 1 2] [--quick]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread, wall
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


def main() -> None:
    options = parser(__doc__, runs=5)
    options.add_argument("--texts", type=int, default=2)
    options.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    args = options.parse_args()
    if args.quick:
        args.runs, args.texts = 2, 1
    header("`attnviz export` of long texts against the bare forward passes", args)

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
            commands[f"`export --jobs {jobs}`"] = [
                ATTNVIZ, "export", "-f", str(source), "-o", "OUT", "--jobs", str(jobs)
            ]  # fmt: skip
        times: dict[str, list[float]] = {name: [] for name in commands}
        files = 0
        for order in rounds(args.runs, list(commands)):
            for name in order:
                out = Path(tmp) / "out"
                times[name].append(wall([str(out) if a == "OUT" else a for a in commands[name]]))
                if out.exists():
                    files = len(list(out.glob("*/*.png")))
                    shutil.rmtree(out)  # the next export starts from an empty folder

    bare = times["bare forward passes"]
    print(f"{len(texts)} text(s) of 512 tokens, {files} figures in all; fresh processes; ratios "
          f"within a round, min / median / max over {args.runs} rounds\n")  # fmt: skip
    print("| run | **÷ bare** | wall s | s per text |")
    print("|---|---|---|---|")
    for name, values in times.items():
        ratio = spread(ratios(values, bare), bold=True) if values is not bare else "1"
        per_text = [s / len(texts) for s in values]
        print(f"| {name} | {ratio} | {spread(values)} | {spread(per_text)} |")
    footer()


if __name__ == "__main__":
    main()
