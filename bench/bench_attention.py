"""The floor of recording attention: attnviz's attention function (`core.recording`) against
the SDPA call it stands in for, on one layer of SmolLM2's shape (9 query heads sharing 3
key/value heads of 64), causal, float32, at 512, 2,048 and 8,192 tokens, side by side in
each round.

Sides:
- sdpa: `torch.nn.functional.scaled_dot_product_attention`, causal, grouped-query heads (what
  a layer nobody records runs);
- blocks: `recording.in_blocks` in a streamed run's blocks of query rows (the device's:
  `memory.stream_rows`, sized to the CPU's cache where the checkout does so; `--block-rows`
  to set them), each block handed to a running statistic (its column sums: the cheapest
  recorder) and multiplied by V for the output;
- blocks+entropy: the same with each row's entropy (what the summary's recorder asks).

Every later change to the function is measured against this.

Run: .venv/bin/python bench/bench_attention.py [--runs 5] [--lengths 512 2048 8192]
"""

from __future__ import annotations

import statistics
import time

from _common import footer, header, parser, ratios, rounds, spread

HEADS, KV_HEADS, D_HEAD = 9, 3, 64  # SmolLM2-135M


def rows_at(n: int) -> int:
    """A streamed run's block rows at `n` tokens on the CPU, as the checkout sizes them."""
    from attnviz.core import memory

    try:  # sized to the CPU's cache (issue 55)
        return memory.stream_rows(HEADS, n, "cpu")
    except TypeError:  # before: to memory alone
        return memory.stream_rows(HEADS, n)


def sides_at(n: int, block_rows: int | None = None) -> dict:
    """The three sides on random q, k and v of `n` tokens."""
    import torch

    from attnviz.core import recording

    q = torch.randn(1, HEADS, n, D_HEAD)
    k, v = torch.randn(1, KV_HEADS, n, D_HEAD), torch.randn(1, KV_HEADS, n, D_HEAD)
    scores = recording.Scores(q, k, None, D_HEAD**-0.5, causal=True)
    sums = torch.zeros(1, HEADS, n)
    rows = block_rows or rows_at(n)

    def take(start, rows, entropies):  # the cheapest recorder: each key's column sum
        sums[..., : rows.shape[-1]] += rows.sum(dim=2)

    return {
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True
        ),
        "blocks": lambda: recording.in_blocks(scores, v, rows, take=take),
        "blocks+entropy": lambda: recording.in_blocks(scores, v, rows, take=take, entropy=True),
    }


def main() -> None:
    import torch

    options = parser(__doc__, runs=5)
    options.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    options.add_argument("--block-rows", type=int, default=None, help="default: the device's")
    args = options.parse_args()
    lengths = [256, 512] if args.quick else args.lengths
    header("attnviz's attention function against SDPA, one layer", args)
    torch.manual_seed(0)
    from attnviz.core import memory

    memory.reuse_freed_blocks()  # freed blocks kept for the next, as a streamed run keeps them
    print("| tokens | rows a block | blocks ÷ sdpa | blocks+entropy ÷ sdpa | sdpa s | blocks s | "
          "blocks+entropy s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for n in lengths:
        sides = sides_at(n, args.block_rows)
        times: dict[str, list[float]] = {side: [] for side in sides}
        with torch.inference_mode():
            for side in sides.values():  # warm: first calls allocate
                side()
            for order in rounds(args.runs, list(sides)):
                for side in order:
                    start = time.perf_counter()
                    sides[side]()
                    times[side].append(time.perf_counter() - start)
        plain = ratios(times["blocks"], times["sdpa"])
        entropy = ratios(times["blocks+entropy"], times["sdpa"])
        medians = [statistics.median(times[side]) for side in sides]
        rows = args.block_rows or rows_at(n)
        print(f"| {n:,} | {rows} | {spread(plain, bold=True)} | {spread(entropy, bold=True)} | "
              + " | ".join(f"{m:.3f}" for m in medians) + " |")  # fmt: skip
    footer()


if __name__ == "__main__":
    main()
