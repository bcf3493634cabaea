"""`attnviz show` against the bare forward pass it is built on, at 16 and 512 tokens.

The bare script is the least anyone can do: import torch and transformers, load the bundled
model, run one forward pass with attentions. `attnviz show` does that plus the summary, the
terminal view and every image (overview, 6 layer grids, 72 head figures), and leaves without
the interpreter's teardown (`os._exit`, skipping ~0.8 s of freeing torch's objects). So the
like-for-like baseline is the bare script leaving the same way ("no teardown"); the ratio to
the bare script that pays its teardown is given beside it.

`show --no-images` (the summary and the terminal view alone) is run beside them, so that
the images' share is read off the same rounds.

Each run is a fresh process. A round runs the four once each, in an order rotated every
round, so all meet the same machine load and none always goes first; each ratio is taken
within a round, then min / median / max over the rounds. Peak memory is the largest sum of
RSS over the process and its drawing workers (see _rss.py); medians (min–max) of the rounds.
Run: .venv/bin/python bench/bench_show_vs_bare.py [--runs 5] [--tokens 16 512] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread
from _rss import measure, measure_shared

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


def _median_range(peaks: list[float]) -> str:
    return f"{statistics.median(peaks):.0f} ({min(peaks):.0f}–{max(peaks):.0f})"


def main() -> None:
    options = parser(__doc__, runs=5)
    options.add_argument(
        "--tokens", type=int, nargs="+", default=[16, 512], help="add 128 for the middle"
    )
    args = options.parse_args()
    if args.quick:
        args.runs, args.tokens = 2, [16]
    header("`attnviz show` against the bare forward pass", args)

    from transformers import AutoTokenizer
    from transformers.utils import logging

    from attnviz.core.models import bundled_model_path

    logging.set_verbosity_error()  # the corpus is longer than the model's limit, on purpose

    from attnviz.outputs.render import SHARED_PREFIX

    shared_files = f"/dev/shm/{SHARED_PREFIX}*"  # the weights show's drawing processes map
    path = str(bundled_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.tokens:
            text = text_of(n, tokenizer)
            out = Path(tmp) / str(n)
            commands = {
                "show": [ATTNVIZ, "show", text, "--out", str(out)],
                "no images": [ATTNVIZ, "show", text, "--no-images"],
                "no teardown": [sys.executable, "-c", BARE_NO_TEARDOWN, path, text],
                "bare": [sys.executable, "-c", BARE, path, text],
            }
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
            once: list[float] = []  # show's peak with its weights file in /dev/shm counted once
            for order in rounds(args.runs, list(commands)):
                for name in order:
                    if name == "show":
                        wall, peak, shared_once = measure_shared(commands[name], shared_files)
                        runs[name].append((wall, peak))
                        once.append(shared_once)
                    else:
                        runs[name].append(measure(commands[name]))
            images = list(out.glob("*/*.png"))  # the last run's files
            megabytes = sum(p.stat().st_size for p in images) / 1e6
            rows.append((n, runs, len(images), megabytes, once))

    def seconds(runs: list[tuple[float, float]]) -> list[float]:
        return [wall for wall, _ in runs]

    def mib(runs: list[tuple[float, float]]) -> str:
        return _median_range([peak for _, peak in runs])

    print("Ratios of wall time, one per round; min / median / max over the rounds.\n")
    print("| tokens | **show ÷ bare, no teardown** (like for like) | show ÷ bare with teardown |"
          " --no-images ÷ bare, no teardown | images |")  # fmt: skip
    print("|---|---|---|---|---|")
    for n, runs, count, megabytes, _ in rows:
        show, bare = seconds(runs["show"]), seconds(runs["no teardown"])
        print(
            f"| {n} | {spread(ratios(show, bare), bold=True)} | "
            f"{spread(ratios(show, seconds(runs['bare'])))} | "
            f"{spread(ratios(seconds(runs['no images']), bare))} | "
            f"{count} files, {megabytes:.1f} MB |"
        )
    print("\nWall seconds (min / median / max) and peak RSS MiB (median (min–max)), this machine"
          " and load only:\n")  # fmt: skip
    print("| tokens | show s | --no-images s | bare, no teardown s | bare s | show MiB | "
          "show MiB, shared once | bare MiB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for n, runs, _, _, once in rows:
        print(
            f"| {n} | {spread(seconds(runs['show']))} | {spread(seconds(runs['no images']))} | "
            f"{spread(seconds(runs['no teardown']))} | {spread(seconds(runs['bare']))} | "
            f"{mib(runs['show'])} | {_median_range(once)} | {mib(runs['bare'])} |"
        )
    print("\nshow's drawing processes map the text's weights from a file in /dev/shm, a layer at"
          " a time: the RSS sum counts what is mapped, as often as it is; 'shared once'"
          " counts the whole file once instead.")  # fmt: skip
    footer()


if __name__ == "__main__":
    main()
