"""What recording costs while a decoder writes: SmolLM2 (the bundled GGUF, float32) continues a
1,000-token prompt by 256 greedy tokens, each side in a fresh process, side by side in each
round (order rotated), timed inside the process once the model is loaded.

Sides:
- generate: transformers' `generate` alone (SDPA, its KV cache), what a user runs without
  attnviz;
- recorded: `core.generation.write`, the same `generate` with attnviz's attention function
  keeping every layer's q and k of the prompt and each step's rows of every head (what every
  command with --generate starts from);
- show: `attnviz show … --generate 256 --no-images` as a pipeline (`pipelines.show.show`):
  the recording, then the rows handed to the summary's recorders (the text is past what
  `show` holds whole, so the rows stream: the prompt's a block at a time from its q and k).

Peak RSS of each process (model load included) is given beside its time.

Run: .venv/bin/python bench/bench_generate.py [--runs 3] [--prompt 1000] [--new 256] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread
from _rss import measure

SAMPLES = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"

SIDE = """
import sys, time
import torch
from attnviz.core.models import load_model
side, n_new, path, result = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
text = open(path).read()
loaded = load_model("smollm2", "cpu")
from attnviz.core import generation
from attnviz.core.tokens import encode
prompt = encode(loaded, text)
settings = generation.Settings(n_new)
layers = list(range(loaded.info.n_layers))
if side == "generate":
    loaded.model.set_attn_implementation("sdpa")  # transformers alone
    config = generation.generation_config(loaded, settings)
    ids = torch.tensor([prompt.ids])
    start = time.perf_counter()
    with torch.inference_mode():
        out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids),
                                    generation_config=config)
    seconds, written = time.perf_counter() - start, out.shape[1] - len(prompt)
elif side == "recorded":
    start = time.perf_counter()
    whole, reading = generation.write(loaded, prompt, settings, layers)
    seconds, written = time.perf_counter() - start, len(whole) - len(prompt)
else:
    from attnviz.core.settings import Load
    from attnviz.pipelines.request import ShowRequest
    from attnviz.pipelines.show import show
    request = ShowRequest(Load("smollm2", "cpu"), text=text, generate=n_new, out=None)
    start = time.perf_counter()
    shown = show(request).attention
    seconds = time.perf_counter() - start
    written = len(shown.tokens) - shown.continuation.start
open(result, "w").write(f"{seconds} {written} {len(prompt)}")
"""


def prompt_text(n_tokens: int) -> str:
    """The samples corpus repeated and cut to about `n_tokens` SmolLM2 tokens (BOS added)."""
    from transformers import AutoTokenizer

    from attnviz.core.models import _locate

    tokenizer = AutoTokenizer.from_pretrained(_locate("smollm2")[0])
    lines = [s for s in SAMPLES.read_text().splitlines() if s.strip()]
    ids: list[int] = []
    while len(ids) < n_tokens - 1:
        ids += tokenizer(" ".join(lines))["input_ids"]
    return tokenizer.decode(ids[: n_tokens - 1])


def main() -> None:
    options = parser(__doc__, runs=3)
    options.add_argument("--prompt", type=int, default=1000)
    options.add_argument("--new", type=int, default=256)
    args = options.parse_args()
    if args.quick:
        args.prompt, args.new = 64, 8
    header("SmolLM2 writing with attention recorded, against transformers' generate", args)
    sides = ["generate", "recorded", "show"]
    times: dict[str, list[float]] = {side: [] for side in sides}
    peaks: dict[str, list[float]] = {side: [] for side in sides}
    counts = set()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prompt.txt"
        path.write_text(prompt_text(args.prompt))
        for order in rounds(args.runs, sides):
            for side in order:
                out = Path(tmp) / "out.txt"
                command = [sys.executable, "-c", SIDE, side, str(args.new), str(path), str(out)]
                _, peak = measure(command)
                seconds, written, prompt = out.read_text().split()
                times[side].append(float(seconds))
                peaks[side].append(peak)
                counts.add((int(written), int(prompt)))
    (written, prompt), *others = sorted(counts)
    if others:
        raise SystemExit(f"the sides wrote different numbers of tokens: {sorted(counts)}")
    print(
        f"A {prompt}-token prompt, {written} tokens written (greedy), float32 on the CPU; "
        f"ratios to `generate` in the same round, min / median / max over {args.runs} rounds; "
        "seconds exclude the model's load, peak RSS includes it\n"
    )
    print("| side | **÷ generate** | seconds (median) | peak RSS MiB (median) |")
    print("|---|---|---|---|")
    for side in sides:
        ratio = spread(ratios(times[side], times["generate"]), 2, bold=True)
        print(f"| {side} | {ratio} | {statistics.median(times[side]):.2f} | "
              f"{statistics.median(peaks[side]):.0f} |")  # fmt: skip
    footer()


if __name__ == "__main__":
    main()
