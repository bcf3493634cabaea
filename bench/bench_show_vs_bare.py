"""`attnviz show` against the bare forward pass it is built on, at 16, 128 and 512 tokens.

The bare script is the least anyone can do: import torch and transformers, load the bundled
model, run one forward pass with attentions. `attnviz show` does that plus the summary, the
terminal view and every image (overview, 6 layer grids, 72 head figures). attnviz leaves
without the interpreter's teardown (about 0.8 s of freeing torch's objects), so the bare
script is also timed doing the same: the ratio to it is what the work itself costs. Each run
is a fresh process; the three are interleaved so that all meet the same machine load. Peak memory is
the largest sum of RSS over the process and its children, sampled every 10 ms from /proc
(a worker process counts in full), or the kernel's peak of the process if higher.
Medians of --runs runs.
Run: .venv/bin/python bench/bench_show_vs_bare.py [--runs 5] [--tokens 16 128 512]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from _rss import measure

SAMPLES = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"
ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))

BARE = r"""
import sys
import torch
from transformers import AutoModel, AutoTokenizer
path, text = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
with torch.inference_mode():
    out = model(**tokenizer(text, return_tensors="pt"), output_attentions=True)
assert len(out.attentions) == 6
"""
# The same, leaving without the interpreter's teardown, as `attnviz` itself does (cli.main).
BARE_NO_TEARDOWN = BARE + "import os\nos._exit(0)\n"


def text_of(n_tokens: int, tokenizer, start: int = 0) -> str:
    """A prefix of the samples corpus, from its `start`-th sentence on (wrapping round), that
    the model reads as exactly `n_tokens` tokens."""
    sentences = [line.strip() for line in SAMPLES.read_text().splitlines() if line.strip()]
    corpus = " ".join(sentences[start:] + sentences[:start])
    pieces = tokenizer(corpus, add_special_tokens=False, return_offsets_mapping=True)
    ends = [end for _, end in pieces["offset_mapping"]]
    for cut in range(n_tokens - 2, 0, -1):  # [CLS] and [SEP] are the other two
        text = corpus[: ends[cut - 1]]
        if len(tokenizer(text)["input_ids"]) == n_tokens:
            return text
    raise SystemExit(f"no prefix of the corpus has {n_tokens} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 128, 512])
    args = parser.parse_args()

    from transformers import AutoTokenizer
    from transformers.utils import logging

    from attnviz.core.models import bundled_model_path

    logging.set_verbosity_error()  # the corpus is longer than the model's limit, on purpose

    path = str(bundled_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.tokens:
            text = text_of(n, tokenizer)
            bare_cmd = [sys.executable, "-c", BARE, path, text]
            out = Path(tmp) / str(n)
            show_cmd = [ATTNVIZ, "show", text, "--out", str(out)]
            quick_cmd = [sys.executable, "-c", BARE_NO_TEARDOWN, path, text]
            bare, quick, show = [], [], []
            for _ in range(args.runs):  # interleaved: all meet the same machine load
                bare.append(measure(bare_cmd))
                quick.append(measure(quick_cmd))
                show.append(measure(show_cmd))
            images = list(out.glob("*/*.png"))  # the last run's files
            megabytes = sum(p.stat().st_size for p in images) / 1e6
            rows.append((n, bare, quick, show, len(images), megabytes))

    def med(runs: list[tuple[float, float]], i: int) -> float:
        return statistics.median(r[i] for r in runs)

    load = os.getloadavg()[0]
    print(f"bare forward pass vs `attnviz show` (all images), fresh processes, median of "
          f"{args.runs}; load average {load:.1f} at the end\n")  # fmt: skip
    print("| tokens | bare s | show s | × bare | bare, no teardown s | × that | bare MiB | "
          "show MiB | images |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for n, bare, quick, show, count, megabytes in rows:
        print(
            f"| {n} | {med(bare, 0):.2f} | {med(show, 0):.2f} | "
            f"**{med(show, 0) / med(bare, 0):.2f}** | {med(quick, 0):.2f} | "
            f"{med(show, 0) / med(quick, 0):.2f} | {med(bare, 1):.0f} | {med(show, 1):.0f} | "
            f"{count} files, {megabytes:.1f} MB |"
        )


if __name__ == "__main__":
    main()
