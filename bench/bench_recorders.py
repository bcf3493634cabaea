"""What each of `show --html`'s recorders costs on a long text: one layer of SmolLM2's shape
(9 query heads sharing 3 key/value heads of 64) over the SmolLM2 tokens of an N-token text,
causal, float32, its rows made by attnviz's attention function (`recording.in_blocks`) in
the streamed run's blocks (`memory.stream_rows`) and handed out by the capture pass's own
bookkeeping (`capture._Pass.block`: with `core.reductions`, every recorder's reads of a
block in one place), to:

    summary   the head statistics (`analysis.summary.HeadStats`: metrics, keys, links)
    figures   the figures' pooled maps (`analysis.pooling.Pooled`, image pool size)
    page      the page's pooled maps (page pool size)
    special   the special shares by weight and by norm (`contributions.SpecialShares`)
    all       the four together, as `show - -m smollm2 --html` has them

Each side runs the function with each row's entropy (what the summary asks); a recorder's
cost is its side's time less the function's alone ("function+entropy"), times the model's 30
layers. Every side runs twice a round: with the compiled pass (`core.fused`) and with torch's
operations, so that both meet the same machine. SDPA on the same q, k and v is the floor.
q, k and v are random; the text's tokens (its special and punctuation tokens, its repeats)
are SmolLM2's. Each side's recorders are made once and read the layer once untimed, as
the text's first layer: what they keep for later layers (the summary's repeat lists and
key tables) is then kept, as on layers 1 … 29. Rounds run every side once, in an order
rotated every round; medians over the rounds.

Run: .venv/bin/python bench/bench_recorders.py [--runs 3] [--tokens 8085] [--block-rows N]
"""

from __future__ import annotations

import statistics
import time

from _common import footer, header, parser, rounds

HEADS, KV_HEADS, D_HEAD, LAYERS = 9, 3, 64, 30  # SmolLM2-135M
RECORDERS = ("summary", "figures", "page", "special")


def setup(n: int, block_rows: int | None):
    """The sides at `n` tokens, and the block rows they run in."""
    import numpy as np
    import torch
    from bench_long import text_of
    from transformers import AutoTokenizer

    from attnviz.analysis.contributions import SpecialShares
    from attnviz.analysis.pooling import Pooled
    from attnviz.analysis.summary import HeadStats
    from attnviz.core import capture, gguf_cache, layer_map, memory, recording
    from attnviz.core.extract import text_attention
    from attnviz.core.settings import Load
    from attnviz.core.tokens import encode
    from attnviz.pipelines.consumers.summary import _Blocks
    from attnviz.pipelines.request import ShowRequest
    from attnviz.pipelines.views import image_pool_size, page_pool_size

    text = text_of(n, AutoTokenizer.from_pretrained(str(gguf_cache.converted("smollm2"))))
    loaded = ShowRequest(Load("smollm2", "cpu"), text=text).model().load()
    encoded = encode(loaded, text)
    n = len(encoded)
    stand_in = np.broadcast_to(np.zeros((), np.float32), (1, HEADS, n, n))
    att = text_attention(encoded, loaded.info, [0], stand_in)
    special = [np.array(encoded.special, dtype=bool)]
    try:  # the device's blocks, where the checkout sizes them to its cache
        rows = block_rows or memory.stream_rows(HEADS, n, "cpu")
    except TypeError:
        rows = block_rows or memory.stream_rows(HEADS, n)
    memory.reuse_freed_blocks()  # as a streamed run does

    q = torch.randn(1, HEADS, n, D_HEAD)
    k, v = torch.randn(1, KV_HEADS, n, D_HEAD), torch.randn(1, KV_HEADS, n, D_HEAD)
    scores = recording.Scores(q, k, None, D_HEAD**-0.5, causal=True)
    x = torch.randn(1, n, loaded.model.config.hidden_size)  # layer 0's input: ‖f^h(x_j)‖
    site = (None, 0)
    where = layer_map.of(loaded.model)

    def made(name: str):
        if name == "summary":
            return _Blocks(HeadStats(att, 1, HEADS), [0])
        if name in ("figures", "page"):
            size = (image_pool_size if name == "figures" else page_pool_size)(LAYERS, HEADS, n, n)
            return Pooled([0], HEADS, n, n, size, "max", True)
        return SpecialShares(loaded, [0], special)

    def side(names: tuple[str, ...]):
        recorders = [made(name) for name in names]  # a text's: what they keep from one layer
        # for the next (the summary's repeat lists and key tables) kept, as on layers 1 … 29

        def run():
            wanted = {site: {kind for r in recorders for kind in r.wants[0]}}
            heard = capture._Pass(loaded, where, recorders, wanted, True, rows, None)
            if any(isinstance(r, SpecialShares) for r in recorders):
                heard.arrive("input", site, x)
            take = (lambda *block: heard.block(site, *block)) if recorders else None
            asked = (lambda: heard.reductions(site)) if recorders else None
            try:  # what the recorders read of each block, made with it where the pass can
                recording.in_blocks(scores, v, rows, take, entropy=True, asked=asked)
            except TypeError:  # a checkout before core.fused
                recording.in_blocks(scores, v, rows, take, entropy=True)

        return run

    sides = {
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True
        ),
        "function": lambda: recording.in_blocks(scores, v, rows),
        "function+entropy": side(()),
        **{name: side((name,)) for name in RECORDERS},
        "all": side(RECORDERS),
    }
    return sides, rows, n


