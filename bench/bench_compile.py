"""Issue 55's step 3, measured before it is taken: would `torch.compile` of a block's softmax
and entropy make attnviz's attention function cheaper? One layer of SmolLM2's shape (9 query
heads sharing 3 key/value heads of 64), causal, float32, every block of a streamed run's rows
(`memory.stream_rows`) made and handed on, side by side in each round.

Sides:
- rows: `recording.Scores.rows` as attnviz runs it (the products a panel of rows at a time,
  torch's softmax, each row's entropy from ln Z and one product: no logarithm per cell);
- compiled: the same products, then the causal mask, the softmax and the entropy as one
  function through `torch.compile(dynamic=True)` (inductor's generated C++ on the CPU), which
  can fuse the mask, the exponentials, the sums and the entropy's product into one pass.

The compile itself is timed apart, in this process: the first call (tracing and code
generation, or inductor's cache on disk where an earlier run left it) and the second (a
block of another width, where a recompile would show).

Run: .venv/bin/python bench/bench_compile.py [--runs 5] [--lengths 2048 8192]
"""

from __future__ import annotations

import statistics
import time

from _common import footer, header, parser, ratios, rounds, spread

HEADS, KV_HEADS, D_HEAD = 9, 3, 64  # SmolLM2-135M


def softmax_entropy(scores, start: int):
    """A causal block's probabilities and each row's entropy, (…, b, W) and (…, b), from its
    scores: query start + i sees keys 0 … start + i."""
    import torch

    b, width = scores.shape[-2], scores.shape[-1]
    query = torch.arange(b, device=scores.device).view(b, 1) + start
    key = torch.arange(width, device=scores.device).view(1, width)
    scores = torch.where(key <= query, scores, torch.finfo(torch.float32).min)
    top = scores.amax(dim=-1, keepdim=True)
    exp = torch.exp(scores - top)
    total = exp.sum(dim=-1, keepdim=True)
    probs = exp / total
    entropy = (torch.log(total) + top).squeeze(-1) - (probs * scores).sum(dim=-1)
    return probs, entropy


def sides_at(n: int, compiled) -> dict:
    import torch

    from attnviz.core import memory, recording

    q = torch.randn(1, HEADS, n, D_HEAD)
    k = torch.randn(1, KV_HEADS, n, D_HEAD)
    scores = recording.Scores(q, k, None, D_HEAD**-0.5, causal=True)
    rows = memory.stream_rows(HEADS, n)
    groups = HEADS // KV_HEADS

    def ours():
        for start in range(0, n, rows):
            scores.rows(start, min(start + rows, n), True)

    def fused():
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            b = stop - start
            part = (q[:, :, start:stop] * D_HEAD**-0.5).reshape(1, KV_HEADS, groups * b, D_HEAD)
            products = recording._products(part, k[:, :, :stop]).view(1, HEADS, b, stop)
            compiled(products, start)

    return {"rows": ours, "compiled": fused}


def _same(compiled) -> None:
    """Stop unless the compiled side makes the same numbers as attnviz's (1e-6; the entropy
    relative to its size, the order of its sums differing)."""
    import torch

    from attnviz.core import recording

    n, start = 700, 400
    q, k = torch.randn(1, HEADS, n, D_HEAD), torch.randn(1, KV_HEADS, n, D_HEAD)
    want, want_entropy = recording.Scores(q, k, None, D_HEAD**-0.5, causal=True).rows(
        start, n, True
    )
    part = (q[:, :, start:] * D_HEAD**-0.5).reshape(1, KV_HEADS, -1, D_HEAD)
    products = recording._products(part, k).view(1, HEADS, n - start, n)
    probs, entropy = compiled(products, start)
    if not (torch.allclose(probs, want, rtol=0, atol=1e-6)
            and torch.allclose(entropy, want_entropy, rtol=1e-6, atol=0)):  # fmt: skip
        raise SystemExit("the compiled side's numbers differ from attnviz's")


def main() -> None:
    import torch

    from attnviz.core import memory

    options = parser(__doc__, runs=5)
    options.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    args = options.parse_args()
    lengths = [512] if args.quick else args.lengths
    header("torch.compile of a block's softmax and entropy, against attnviz's function", args)
    torch.manual_seed(0)
    memory.reuse_freed_blocks()
    compiled = torch.compile(softmax_entropy, dynamic=True)
    for width in (1000, 1500):  # the compile, and a second width (a recompile would show)
        start = time.perf_counter()
        compiled(torch.randn(1, HEADS, 200, width), width - 200)
        print(f"- call at {width} keys (compile included): {time.perf_counter() - start:.2f} s")
    _same(compiled)
    print()
    print("| tokens | **compiled ÷ rows** | rows s | compiled s |")
    print("|---|---|---|---|")
    for n in lengths:
        sides = sides_at(n, compiled)
        times: dict[str, list[float]] = {side: [] for side in sides}
        with torch.inference_mode():
            for side in sides.values():
                side()
            for order in rounds(args.runs, list(sides)):
                for side in order:
                    start = time.perf_counter()
                    sides[side]()
                    times[side].append(time.perf_counter() - start)
        print(f"| {n:,} | {spread(ratios(times['compiled'], times['rows']), bold=True)} | "
              f"{statistics.median(times['rows']):.3f} | "
              f"{statistics.median(times['compiled']):.3f} |")  # fmt: skip
    footer()


if __name__ == "__main__":
    main()
