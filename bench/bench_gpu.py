"""On a CUDA GPU: `attnviz show` of a 1B+ Llama-architecture model in bfloat16 at 1,024, 4,096
and 8,192 tokens, with --attention sdpa and with flash_attention_2, against a bare
transformers forward pass. Time and peak GPU memory; not run where no GPU is.

The model is random weights from TinyLlama-1.1B's configuration (22 layers, 32 query heads
sharing 4 key/value heads, d_model 2,048; 1.1B parameters, 2.2 GB in bfloat16), built once
into a temporary folder with SmolLM2's tokenizer (its vocabulary, 49,152); `--model NAME`
reads that model instead (`--model smollm2`: SmolLM2-135M from its GGUF file). The text is
the samples corpus repeated and cut to the length asked (SmolLM2's tokens, as
bench_smollm2.py cuts it).

Each side runs in a fresh process, the model loaded (untimed) before the peak counter is
reset, so the figures are of the work alone on top of the weights:
  bare               `model.model(ids)` under inference_mode, the model's SDPA (what anyone
                     would write; nothing kept)
  sdpa               `pipelines.show.show` of the text with `--layer L` (the probabilities of
                     one layer recorded in blocks of rows inside the model's attention call,
                     the summary of its heads, no images), the model loaded as `--dtype
                     bfloat16`; the other layers run SDPA
  flash_attention_2  the same with `--attention flash_attention_2`: the other layers run
                     flash-attn's kernels (left out, and said, where flash-attn is not
                     installed)
Time is wall time around that call (CUDA synchronised); peak is
torch.cuda.max_memory_allocated after it. A round runs every side at one length, in an order
rotated every round; the ratios are to the bare pass of the same round.
Run (on a CUDA machine): .venv/bin/python bench/bench_gpu.py [--runs 5] [--tokens 1024 4096
8192] [--model smollm2]
`--quick` runs a tiny model of the same architecture on the CPU at 256 tokens (sdpa alone),
to check the script works.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread
from bench_smollm2 import long_text

# TinyLlama-1.1B's configuration (TinyLlama/TinyLlama-1.1B-Chat-v1.0, config.json), with
# SmolLM2's vocabulary; --quick: the same shape of model, tiny.
CONFIG = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
              num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=8192,
              rope_theta=10000.0, rms_norm_eps=1e-5)  # fmt: skip
QUICK = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=8192, rope_theta=10000.0)  # fmt: skip
BARE, SDPA, FLASH = "bare", "sdpa", "flash_attention_2"

SIDE = """
import json, sys, time
import torch
from attnviz.core import models
from attnviz.core.settings import Load
folder, side, device, layer = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
text = open(sys.argv[5]).read()
how = Load(folder, device, "sdpa" if side == "bare" else side, dtype="bfloat16")
loaded = models.get(how).load()  # untimed: the weights
cuda = device == "cuda"
if cuda:
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
start = time.perf_counter()
if side == "bare":
    ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"].to(loaded.device)
    with torch.inference_mode():
        loaded.model.model(input_ids=ids)
else:
    from attnviz.pipelines.request import ShowRequest
    from attnviz.pipelines.show import show
    show(ShowRequest(how, text=text, layers=(layer,), images=False))
if cuda:
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else float("nan")
tokens = len(loaded.tokenizer(text)["input_ids"])
print(json.dumps({"seconds": seconds, "peak": peak, "tokens": tokens}))
"""


def build(folder: Path, config: dict) -> None:
    """A random Llama-architecture model from `config`, with SmolLM2's tokenizer, saved in
    bfloat16 (as checkpoints of this size are)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    from attnviz.core.models import _locate

    logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(_locate("smollm2")[0])
    llama = LlamaConfig(**config, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(llama).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.model_max_length = config["max_position_embeddings"]
    tokenizer.save_pretrained(folder)


def run_side(model: str, side: str, device: str, layer: int, text: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SIDE, model, side, device, str(layer), str(text)],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{side} failed: {done.stderr[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    import torch

    options = parser(__doc__, runs=5)
    options.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 8192])
    options.add_argument("--model", help="a model to read instead of the random 1.1B one")
    args = options.parse_args()
    device = "cpu" if args.quick else "cuda"
    if args.quick:
        args.runs, args.tokens = 2, [256]
    elif not torch.cuda.is_available():
        raise SystemExit("bench_gpu.py measures a CUDA GPU and there is none here (--quick "
                         "checks the script on the CPU)")  # fmt: skip
    header("A Llama in bfloat16 on a GPU: attnviz show (sdpa, flash_attention_2) against a "
           "bare forward pass", args)  # fmt: skip
    if device == "cuda":
        print(f"- GPU: {torch.cuda.get_device_name(0)}\n")
    flash = device == "cuda" and importlib.util.find_spec("flash_attn") is not None
    sides = [BARE, SDPA, *([FLASH] if flash else [])]
    if not flash:
        print("flash_attention_2 left out: " + ("--quick runs on the CPU" if args.quick else
              "flash-attn is not installed (pip install flash-attn)") + "\n")  # fmt: skip
    config = QUICK if args.quick else CONFIG
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = str(Path(tmp) / "llama")
            build(Path(model), config)
        from attnviz.core.models import describe

        spec = describe(model)
        layer = spec.n_layers // 2
        found: dict[int, dict[str, list[dict]]] = {}
        for tokens in args.tokens:
            text = Path(tmp) / f"text-{tokens}.txt"
            text.write_text(long_text(tokens))
            found[tokens] = {side: [] for side in sides}
            for order in rounds(args.runs, sides):
                for side in order:
                    found[tokens][side].append(run_side(model, side, device, layer, text))
    what = args.model or "Random TinyLlama-1.1B-shaped model"
    print(f"{what}, bfloat16, `show --layer {layer}` without images; ratios to the bare pass "
          "within a round:\n")  # fmt: skip
    print("| tokens | side | **time ÷ bare** | seconds | **peak ÷ bare** | peak GPU MiB |")
    print("|---|---|---|---|---|---|")
    for by_side in found.values():
        base = by_side[BARE]
        for side, runs in by_side.items():
            wall, peak = [r["seconds"] for r in runs], [r["peak"] for r in runs]
            time_ratio = spread(ratios(wall, [r["seconds"] for r in base]), 2, bold=True)
            peak_ratio = spread(ratios(peak, [r["peak"] for r in base]), 2, bold=True)
            print(f"| {runs[0]['tokens']:,} | {side} | {time_ratio} | {spread(wall, 2)} | "
                  f"{peak_ratio} | {spread(peak, 0)} |")  # fmt: skip
    footer()


if __name__ == "__main__":
    main()