def fused_kernel():
    """The compiled pass this checkout builds (`core.fused.kernel`), or None before it."""
    try:
        from attnviz.core import fused
    except ImportError:
        return lambda: None
    return fused.kernel


def use(kernel) -> None:
    """Blocks made by `kernel` from now on: the compiled pass, or torch's operations."""
    try:
        from attnviz.core import fused
    except ImportError:
        return
    fused.kernel = kernel


def main() -> None:
    import torch

    options = parser(__doc__, runs=3)
    options.add_argument("--tokens", type=int, default=8085)
    options.add_argument("--block-rows", type=int, default=None, help="default: the device's")
    options.add_argument("--cpu-time", action="store_true", help="the process's CPU seconds, "
                         "not wall: on a shared machine, with OMP_NUM_THREADS=1")  # fmt: skip
    args = options.parse_args()
    tokens = 1024 if args.quick else args.tokens
    header("show --html's recorders, one layer", args)
    torch.manual_seed(0)
    sides, rows, n = setup(tokens, args.block_rows)
    # each side twice: with the compiled pass (core.fused), and with torch's operations
    kinds = {"compiled": fused_kernel(), "torch": lambda: None}
    times: dict[tuple[str, str], list[float]] = {}
    clock = time.process_time if args.cpu_time else time.perf_counter
    with torch.inference_mode():
        for run in sides.values():  # untimed: the text's first layer
            run()
        for order in rounds(args.runs, [(name, kind) for name in sides for kind in kinds]):
            for name, kind in order:
                use(kinds[kind])
                start = clock()
                sides[name]()
                times.setdefault((name, kind), []).append(clock() - start)
    use(kinds["compiled"])
    median = {key: statistics.median(found) for key, found in times.items()}
    what = "CPU seconds" if args.cpu_time else "seconds"
    print(
        f"{n:,} tokens, blocks of {rows} rows, {torch.get_num_threads()} threads, {what}; "
        f"medians of {args.runs} rounds; each side with attnviz's compiled pass "
        "(core/fused.py) and with torch's operations (ATTNVIZ_KERNEL=0) in the same rounds.\n"
    )
    print(
        f"| side | s a layer, compiled | s a layer, torch's | ÷ sdpa, compiled | "
        f"added × {LAYERS} layers, compiled | added × {LAYERS} layers, torch's |"
    )
    print("|---|---|---|---|---|---|")
    sdpa = median[("sdpa", "compiled")]
    for name in sides:
        mine, theirs = median[(name, "compiled")], median[(name, "torch")]
        added = [median[(name, kind)] - median[("function+entropy", kind)] for kind in kinds]
        cells = (["–", "–"] if name not in (*RECORDERS, "all")
                 else [f"{a * LAYERS:.1f}" for a in added])  # fmt: skip
        print(f"| {name} | {mine:.3f} | {theirs:.3f} | {mine / sdpa:.2f} | {' | '.join(cells)} |")
    footer()


if __name__ == "__main__":
    main()
