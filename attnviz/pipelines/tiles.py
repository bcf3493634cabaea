"""`attnviz serve`'s tiles: the last text's per-layer X, kept, and the exact cells of any
rectangle of any head recomputed from it, a block of query rows at a time.

    Holder        the server's one held text (`Held`: X of every layer, its tokens, its id),
                  within a memory budget
    Keep          a consumer: the pass of /api/page or /api/attention hands its X over too
    read          a text read for tiles alone (/api/text): one pass that keeps X, no attention
    TileQuestion  a tile request, every field checked
    tile          the tile's values: exact cells, or blocks of cells pooled (mean or max)

A tile is query rows q0 … q1−1 and key columns k0 … k1−1 of one head of one layer, in the
model's tokens (no --words, no --hide-special), weights or norm. Its rows are recomputed by
`core.recompute` from the layer's X with that head's weights alone (`recompute.one_head`), the
formulas `attnviz.attention()` uses: a tile equals the same cells of the API's weights. Only
the tile's rows exist at a time, and over the rows' whole length of keys; the head's whole
matrix is never built.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError, NotHeldError
from attnviz.pipelines.consumers import Consumer, Run

if TYPE_CHECKING:
    import numpy as np
    import torch

    from attnviz.core.attention import Encoded
    from attnviz.core.models import LoadedModel, Model

# Cells a side of a tile answers: a larger range is answered in blocks of cells, pooled, or
# refused where no pooling is asked (512 × 512 cells are 1 MiB of float32, 5 MB of JSON).
TILE_SIDE = 512
# Bytes of X the server holds for tiles (serve --hold-mib): SmolLM2 at its 8,192 tokens
# holds 30 layers × 8,192 × 576 float32, 540 MiB.
HOLD_BYTES = 2**30
# Query rows recomputed at once: 256 rows of one head over 8,192 keys are 8 MiB of float32.
ROWS = 256
POOLS = ("mean", "max")
PER_HEAD = ("weights", "norm")  # the measures a tile can hold: those with heads


@dataclass(frozen=True, eq=False)
class Held:
    """One text's X at every layer, as the pass captured it: what its tiles are made of."""

    text_id: str
    encoded: Encoded
    x: tuple[torch.Tensor, ...]  # per layer: (1, T, d_model), the model's dtype
    causal: bool

    @property
    def n_tokens(self) -> int:
        return len(self.encoded)

    @property
    def bytes(self) -> int:
        return sum(x.numel() * x.element_size() for x in self.x)

    def summary(self) -> dict[str, Any]:
        """What the server holds, for answers and /api/health."""
        return {
            "text_id": self.text_id,
            "tokens": self.n_tokens,
            "layers": len(self.x),
            "bytes": self.bytes,
        }


def text_id(loaded: LoadedModel, encoded: Encoded) -> str:
    """A text's name for tiles: the model and the tokens it read (the same tokens give the
    same X, whatever the view asked)."""
    said = json.dumps([loaded.info.name, list(encoded.ids), encoded.segments])
    return hashlib.sha256(said.encode("utf-8")).hexdigest()[:16]


def x_bytes(loaded: LoadedModel, n_tokens: int) -> int:
    """What a text of `n_tokens` holds as X: layers × tokens × d_model in the model's dtype."""
    info = loaded.info
    return info.n_layers * n_tokens * info.d_model * loaded.model.dtype.itemsize


