"""`attnviz serve`'s tiles: the last text's per-layer queries and keys, kept as the model
handed them to its attention, and the exact cells of any rectangle of any head made from them,
a block of query rows at a time.

    Holder        the server's one held text (`Held`: every layer's q and k, its tokens, its
                  id), within a memory budget
    Keep          a consumer: the pass of /api/page or /api/attention hands its q and k over
    read          a text read for tiles alone (/api/text): one pass that keeps q and k, no
                  attention
    TileQuestion  a tile request, every field checked
    tile          the tile's values: exact cells, or blocks of cells pooled (mean or max)

A tile is query rows q0 … q1−1 and key columns k0 … k1−1 of one head of one layer, in the
model's tokens (no --words, no --hide-special), weights or norm. Its rows are made by
`core.recording.Scores.rows` from that head's q and its key head's k (`Scores.head`), what
attnviz's attention function made the API's weights with: a tile equals the same cells of the
API's weights. Only the tile's rows exist at a time, over the rows' whole length of keys; the
head's whole matrix is never built. The norm measure's ‖f(x_j)‖ per head and key is kept
beside them where attnviz's adapter reads the model's W_V and W_O.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError, NotHeldError
from attnviz.pipelines.consumers import Consumer, Run

if TYPE_CHECKING:
    import numpy as np
    import torch

    from attnviz.core.attention import Encoded
    from attnviz.core.model_info import LoadedModel
    from attnviz.core.models import Model
    from attnviz.core.recording import Scores

# Cells a side of a tile answers: a larger range is answered in blocks of cells, pooled, or
# refused where no pooling is asked (512 × 512 cells are 1 MiB of float32, 5 MB of JSON).
TILE_SIDE = 512
# Bytes of q and k the server holds for tiles (serve --hold-mib): SmolLM2 at its 8,192 tokens
# holds 30 layers × 8,192 × (9 + 3) heads × 64 float32, 720 MiB.
HOLD_BYTES = 2**30
# Query rows made at once: 256 rows of one head over 8,192 keys are 8 MiB of float32.
ROWS = 256
POOLS = ("mean", "max")
PER_HEAD = ("weights", "norm")  # the measures a tile can hold: those with heads


@dataclass(frozen=True, eq=False)
class Held:
    """One text's queries and keys at every layer, as the model handed them to its attention:
    what its tiles are made of."""

    text_id: str
    encoded: Encoded
    scores: tuple[Scores, ...]  # per layer: q (1, H, T, d) and k (1, H_kv, T, d), its mask
    lengths: tuple[torch.Tensor, ...] | None  # per layer: ‖f^h(x_j)‖ (H, T); None: no norm
    causal: bool

    @property
    def n_tokens(self) -> int:
        return len(self.encoded)

    @property
    def bytes(self) -> int:
        tensors = [t for s in self.scores for t in (s.query, s.key, s.mask) if t is not None]
        tensors += list(self.lengths or ())
        # layers of one kind share their mask (a sliding window's): each tensor counted once
        once = {id(t): t for t in tensors}.values()
        return sum(t.numel() * t.element_size() for t in once)

    def summary(self) -> dict[str, Any]:
        """What the server holds, for answers and /api/health."""
        return {
            "text_id": self.text_id,
            "tokens": self.n_tokens,
            "layers": len(self.scores),
            "bytes": self.bytes,
        }


def text_id(loaded: LoadedModel, encoded: Encoded) -> str:
    """A text's name for tiles: the model and the tokens it read (the same tokens give the
    same q and k, whatever the view asked)."""
    said = json.dumps([loaded.info.name, list(encoded.ids), encoded.segments])
    return hashlib.sha256(said.encode("utf-8")).hexdigest()[:16]


def held_bytes(loaded: LoadedModel, n_tokens: int) -> int:
    """What a text of `n_tokens` holds: layers × tokens × (query and key heads) × d_head in the
    model's dtype, and the norm's float32 lengths, one a head and token, where it has them."""
    info = loaded.info
    per_token = _heads(info) * info.d_head * loaded.model.dtype.itemsize
    if _norms(loaded):
        per_token += info.n_heads * 4
    return info.n_layers * n_tokens * per_token


def _heads(info: Any) -> int:
    return info.n_heads + (info.n_kv_heads or info.n_heads)


def _norms(loaded: LoadedModel) -> bool:
    """Whether tiles keep the norm measure's lengths: attnviz reads each head's values and
    W_O (`contributions.values_of`; the answer is kept on the model)."""
    found = getattr(loaded.model, "_attnviz_tile_norms", None)
    if found is None:
        from attnviz.analysis.contributions import values_of

        found = loaded.model._attnviz_tile_norms = values_of(loaded) is not None
    return found


class Holder:
    """The one text whose q and k the server keeps (the last one read), and its budget in bytes.
    Used from the server's one model thread only."""

    def __init__(self, budget: int = HOLD_BYTES) -> None:
        self.budget = budget
        self.held: Held | None = None

    def refusal(self, loaded: LoadedModel, n_tokens: int) -> str | None:
        """Why a text of `n_tokens` cannot be held (None: it can)."""
        from attnviz.core.capture import records

        info = loaded.info
        if info.seq2seq:
            return one_stack(loaded)
        if not records(loaded.model):
            return (
                "tiles are made from the queries and keys attnviz's attention function keeps; "
                f"'{info.model_type}' runs eager attention here, which hands out each layer's "
                "maps alone (docs/models.md)"
            )
        size = held_bytes(loaded, n_tokens)
        if size > self.budget:
            return (
                f"this text's queries and keys are {_mib(size)} ({info.n_layers} layers × "
                f"{n_tokens} tokens × {_heads(info)} heads × {info.d_head} × "
                f"{loaded.model.dtype.itemsize} B), over the {_mib(self.budget)} the server "
                "holds for tiles (serve --hold-mib)"
            )
        return None

    def let_go(self) -> None:
        """Drop the held text (before the next is read: one text's q and k at a time)."""
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
    """A capture recorder that puts each layer's (Scores, lengths or None) into `found`: the
    lengths ‖f^h(x_j)‖ (H, T) where attnviz reads each head's values and W_O
    (`contributions.Values`); the values themselves are not kept."""
    from attnviz.analysis.contributions import values_of
    from attnviz.core.capture import Each

    values = values_of(loaded) if _norms(loaded) else None

    def receive(layer: int, tensors: dict[str, Any]) -> None:
        lengths = values.of(layer, tensors)[0] if values is not None else None
        found[layer] = (tensors["scores"], lengths)

    kinds = ("scores", values.kind) if values is not None else ("scores",)
    return Each(range(loaded.info.n_layers), kinds, receive)


