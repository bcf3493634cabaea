"""A model type whose attention bypasses transformers' interface (BLOOM) runs eager with
`output_attentions`: its time and peak memory against the interface path on models of one
size, and the memory estimate against the peak.

Three random models of one size (4 layers × 8 heads, d_model 256, the bundled model's
tokenizer), saved to a temporary folder: GPT-NeoX read through attnviz's attention function
(the interface path, SDPA for what nobody records), the same GPT-NeoX with `--attention eager`
(the eager path on the very same model), and BLOOM, which takes the eager path whatever is
asked. Each case is `attnviz show TEXT -m FOLDER --no-images`, a fresh process per run, its
peak the largest RSS sampled (_rss.py); its estimate is what the command says it needs under
ATTNVIZ_MEMORY_LIMIT=1B (the refusal every run makes before loading). A round runs the three
once each, in an order rotated every round; ratios are taken within a round.
Run: .venv/bin/python bench/bench_eager.py [--runs 3] [--tokens 1024 2048 4096] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread
from _rss import measure
from bench_memory import estimated, text_of

ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))
SIZE = dict(hidden_size=256, num_attention_heads=8, num_hidden_layers=4)
SIDES = ("interface", "eager", "bloom")
SAID = {
    "interface": "GPT-NeoX, attnviz's function",
    "eager": "GPT-NeoX, --attention eager",
    "bloom": "BLOOM (eager: bypasses the interface)",
}


def save_models(root: Path, positions: int) -> dict[str, str]:
    """{side: folder} of the random models, with the bundled model's tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from attnviz.core.models import bundled_model_path

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_path())
    tokenizer.model_max_length = positions
    common = dict(vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=0, pad_token_id=0)
    configs = {
        "gpt_neox": dict(
            **SIZE, **common, intermediate_size=4 * 256, max_position_embeddings=positions
        ),
        "bloom": dict(**SIZE, **common),  # ALiBi: no position table
    }
    found = {}
    for kind, overrides in configs.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **overrides))
        folder = root / kind
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        found[kind] = str(folder)
    return {"interface": found["gpt_neox"], "eager": found["gpt_neox"], "bloom": found["bloom"]}


def main() -> None:
    options = parser(__doc__, runs=3)
    options.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 4096])
    args = options.parse_args()
    lengths = [256] if args.quick else args.tokens
    header("Eager attention (a type that bypasses the interface) against the interface path",
           args)  # fmt: skip

    from tokenizers import Tokenizer

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = save_models(Path(tmp), max(lengths) + 8)
        tokenizer = Tokenizer.from_file(str(Path(folders["bloom"]) / "tokenizer.json"))
        tokenizer.no_truncation()
        tokenizer.no_padding()
        for n in lengths:
            text = text_of(n, lambda t: len(tokenizer.encode(t).ids))
            commands = {
                side: [ATTNVIZ, "show", text, "-m", folders[side], "--no-images", "--device",
                       "cpu", *(["--attention", "eager"] if side == "eager" else [])]
                for side in SIDES
            }  # fmt: skip
            guesses = {side: estimated(command) for side, command in commands.items()}
            times: dict[str, list[float]] = {side: [] for side in SIDES}
            peaks: dict[str, list[float]] = {side: [] for side in SIDES}
            for order in rounds(args.runs, SIDES):
                for side in order:
                    seconds, peak = measure(commands[side])
                    times[side].append(seconds)
                    peaks[side].append(peak)
            print(f"  {n} tokens: {times} s, {peaks} MiB", file=sys.stderr)
            rows.append((n, guesses, times, peaks))

    print("| tokens | side | time s | peak MiB | estimate MiB | estimate ÷ peak |")
    print("|---|---|---|---|---|---|")
    for n, guesses, times, peaks in rows:
        for side in SIDES:
            peak = statistics.median(peaks[side])
            print(f"| {n:,} | {SAID[side]} | {statistics.median(times[side]):.2f} | {peak:,.0f} | "
                  f"{guesses[side]:,.0f} | {guesses[side] / peak:.2f} |")  # fmt: skip
    print("\n| tokens | eager ÷ interface, time | peak | BLOOM ÷ interface, time | peak |")
    print("|---|---|---|---|---|")
    for n, _, times, peaks in rows:
        cells = [
            spread(ratios(what[side], what["interface"]))
            for side in ("eager", "bloom")
            for what in (times, peaks)
        ]
        print(f"| {n:,} | " + " | ".join(cells) + " |")
    footer()


if __name__ == "__main__":
    main()