class Holder:
    """The one text whose X the server keeps (the last one read), and its budget in bytes.
    Used from the server's one model thread only."""

    def __init__(self, budget: int = HOLD_BYTES) -> None:
        self.budget = budget
        self.held: Held | None = None

    def refusal(self, loaded: LoadedModel, n_tokens: int) -> str | None:
        """Why a text of `n_tokens` cannot be held (None: it can)."""
        info = loaded.info
        if info.seq2seq:
            return one_stack(loaded)
        size = x_bytes(loaded, n_tokens)
        if size > self.budget:
            return (
                f"this text's X is {_mib(size)} ({info.n_layers} layers × {n_tokens} tokens × "
                f"{info.d_model} × {loaded.model.dtype.itemsize} B), over the {_mib(self.budget)} "
                "the server holds for tiles (serve --hold-mib)"
            )
        return None

    def let_go(self) -> None:
        """Drop the held text (before the next is read: one text's X at a time)."""
        self.held = None

    def keep(self, held: Held) -> None:
        self.held = held

    def get(self, wanted: str | None) -> Held:
        """The held text, if it is `wanted` (None: whichever is held)."""
        held = self.held
        if held is None:
            raise NotHeldError(
                "no text is held for tiles: read one first (POST /api/text, /api/page or "
                "/api/attention)"
            )
        if wanted is not None and wanted != held.text_id:
            raise NotHeldError(
                f'the server holds another text now ("{held.text_id}"), not "{wanted}": read '
                "this one again (POST /api/text) and ask again"
            )
        return held


def one_stack(loaded: LoadedModel) -> str:
    """Why an encoder-decoder model has no tiles."""
    return (
        f"tiles are for models with one attention stack; {loaded.info.name} is an "
        "encoder-decoder model"
    )


def _mib(size: int) -> str:
    """Bytes in MiB, to three significant digits below 1,000 (`4.5 MiB`, `540 MiB`)."""
    mib = size / 2**20
    return f"{mib:,.0f} MiB" if mib >= 1000 else f"{mib:.3g} MiB"


def _recorder(loaded: LoadedModel, found: dict[int, Any]) -> Any:
    """A capture recorder that puts each layer's X into `found`."""
    from attnviz.core.capture import Each

    def receive(layer: int, tensors: dict[str, Any]) -> None:
        found[layer] = tensors["input"]  # (1, T, d_model)

    return Each(range(loaded.info.n_layers), ("input",), receive)


def _held(loaded: LoadedModel, encoded: Encoded, found: dict[int, Any]) -> Held:
    x = tuple(found[layer] for layer in range(loaded.info.n_layers))
    return Held(text_id(loaded, encoded), encoded, x, loaded.info.causal)


class Keep(Consumer):
    """The run's pass hands each layer's X to `holder` too (the pass the page or the API
    needed anyway: no second one). `why` says why nothing was kept, where nothing was."""

    def __init__(self, request: Any, holder: Holder) -> None:
        super().__init__(request)
        self.holder = holder
        self.found: dict[int, Any] = {}
        self.why: str | None = None

    def recorders(self, run: Run) -> list[Any]:
        self.holder.let_go()
        if run.loaded.info.seq2seq:  # its encoded text is a source and a target
            self.why = one_stack(run.loaded)
            return []
        self.why = self.holder.refusal(run.loaded, len(run.encoded))
        return [] if self.why else [_recorder(run.loaded, self.found)]

    def finish(self, run: Run) -> None:
        if self.why is None:
            self.holder.keep(_held(run.loaded, run.encoded, self.found))

    def answer(self) -> dict[str, Any] | None:
        """What the answer says of the held text: its summary, or None (and `why`)."""
        held = self.holder.held
        return held.summary() if self.why is None and held is not None else None


# ---------- the requests ----------


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def checked(
    body: Any, keys: dict[str, str], fits: Any, required: dict[str, str], example: str
) -> dict:
    """A decoded JSON body's keys, each checked by `fits(key, value)`; refuses a body that is
    not an object (`example`: one that is), an unknown key, a missing one (`required`: what
    to give) and a wrong type (`keys`: what each takes), in one line."""
    if not isinstance(body, dict):
        raise InputError(f"the body must be a JSON object such as {example}")
    unknown = sorted(set(body) - set(keys))
    if unknown:
        raise InputError(f"unknown key {unknown[0]!r}: the keys are {', '.join(keys)}")
    for key, what in required.items():
        if key not in body:
            raise InputError(f'"{key}" is missing: give {what}')
    for key, value in body.items():
        if not fits(key, value):
            raise InputError(f'"{key}" must be {keys[key]}')
    return body