def _held(loaded: LoadedModel, encoded: Encoded, found: dict[int, Any]) -> Held:
    layers = [found[layer] for layer in range(loaded.info.n_layers)]
    lengths = tuple(got[1] for got in layers) if _norms(loaded) else None
    scores = tuple(got[0] for got in layers)
    return Held(text_id(loaded, encoded), encoded, scores, lengths, loaded.info.causal)


class Keep(Consumer):
    """The run's pass hands each layer's q and k to `holder` too (the pass the page or the
    API needed anyway: no second one). `why` says why nothing was kept, where nothing was."""

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
        if run.request.continues:  # its pass kept q and k of the prompt alone
            self.why = "a text with a continuation (generate, target) is not held for tiles"
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
    keeps each layer's q and k and no attention (the model's own fast attention runs; nothing
    of size T × T is made), and hold it."""
    from attnviz.core import capture
    from attnviz.core.tokens import encode, pad
    from attnviz.pipelines import checks

    loaded = model.load()
    checks.against(question.request(model), loaded.info)
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


def visible_counts(sees: torch.Tensor, k0: int, k1: int, columns: int) -> torch.Tensor:
    """How many keys of each block of `columns` key columns (k0 … k1−1, the last block what is
    left) each query sees, from `sees` (r, S) (True: the query sees the key):
    (r, ceil((k1 − k0) / columns))."""
    import torch

    seen = sees[:, k0:k1].float()
    n = seen.shape[1]
    blocks = -(-n // columns)
    seen = torch.nn.functional.pad(seen, (0, blocks * columns - n))
    return seen.reshape(seen.shape[0], blocks, columns).sum(dim=-1)


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
    """The tile's values from the held text's q and k (see the module's docstring), as JSON-ready
    values: exact cells, or (a side longer than TILE_SIDE, with `pool`) blocks of cells."""
    import torch

    from attnviz.analysis.contributions import MEASURES

    loaded = model.load()
    held = holder.get(question.text_id)
    if question.measure == "norm" and held.lengths is None:
        raise InputError(
            "norm tiles need each head's W_V and W_O, which attnviz reads through its adapters; "
            f"'{loaded.info.model_type}' has none (docs/models.md): ask for weights"
        )
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

    q0, q1, k0, k1 = ranges
    n = held.n_tokens
    layer = held.scores[question.layer].head(question.head)
    lengths = None
    if question.measure == "norm":  # ‖α f(x_j)‖ = α ‖f(x_j)‖, the tile's keys
        lengths = held.lengths[question.layer][question.head, k0:k1]  # (k1 − k0,)
    rows, columns = block
    step = rows * max(1, ROWS // rows)  # whole blocks of rows at a time
    parts = []
    for start in range(q0, q1, step):
        stop = min(start + step, q1)
        found = layer.rows(start, stop)[0][0, 0]  # (r, W): a causal block stops at `stop`
        cells = found[:, k0:k1]
        if found.shape[1] < k1:  # the keys after the rows' last query: 0
            cells = torch.nn.functional.pad(cells, (0, k1 - k0 - cells.shape[1]))
        if lengths is not None:
            cells = cells * lengths
        if block == (1, 1):
            parts.append(cells)
            continue
        counts = visible_counts(layer.sees(start, stop, n)[0, 0], k0, k1, columns)
        parts.append(pool(cells, counts, block, question.pool))
    return torch.cat(parts)


def _values(found: np.ndarray, packed: bool) -> Any:
    """The values as nested rows (a block with no visible cell: null), or packed: base64 of
    little-endian float32, row-major (NaN for such a block)."""
    if packed:
        return base64.b64encode(found.astype("<f4").tobytes()).decode("ascii")
    return [[None if v != v else v for v in row] for row in found.tolist()]
