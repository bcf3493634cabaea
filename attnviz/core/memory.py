"""What a run will hold in memory, estimated before it starts, and the refusal when that does
not fit in the memory available.

A run's memory is mostly arrays that grow with the square of its length: the attention of
every layer kept (L × H × T × T floats), the other measures an interactive page carries, and
while the model runs, one layer's (H, T, T) probabilities and what each measure computes from
them. `estimate` adds them up from the model's facts, the number of tokens and what is asked
(`Asked`): a pure function, no torch. `refuse` runs it for a command's texts from the model's
files alone, before the weights load, and says in one line how much the run needs, how much
is available and what would fit (`--layer`, leaving out `--html`, a shorter text). `require`
is the last check before one large array is made, wherever the early one could not count the
tokens (a model not on this machine yet, an encoder-decoder model's target).

The memory available is `ATTNVIZ_MEMORY_LIMIT` (`2GiB`, `1500MB`, bytes) when set, else what
this process holds plus the system's MemAvailable (/proc/meminfo; `os.sysconf`'s available
pages elsewhere); where neither is known nothing is refused. bench/bench_memory.py measures
the estimate against the peak of real runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from math import prod
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError, MemoryLimitError

if TYPE_CHECKING:
    from attnviz.core.model_info import ModelSpec
    from attnviz.core.settings import Load

MiB, GiB = 2**20, 2**30
ENV = "ATTNVIZ_MEMORY_LIMIT"
# Python with torch and transformers imported, before any weights (bench/bench_memory.py).
RUNTIME = 330 * MiB
# A drawing process with matplotlib imported, before the arrays it is sent.
WORKER = 150 * MiB
# What summaries and the special-token shares hold at once: blocks of rows
# (`analysis.metrics.BLOCK_FLOATS`) with their temporaries.
BLOCKS = 64 * MiB
# ALTI's blocks of (query, key, d_model) floats (`analysis.contributions.BLOCK_FLOATS`, 2^22)
# and their temporaries, three at once.
ALTI_BLOCKS = 3 * 2**22 * 4
# One layer's weights up to this size are drawn by the drawing processes (each maps it from a
# shared file, or holds a copy); a larger layer is drawn in the process that holds it
# (`outputs.render` reads it here).
MAX_LAYER_BYTES = 64 * MiB
FLOAT = 4  # bytes: attention is held in float32
# Above this much attention held whole (the chosen layers' maps of one text), `show` holds
# none of it whole: blocks of rows are summed as the pass makes them (`streams`).
STREAM_ABOVE = 1 * GiB
# What the API leaves free of the memory available when it holds maps whole (at most a
# tenth of it): the rest of the machine goes on meanwhile.
HELD_MARGIN = 1 * GiB
# One layer's maps (float32) past which `check` reads the probabilities in blocks of rows
# from attnviz's attention function instead of whole from the model's eager attention, which
# holds them with its scores, and our float64 recomputation beside (`pipelines.check`).
CHECK_WHOLE_LAYER = 256 * MiB
# One block of a streamed run's probabilities, in float32 (`stream_rows`); with its scores
# and the statistics' temporaries, about five at once.
STREAM_BLOCK = 48 * MiB
# A layer's whole (B, H, T, T) maps a model running eager attention holds at once while the
# layer runs: its scores, its scores with the mask added, its probabilities, and the copy
# attnviz keeps of them (bench/bench_eager.py).
EAGER_LAYER = 4
# (T, d_model) float32 arrays a decoder's prompt pass holds at once beside its KV cache
# (`generate_estimate`): a needle run over 7,990 tokens of SmolLM2 peaked at 2.04 GiB, this
# estimate 2.07 GiB.
GENERATE_ACTIVATIONS = 48
# What `report` holds beyond `show`'s streamed run when it streams a long text, in (T, T)
# float32 maps: the heap grows block by block while the mixing ratios are summed (their
# float64 products over blocks of rows of growing width). Measured: 8,085 tokens of SmolLM2
# 4.93 GiB against show's 2.24 (10.3 maps), 6,000 tokens of a 2-layer, 8-head Llama 1.61 GiB
# against 0.62 (7.3 maps); counted with a margin.
REPORT_STREAMED = 16
# A block of a vision tower's rows, as maps of the block's size (float32) held at once: the
# attention function's scores and probabilities, and `analysis.tower`'s rows of the patches,
# their share on the patch keys and its products.
TOWER_BLOCK = 5


@dataclass(frozen=True)
class Asked:
    """What a run asks for, as far as its memory goes."""

    layers: Sequence[int] | None = None  # the layers kept; None: all
    measure: str = "weights"  # weights, norm, alti or rollout
    html: bool = False  # the interactive page: every measure, and the page itself
    images: bool = False  # figures, drawn by `jobs` processes (1: this one)
    jobs: int = 1
    transformed: bool = False  # --words or --hide-special: a second array of the views
    ablate: bool = False  # a second pass with heads removed, both patterns kept
    batch: int = 1  # texts read in one forward pass (export)
    in_flight: int = 0  # texts whose attention waits to be drawn (export)
    command: str = "show"  # whose options the refusal names
    eager: bool = False  # the model runs eager attention: each layer's maps made whole

    @classmethod
    def of(cls, request: Any) -> Asked:
        """What a `pipelines.request.Request` of show or export asks for (read by its field
        names: core imports nothing above it)."""
        r, export, report = request, request.command == "export", request.command == "report"
        figures = getattr(r, "figures", None)  # export's kinds of figure (() : none)
        return cls(
            layers=None if report else r.layers,  # a report reads every layer
            measure=r.measure,
            html=r.html,
            images=r.images and r.out is not None and figures != () and not report,
            jobs=r.jobs,
            # a treebank's report reads each text's word view: a second copy, held
            transformed=r.words or r.hide_special or getattr(r, "treebank", False),
            ablate=bool(getattr(r, "ablate", ())),  # show's alone
            batch=r.batch_size if export or report else 1,
            in_flight=2 * r.jobs if export and r.jobs > 1 else 0,
            command=r.command,
        )


@dataclass(frozen=True)
class Estimate:
    """Bytes a run will hold at its peak (`total`), and the part that is its attention."""

    total: int
    attention: int


def estimate(
    n_layers: int, n_heads: int, weights: int, n_tokens: int, asked: Asked = Asked()
) -> Estimate:
    """The peak memory of one run over `n_tokens` (the longest text of a batch) on a model of
    `n_layers` × `n_heads` whose weights take `weights` bytes, asked for `asked`.

    Counted in (T, T) float32 maps: the chosen layers' maps are held to the end (one per
    head, or one per layer for ALTI and rollout), again by a norm's shares, by --words or
    --hide-special and, in a batch, by each text's crop; a page holds all four measures and
    about two bytes a map of its own; ablation keeps both passes' patterns and compares them
    in float64. While the model runs, one layer's probabilities exist twice (recomputed or
    the model's own, and the copy kept), and ALTI's mixing ratios take six more in float64
    (and its blocks of vectors, a constant). A model running eager attention (`asked.eager`)
    holds one layer's whole scores and probabilities at once instead (EAGER_LAYER maps a
    head), streamed or not.
    Drawing processes each hold the layer they draw, twice.
    """
    b, h = asked.batch, n_heads
    layers = _kept(n_layers, asked)
    grid = n_tokens * n_tokens * FLOAT  # one (T, T) map
    if streams(n_layers, n_heads, n_tokens, asked):
        return _streamed(layers, h, weights, n_tokens, replace(asked, batch=1))
    per_layer = asked.measure in ("alti", "rollout")
    held = b * layers * (1 if per_layer else h) * grid
    # each text of a batch is cropped to its own tokens: a second copy
    copies = 1 + (b > 1) + asked.transformed + (asked.measure == "norm") + 4 * asked.ablate
    attention = held * copies + asked.in_flight * layers * h * grid
    if asked.html:  # every measure, as the page shows it, and the page's own text
        every = b * layers * (2 * h + 2) * grid
        attention += every * (1 + asked.transformed) + every // 2
    transient = (EAGER_LAYER if asked.eager else 2) * b * h * grid * (1 + asked.ablate)
    if asked.html or asked.measure == "alti":
        transient += 6 * b * h * grid + 2 * b * grid + ALTI_BLOCKS
    drawing = 0
    if asked.images:
        layer = h * grid
        workers = asked.jobs if asked.jobs > 1 and layer <= MAX_LAYER_BYTES else 0
        # with workers, the chosen layers' weights also lie in a file in shared memory while
        # they draw (outputs.render.Shared), each worker with a layer or two of it mapped
        shared = held // b  # one text's maps
        drawing = workers * (WORKER + 2 * layer) + shared if workers else WORKER + layer
    total = RUNTIME + weights + BLOCKS + attention + transient + drawing
    return Estimate(total, attention)


def _streamed(layers: int, h: int, weights: int, n_tokens: int, asked: Asked) -> Estimate:
    """A streamed run's peak: the pooled maps of the images (about MAX_SIDE² a head) and of
    the page, each key's sums (float64), a few blocks of rows and their temporaries, the
    window's cells, and the drawing processes with one layer's pooled maps each."""
    side = min(n_tokens, 512)  # analysis.pooling.MAX_SIDE
    pooled = layers * h * side * side * FLOAT * (1 + asked.html)
    sums = layers * h * n_tokens * 8 * 2  # key sums and a query's rows
    blocks = 5 * STREAM_BLOCK  # a block, its scores, the statistics' temporaries
    if asked.eager:  # the model makes the layer whole; the blocks are cut from it
        blocks += EAGER_LAYER * h * n_tokens * n_tokens * FLOAT
    window = layers * h * 256 * 256 * FLOAT
    drawing = (asked.jobs if asked.jobs > 1 else 1) * (WORKER + 2 * h * side * side * FLOAT)
    if asked.command == "report":  # no map drawn; the mixing ratios' growth instead
        pooled, blocks = 0, blocks + REPORT_STREAMED * n_tokens * n_tokens * FLOAT
    attention = pooled + sums + window
    total = RUNTIME + weights + BLOCKS + attention + blocks + (drawing if asked.images else 0)
    return Estimate(total, attention)


def streams(n_layers: int, n_heads: int, n_tokens: int, asked: Asked) -> bool:
    """Whether `show` reads this text (or `report` this batch, then a text at a time) without
    holding any map whole (`pipelines.readers`, `pipelines.corpus`): the maps would take more
    than STREAM_ABOVE, and nothing asked needs them whole (--words, --hide-special, a
    treebank's word views, --ablate, a measure other than the weights). Its summary is then
    summed from blocks of rows, and show's images and page are pooled."""
    if asked.command not in ("show", "report") or asked.transformed or asked.ablate:
        return False
    if asked.measure != "weights":
        return False
    maps = asked.batch * _kept(n_layers, asked) * n_heads * n_tokens * n_tokens * FLOAT
    return maps > STREAM_ABOVE


def stream_rows(n_heads: int, n_tokens: int) -> int:
    """Query rows a block of a streamed run holds, so that one block of one layer's
    probabilities (float32) stays within STREAM_BLOCK bytes: the fewer blocks, the less
    time spent between them (at 8,192 tokens and 9 heads, 170 rows)."""
    return max(1, min(256, STREAM_BLOCK // (FLOAT * n_heads * max(n_tokens, 1))))


def _kept(n_layers: int, asked: Asked) -> int:
    return n_layers if asked.layers is None else len(set(asked.layers))


def parse_size(text: str) -> int:
    """Bytes from `2GiB`, `1.5 GB`, `512MiB`, `800M` or a number of bytes."""
    units = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
             "mib": MiB, "g": 10**9, "gb": 10**9, "gib": GiB, "t": 10**12, "tb": 10**12,
             "tib": 2**40}  # fmt: skip
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if found is None or found.group(2).lower() not in units:
        raise InputError(
            f"{ENV}={text!r} is not a size: give bytes or a number with a unit, e.g. 2GiB"
        )
    return int(float(found.group(1)) * units[found.group(2).lower()])


def shown(size: float) -> str:
    """`1.25 GiB`, `340 MiB`."""
    return f"{size / GiB:,.2f} GiB" if size >= GiB else f"{size / MiB:,.0f} MiB"


def _own_rss() -> int:
    """This process's resident memory, bytes (0 where /proc cannot say)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0


def _system_available() -> int | None:
    """The system's available memory: /proc/meminfo's MemAvailable, else the available
    physical pages `os.sysconf` reports; None where neither is known."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def budget() -> int | None:
    """The memory a run may hold at its peak, its drawing processes included: the limit in
    ATTNVIZ_MEMORY_LIMIT, else what this process holds plus what the system has available;
    None where that is unknown."""
    limit = os.environ.get(ENV, "").strip()
    if limit:
        return parse_size(limit)
    available = _system_available()
    return None if available is None else available + _own_rss()


def _fits(needed: int, allowed: int | None) -> bool:
    return allowed is None or needed <= allowed


def _longest_fitting(fits, n_tokens: int) -> int:
    """The most tokens, below `n_tokens`, for which `fits(tokens)` (0 if none)."""
    low, high = 0, n_tokens
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def check(
    n_layers: int, n_heads: int, weights: int, n_tokens: int, asked: Asked, what: str
) -> None:
    """Raise MemoryLimitError, one line, when `estimate` exceeds `budget`: how much the run
    needs, how much is available, and what would fit. `what` names the run's texts
    ("this text", "a batch of 8 texts")."""
    allowed = budget()
    found = estimate(n_layers, n_heads, weights, n_tokens, asked)
    if _fits(found.total, allowed):
        return
    assert allowed is not None

    def needs(changed: Asked, tokens: int = n_tokens) -> int:
        return estimate(n_layers, n_heads, weights, tokens, changed).total

    kept = _kept(n_layers, asked)
    smaller = [  # what each option leaves out, where the run has it
        (name, change)
        for name, change, given in (
            ("--layer N", {"layers": (0,)}, kept > 1 and asked.command != "report"),
            ("no --html", {"html": False}, asked.html),
            ("--no-images", {"images": False}, asked.images and asked.command == "show"),
            ("--jobs 1", {"jobs": 1}, asked.images and asked.jobs > 1),
            ("--batch-size 1", {"batch": 1}, asked.batch > 1),
        )
        if given
    ]

    def with_all(options: Sequence[tuple[str, dict]]) -> Asked:
        return replace(asked, **{key: v for _, change in options for key, v in change.items()})

    ways: list[str] = []
    for size in range(1, len(smaller) + 1):  # the fewest options that make it fit
        for options in combinations(smaller, size):
            if _fits(needs(with_all(options)), allowed) and len(ways) < 2:
                names = " and ".join(name for name, _ in options)
                ways.append(f"{names} ({shown(needs(with_all(options)))})")
        if ways:
            break
    fitting = _longest_fitting(lambda tokens: _fits(needs(asked, tokens), allowed), n_tokens)
    if fitting:
        ways.append(f"a text of at most {fitting:,} tokens")
    elif smaller and not ways:
        every = with_all(smaller)
        fitting = _longest_fitting(lambda tokens: _fits(needs(every, tokens), allowed), n_tokens)
        if fitting:  # the options that count when all are taken (not --jobs 1 with no images)
            names = " and ".join(
                name
                for name, _ in smaller
                if needs(with_all([other for other in smaller if other[0] != name])) > needs(every)
            )
            ways.append(f"{names} on a text of at most {fitting:,} tokens")
    least = needs(with_all(smaller), 1)
    fix = (
        "it fits with " + "; or ".join(ways)
        if ways
        else f"nothing fits: the model alone needs about {shown(least)}"
    )
    where = _said(allowed)
    raise MemoryLimitError(
        f"{what} ({n_tokens:,} tokens, {kept} layer{'s' * (kept != 1)} × {n_heads} heads) needs "
        f"about {shown(found.total)} of memory and {where}; {fix}"
    )


# What a comparison in blocks pools for its figures: A's and B's maps and both sides' unit
# grids, within one text's budget of pooled cells (`pipelines.views.IMAGE_CELLS`, 64 Mi cells
# of float32), held and copied once as each result is made.
COMPARE_POOLED = 2 * 64 * 2**20 * FLOAT


def compare_in_blocks(n_layers: int, n_heads: int, pairs: Sequence[tuple[int, int]]) -> bool:
    """Whether a comparison that can be made in blocks (one model, the weights of tokens as
    read) is: a pair's maps, A's and B's of `n_layers` kept, would take over STREAM_ABOVE."""
    widest = max(a * a + b * b for a, b in pairs)
    return n_layers * n_heads * widest * FLOAT > STREAM_ABOVE


def check_in_blocks(n_heads: int, n_tokens: int, n_batch: int = 1) -> bool:
    """Whether `check` reads a layer in blocks of rows (where attnviz's function runs it):
    one layer's maps would take over CHECK_WHOLE_LAYER."""
    return n_batch * n_heads * n_tokens * n_tokens * FLOAT > CHECK_WHOLE_LAYER


def compare_estimate(n_layers: int, n_heads: int, weights: int,
                     pairs: Sequence[tuple[int, int]], in_blocks: bool,
                     eager: bool = False, two_passes: bool = False) -> Estimate:  # fmt: skip
    """The peak of `compare` over `pairs` of (A's, B's) tokens on `n_layers` kept × `n_heads`
    with `weights` bytes of models. In blocks (`analysis.compare_blocks`): the pooled maps,
    the pass's blocks of both texts and each side's float64 projections of them (32 blocks,
    as measured), each side's sums. Held whole: every pair's maps (float32) and unit grids
    (float64, both sides), and while one pair is compared its projection (L, H, T, U) and the
    divergence's temporaries (three grids more). A model running eager attention (`eager`)
    makes each layer's maps whole while it runs (EAGER_LAYER maps a head): in blocks, of both
    texts of a pair padded to the longer, beside the pooled maps; held whole, of the longest
    text, where it outgrows the comparison's temporaries. Two models in blocks (`two_passes`)
    run their passes at once, each in a thread of its own: each thread's heap keeps its own
    freed blocks."""
    lh = n_layers * n_heads
    longest = max(max(a, b) for a, b in pairs)
    layer = EAGER_LAYER * n_heads * longest * longest * FLOAT if eager else 0
    if in_blocks:
        sums = 2 * lh * longest * 8 * 3  # each side's HeadStats and the divergence, float64
        attention = COMPARE_POOLED + sums
        # A and B in one pass; the blocks' share measured: 8,085 tokens of SmolLM2 peaked at
        # 2.91 GiB (bench_lengths, 2026-12-02), about 32 blocks beside the pooled maps; two
        # models' passes at once 3.88 GiB (weights 0.5 GiB more): about 16 blocks more
        blocks = (48 if two_passes else 32) * STREAM_BLOCK + 2 * layer
        return Estimate(RUNTIME + weights + BLOCKS + attention + blocks, attention)
    held = sum(lh * FLOAT * (a * a + b * b) + 2 * lh * 8 * min(a, b) ** 2 for a, b in pairs)
    widest = max(pairs, key=lambda pair: pair[0] ** 2 + pair[1] ** 2)
    units = min(widest)
    transient = max(lh * 8 * (max(widest) * units + 3 * units * units), layer)
    return Estimate(RUNTIME + weights + BLOCKS + held + transient, held)


def check_estimate(n_heads: int, weights: int, n_tokens: int, in_blocks: bool) -> Estimate:
    """The peak of `check` over `n_tokens` on a model of `n_heads` with `weights` bytes. In
    blocks (`pipelines.check`): a block of rows on each side and our K, V and heads' outputs
    (float64). Whole: one layer's maps as eager attention makes them (scores and
    probabilities, float32), ours (float64) with its scores and softmax for one head, and
    their difference (float64)."""
    from attnviz.core.recording import BLOCK_ROWS

    grid = n_tokens * n_tokens
    if in_blocks:
        # ours and the model's rows, float64, and their temporaries: ten blocks (8,085 tokens
        # of SmolLM2 peaked at 2.11 GiB, bench_lengths 2026-12-02)
        blocks = 10 * BLOCK_ROWS * n_heads * n_tokens * 8
        return Estimate(RUNTIME + weights + BLOCKS + blocks, 0)
    layer = n_heads * grid * (2 * FLOAT + 8 + 2 * 8) + 3 * grid * 8
    # and about 256 MiB more, measured and not yet placed: 1,500 tokens of a 2-layer, 8-head
    # Llama peaked at 1.14 GiB against 0.89 counted without it (tests/test_memory_peaks.py),
    # 1,720 tokens of SmolLM2 at 2.1 GB against 1.85
    return Estimate(RUNTIME + weights + BLOCKS + layer + 256 * MiB, layer)


def generate_estimate(n_layers: int, n_heads: int, n_kv_heads: int, d_head: int, d_model: int,
                      weights: int, n_tokens: int) -> Estimate:  # fmt: skip
    """The peak of a decoder writing after a prompt, `n_tokens` in all, as `needle` runs it
    (`core.generation.greedy`): its KV cache (float32), the prompt's pass (SDPA, a few
    activations of (T, d_model) at once, GENERATE_ACTIVATIONS of them), and one row
    of every head a step; no map is held."""
    cache = n_layers * 2 * n_kv_heads * d_head * n_tokens * FLOAT
    activations = GENERATE_ACTIVATIONS * n_tokens * d_model * FLOAT
    rows = 2 * n_heads * n_tokens * FLOAT
    return Estimate(RUNTIME + weights + BLOCKS + cache + activations + rows, 0)


def refuse_estimate(found: Estimate, what: str, fix: str) -> None:
    """Raise MemoryLimitError, one line, where `found` exceeds `budget`: what needs how much,
    what is available, and `fix`."""
    allowed = budget()
    if _fits(found.total, allowed):
        return
    raise MemoryLimitError(
        f"{what} needs about {shown(found.total)} of memory and {_said(allowed)}; {fix}"
    )


def check_held(kept: int, n_layers: int, n_heads: int, n_tokens: int, to_file: bool,
               eager: bool = False) -> None:  # fmt: skip
    """Refuse, one line, the API's maps of `kept` layers × `n_heads` over `n_tokens` held
    whole (`pipelines.readers.hold`) where this process cannot hold them beside what it holds
    already (the model): the size, what is available, and the ways to ask for less (fewer
    layers, a file, a shorter text). With `to_file` only the blocks of rows are in memory,
    and the file's disk is checked where it is made (`core.held`); a model running eager
    attention (`eager`) also holds one layer's whole scores and probabilities while it runs.
    Called once the model has loaded, before it runs."""
    from attnviz.core.recording import BLOCK_ROWS

    allowed = _held_budget()
    if allowed is None:
        return
    rss = _own_rss()

    def needs(layers: int, tokens: int, in_memory: bool = True) -> int:
        grid = tokens * tokens * FLOAT
        blocks = 6 * BLOCK_ROWS * n_heads * tokens * FLOAT  # a block, its scores, copies
        if eager:  # the layer's maps, made whole by the model
            blocks += EAGER_LAYER * n_heads * grid
        return rss + BLOCKS + blocks + (layers * n_heads * grid if in_memory else 0)

    if needs(kept, n_tokens, not to_file) <= allowed:
        return
    held = kept * n_heads * n_tokens * n_tokens * FLOAT
    what = (
        f"the attention of {kept} layer{'s' * (kept != 1)} × {n_heads} heads over "
        f"{n_tokens:,} tokens"
    )
    if to_file:
        raise MemoryLimitError(
            f"{what}, written to a file, still needs blocks of rows beside the model: "
            f"{shown(needs(kept, n_tokens, False))} of memory and {_said(allowed, True)}; "
            "read a shorter text"
        )
    ways = []
    fitting_layers = max((k for k in range(1, kept) if needs(k, n_tokens) <= allowed), default=0)
    if fitting_layers:
        ways.append(f"layers=[…] with at most {fitting_layers} of the {n_layers} layers")
    ways.append(f"to='attention.npy' (a file of {held / 1e9:,.1f} GB, memory-mapped)")
    fitting = _longest_fitting(lambda tokens: needs(kept, tokens) <= allowed, n_tokens)
    if fitting:
        ways.append(f"a text of at most {fitting:,} tokens")
    raise MemoryLimitError(
        f"{what} take {shown(held)} held whole, and {_said(allowed, True)} beside what this "
        f"process holds ({shown(rss)}); ask for less: {'; or '.join(ways)} (attnviz show streams a "
        "long text's summary and figures)"
    )


def _held_budget() -> int | None:
    """What the API may hold: ATTNVIZ_MEMORY_LIMIT as set, else the memory available less a
    margin (a tenth, at most HELD_MARGIN) for what the rest of the machine does meanwhile."""
    allowed = budget()
    if allowed is None or os.environ.get(ENV, "").strip():
        return allowed
    return allowed - min(HELD_MARGIN, allowed // 10)


def _said(allowed: int, margin: bool = False) -> str:
    """How much memory a refusal says there is: the limit set, or what is available (less
    the API's margin, with `margin`)."""
    if os.environ.get(ENV, "").strip():
        return f"{ENV} is {shown(allowed)}"
    return f"{shown(allowed)} is available" + (" (less a margin)" if margin else "")


def held_bytes(shape: Sequence[int]) -> int:
    """Bytes of a float32 array of `shape`."""
    return FLOAT * prod(shape)


def held_what(shape: Sequence[int]) -> str:
    """`the attention of 30 layers × 9 heads over 8,085 tokens`, for a held (B, L, H, T, S)."""
    batch, layers, heads, width, _ = shape
    texts = f" for each of {batch} texts" if batch > 1 else ""
    return (
        f"the attention of {layers} layer{'s' * (layers != 1)} × {heads} "
        f"head{'s' * (heads != 1)} over {width:,} tokens{texts}"
    )


def tower_bytes(n_layers: int, n_heads: int, lengths: Sequence[int], block_rows: int) -> int:
    """What recording a vision-language model's vision tower holds (`analysis.tower`): per
    layer and head, two float64 sums a token of the tower (what it receives, CLS's row), and
    while a layer runs, one block of its rows of every sequence at once with the function's
    scores and the sums' temporaries (TOWER_BLOCK maps of the block, float32)."""
    longest = max(lengths)
    sums = n_layers * n_heads * sum(lengths) * 8 * 2
    block = TOWER_BLOCK * FLOAT * len(lengths) * n_heads * min(block_rows, longest) * longest
    return sums + block


def require(nbytes: int, what: str) -> None:
    """Refuse, one line, to make an array of `nbytes` that this process cannot hold next to
    what it holds already (the last check, where the run's estimate could not be made)."""
    allowed = budget()
    if allowed is None or _own_rss() + nbytes <= allowed:
        return
    raise MemoryLimitError(
        f"{what} needs {shown(nbytes)} and {shown(max(0, allowed - _own_rss()))} is "
        "available; keep fewer layers (--layer N, where the command takes it) or read a "
        "shorter text"
    )


def refuse(
    spec: ModelSpec | None,
    settings: Load,
    texts: Sequence[str],
    asked: Asked,
    truncate: bool = False,
    pair: str | None = None,
) -> None:
    """Refuse a run over `texts` that will not fit in memory, from the model's files alone
    (`spec`: its config, tokenizer.json and weight files) and how it loads (`settings`),
    before its weights load; `asked.batch` texts are read at once, in order. Nothing is
    refused where the files cannot tell (a model not on this machine, an encoder-decoder
    model): `require` checks those later. A model that will run eager attention (asked for,
    or a type whose attention bypasses transformers' interface) is counted so."""
    if spec is None or spec.seq2seq or spec.tokenizer_file is None or not texts:
        return
    asked = replace(asked, eager=settings.implementation == "eager" or spec.eager_only)
    lengths = spec.count_lengths([text if pair is None else (text, pair) for text in texts])
    if spec.max_tokens is not None:  # too long: skipped or refused, or cut (--truncate)
        limit = spec.max_tokens
        lengths = [min(n, limit) for n in lengths if truncate or n <= limit]
    if not lengths:
        return
    if asked.command == "report":  # it reads its texts in batches of like lengths
        lengths.sort(reverse=True)
    # a batch is as wide as its longest text; the one that needs the most decides
    batches = [lengths[i : i + asked.batch] for i in range(0, len(lengths), asked.batch)]
    asks = [(max(batch), replace(asked, batch=len(batch))) for batch in batches]
    width, widest = max(asks, key=lambda ask: estimate(spec.n_layers, spec.n_heads, 0, *ask).total)
    what = "this text" if len(texts) == 1 else f"a batch of {widest.batch} texts"
    try:
        check(spec.n_layers, spec.n_heads, settings.weights_held(spec), width, widest, what)
    except MemoryLimitError:
        from attnviz.core.settings import resolve_device

        # "auto" on a GPU loads the weights there: asked only now, as asking imports torch
        if settings.device != "auto" or resolve_device("auto") == "cpu":
            raise
        check(spec.n_layers, spec.n_heads, settings.weights_held(spec, True), width, widest, what)


def return_freed_memory() -> None:
    """Hand what the C allocator holds freed back to the system (glibc's `malloc_trim`): a
    pass's activations, freed, otherwise stay in this process's heap and in its RSS while what
    follows runs (at 512 tokens on the bundled model 23–48 MiB, in about 1 ms, when the
    figures are drawn). Elsewhere than glibc, nothing."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def reuse_freed_blocks() -> None:
    """Let the C allocator keep a streamed run's freed blocks for the next ones instead of
    handing each back to the system and faulting fresh pages in for the next (glibc hands
    blocks over 32 MiB straight back; a block of rows and its temporaries are tens of MiB,
    made and freed hundreds of times a layer). Blocks under 256 MiB then come from the heap,
    and the heap is trimmed once 512 MiB lie free at its top. Elsewhere than glibc, nothing."""
    libc = _glibc()
    if libc is None or os.environ.get("ATTNVIZ_NO_MALLOPT"):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    libc.mallopt(m_mmap_threshold, 256 * MiB)
    libc.mallopt(m_trim_threshold, 512 * MiB)


def _glibc() -> Any:
    """The C library where it is glibc (Linux), to tune its allocator; else None."""
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None