TEXT = {"text": "the sentence to read"}


def read(model: Model, holder: Holder, question: Any) -> dict[str, Any]:
    """Read the text of `question` (`pipelines.serve.Question`) for tiles: one pass that
    captures each layer's X and no attention (the model's own fast attention runs; nothing of
    size T × T is made), and hold it."""
    from attnviz.core import capture
    from attnviz.core.tokens import encode, pad
    from attnviz.pipelines import features

    loaded = model.load()
    features.refuse(question.request(model), loaded.info)
    encoded = encode(loaded, question.text, question.truncate, question.pair)
    holder.let_go()
    why = holder.refusal(loaded, len(encoded))
    if why:
        raise InputError(why)
    found: dict[int, Any] = {}
    capture.run(loaded, pad(loaded, [encoded]), [_recorder(loaded, found)])
    held = _held(loaded, encoded, found)
    holder.keep(held)
    return {
        "model": loaded.info.as_dict(),
        "text": encoded.text,
        "pair": encoded.pair,
        "tokens": list(encoded.tokens),
        "special": list(encoded.special),
        "segments": list(encoded.segments) if encoded.segments else None,
        "notes": list(encoded.notes),
        "tiles": held.summary(),
    }


TILE_KEYS = {
    "text_id": "a string (the text_id a read answered) or null",
    "layer": "a layer number",
    "head": "a head number",
    "q0": "a whole number (the first query row)",
    "q1": "a whole number (one past the last query row)",
    "k0": "a whole number (the first key column)",
    "k1": "a whole number (one past the last key column)",
    "measure": f"one of {', '.join(PER_HEAD)} (a tile is one head's)",
    "pool": f'"{POOLS[0]}", "{POOLS[1]}" or null',
    "packed": "true or false",
}
RANGES = ("q0", "q1", "k0", "k1")
LAYER_HEAD = {"layer": "the tile's layer", "head": "the tile's head"}


@dataclass(frozen=True)
class TileQuestion:
    """One tile: rows q0 … q1−1 and columns k0 … k1−1 (None: the text's end) of `head` of
    `layer`, `measure`'s values; `pool` pools a range longer than TILE_SIDE on a side
    (None: such a range is refused); `packed` sends the values as base64 float32."""

    layer: int
    head: int
    text_id: str | None = None
    q0: int = 0
    q1: int | None = None
    k0: int = 0
    k1: int | None = None
    measure: str = "weights"
    pool: str | None = None
    packed: bool = False

    @classmethod
    def of(cls, body: Any, loaded: LoadedModel | None = None) -> TileQuestion:
        """The tile a decoded JSON body asks for, every field checked (ranges against the
        text on `tile`); `loaded` checks the layer and head against the model."""
        from attnviz.analysis.contributions import get

        def fits(key: str, value: Any) -> bool:
            if key in ("layer", "head", *RANGES):
                return _whole(value)
            if key == "packed":
                return isinstance(value, bool)
            if key == "pool":
                return value is None or value in POOLS
            if key == "text_id":
                return value is None or isinstance(value, str)
            return isinstance(value, str)

        given = checked(body, TILE_KEYS, fits, LAYER_HEAD, '{"layer": 0, "head": 0}')
        question = cls(**given)
        measure = get(question.measure)
        if measure.per_layer:
            raise InputError(
                f"{measure.name} has one map per layer, no heads: a tile is one head's "
                f"({', '.join(PER_HEAD)})"
            )
        for key in RANGES:
            if (getattr(question, key) or 0) < 0:
                raise InputError(f'"{key}" must be 0 or more, not {getattr(question, key)}')
        for start, stop in (("q0", "q1"), ("k0", "k1")):
            first, last = getattr(question, start), getattr(question, stop)
            if last is not None and first >= last:
                raise InputError(
                    f'"{start}" must be less than "{stop}" (the tile holds {start} … {stop} − 1): '
                    f"{first} and {last}"
                )
        if loaded is not None:
            if loaded.info.seq2seq:
                raise InputError(one_stack(loaded))
            loaded.info.pick_layers([question.layer])
            loaded.info.pick_heads([question.head])
        return question

    def ranges(self, n_tokens: int) -> tuple[int, int, int, int]:
        """(q0, q1, k0, k1) in a text of `n_tokens`, refusing a tile outside its matrix."""
        q0, q1, k0, k1 = (
            self.q0,
            n_tokens if self.q1 is None else self.q1,
            self.k0,
            n_tokens if self.k1 is None else self.k1,
        )
        for key, value in zip(RANGES, (q0, q1, k0, k1), strict=True):
            end = key.endswith("1")
            if value > n_tokens or (not end and value >= n_tokens):
                raise InputError(
                    f'the tile is outside the matrix: "{key}" is {value} and this text has '
                    f"{n_tokens} tokens (queries and keys 0–{n_tokens - 1})"
                )
        return q0, q1, k0, k1


def blocks_of(q0: int, q1: int, k0: int, k1: int) -> tuple[int, int]:
    """The block of cells each answered cell pools, (rows, columns): 1 × 1 while a side
    fits TILE_SIDE, else as few as bring it within."""
    return math.ceil((q1 - q0) / TILE_SIDE), math.ceil((k1 - k0) / TILE_SIDE)


def visible_counts(
    start: int, stop: int, k0: int, k1: int, columns: int, causal: bool, window: int | None
) -> torch.Tensor:
    """How many keys of each block of `columns` key columns (k0 … k1−1, the last block what is
    left) each query start … stop−1 sees: not after it (causal), not past its sliding window;
    (stop − start, ceil((k1 − k0) / columns))."""
    import torch

    query = torch.arange(start, stop)[:, None]  # (r, 1)
    first = torch.arange(k0, k1, columns)[None, :]  # (1, N): each block's first key
    high = (first + columns).clamp(max=k1)  # one past each block's last key
    low = first
    if causal:
        high = torch.minimum(high, query + 1)
    if window is not None:
        low = torch.maximum(low, query - window + 1)
    return (high - low).clamp(min=0).expand(stop - start, -1)  # (r, N)


def pool(values: torch.Tensor, counts: torch.Tensor, block: tuple[int, int], how: str):
    """Cells (r, n) pooled in blocks of (rows, columns) cells, the last block of each side what
    is left: each block's mean or max over the cells its queries see, NaN where they see none
    (`counts`: each row's visible cells per block of columns, (r, N)). A cell a query cannot
    see is 0 (its probability), so it adds nothing to a block's sum or, values being ≥ 0,
    to its max; (ceil(r / rows), N)."""
    import torch

    rows, columns = block
    r, n = values.shape
    out_r, out_n = -(-r // rows), -(-n // columns)
    grid, seen = values, counts
    if (r, n) != (out_r * rows, out_n * columns):  # the last blocks, filled up with 0
        grid = torch.nn.functional.pad(values, (0, out_n * columns - n, 0, out_r * rows - r))
        seen = torch.nn.functional.pad(counts, (0, 0, 0, out_r * rows - r))
    grid = grid.reshape(out_r, rows, out_n, columns)  # (R, rows, N, columns)
    seen = seen.reshape(out_r, rows, out_n).sum(dim=1)  # (R, N)
    if how == "mean":
        found = grid.sum(dim=(1, 3)) / seen
    else:
        found = grid.amax(dim=(1, 3))
    return found.masked_fill(seen == 0, float("nan"))


def tile(model: Model, holder: Holder, question: TileQuestion) -> dict[str, Any]:
    """The tile's values from the held text's X (see the module's docstring), as JSON-ready
    values: exact cells, or (a side longer than TILE_SIDE, with `pool`) blocks of cells."""
    import torch

    from attnviz.analysis.contributions import MEASURES

    loaded = model.load()
    held = holder.get(question.text_id)
    q0, q1, k0, k1 = question.ranges(held.n_tokens)
    block = blocks_of(q0, q1, k0, k1)
    if block != (1, 1) and question.pool is None:
        raise InputError(
            f"a tile of {q1 - q0} × {k1 - k0} cells is over {TILE_SIDE} × {TILE_SIDE}: pass "
            f'"pool": "mean" or "max" (blocks of cells), or ask a smaller range'
        )
    with torch.inference_mode():
        values = _cells(loaded, held, question, (q0, q1, k0, k1), block)
    found = values.numpy()
    measure = MEASURES[question.measure]
    return {
        "text_id": held.text_id,
        "layer": question.layer,
        "head": question.head,
        "measure": measure.name,
        "unit": measure.unit,
        "q0": q0,
        "q1": q1,
        "k0": k0,
        "k1": k1,
        "pool": question.pool if block != (1, 1) else None,
        "block": list(block),
        "shape": list(found.shape),
        "causal": held.causal,
        "packed": question.packed,
        "values": _values(found, question.packed),
    }


def _cells(
    loaded: LoadedModel,
    held: Held,
    question: TileQuestion,
    ranges: tuple[int, int, int, int],
    block: tuple[int, int],
) -> torch.Tensor:
    """The tile's cells (exact, or pooled in `block`s), a few blocks of query rows at a time
    over all the keys they see; float32."""
    import torch

    from attnviz.analysis.contributions import value_vectors
    from attnviz.core import adapters, recompute

    q0, q1, k0, k1 = ranges
    n = held.n_tokens
    weights = adapters.layer_weights(loaded.model, question.layer)
    one = recompute.one_head(weights, question.head)
    x = held.x[question.layer]  # (1, T, d_model)
    key_mask = torch.ones(1, n, dtype=torch.long)  # one text, no padding: as the API reads it
    layer = recompute.project(x, one, key_mask, held.causal)
    lengths = None
    if question.measure == "norm":  # ‖α f(x_j)‖ = α ‖f(x_j)‖, the tile's keys
        lengths = value_vectors(x[:, k0:k1].float(), one).norm(dim=-1)[0, 0]  # (k1 − k0,)
    rows, columns = block
    step = rows * max(1, ROWS // rows)  # whole blocks of rows at a time
    parts = []
    for start in range(q0, q1, step):
        stop = min(start + step, q1)
        # A causal query sees no key after it: these rows' softmax is over keys 0 … stop−1.
        seen = stop if held.causal else n
        some = replace(layer, k=layer.k[..., :seen, :], key_mask=key_mask[:, :seen])
        found = recompute.probability_rows(some, start, stop)[0, 0]  # (r, seen)
        cells = found[:, k0:k1]
        if seen < k1:  # the keys after the rows' last query: 0
            cells = torch.nn.functional.pad(cells, (0, k1 - k0 - cells.shape[1]))
        if lengths is not None:
            cells = cells * lengths
        if block == (1, 1):
            parts.append(cells)
            continue
        counts = visible_counts(start, stop, k0, k1, columns, held.causal, one.window)
        parts.append(pool(cells, counts, block, question.pool))
    return torch.cat(parts)


def _values(found: np.ndarray, packed: bool) -> Any:
    """The values as nested rows (a block with no visible cell: null), or packed: base64 of
    little-endian float32, row-major (NaN for such a block)."""
    if packed:
        return base64.b64encode(found.astype("<f4").tobytes()).decode("ascii")
    return [[None if v != v else v for v in row] for row in found.tolist()]
