"""What a vision-language model's vision tower does over its picture, read in the run's one
pass: per layer and head, what its tokens attend to over the picture, and the numbers a
vision transformer's heads get (`analysis.vision`: sink, local, mean attention distance,
a role).

The tower's layers run attnviz's attention function in the pass that runs the tower (the
prompt's: generation's later steps do not run it again), and `TowerRecorder` sums each
block of rows as it comes, a sequence of the tower at a time (`core.layouts.Tower`: one a
batch row, Idefics3's sub-images; a layer run in several calls, Qwen2.5-VL's windows, one
call after the other over its sequence): no layer's whole matrix is held. Per head it keeps

- what each token receives, summed over its sequence's queries (divided by their number
  once every row is in: the mean received attention, each sequence's summing to 1);
- CLS's row, where the tower has a CLS token (CLIP's);
- over the patches as queries, as `vision.patch_sums` does for a vision transformer: the
  share on the tokens outside the grid (CLS), on the own patch and its 8 neighbours, and
  the attention distance in pixels of the picture as the tower read it (each row
  renormalised over the patch keys), between patch centres.

A head's drawn map (`TowerView.maps`) is CLS's row where there is a CLS, else the mean
received attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analysis.vision import VisionHead, role_of, uniform_distance

if TYPE_CHECKING:
    from attnviz.core.layouts import Tower

TOP_K = 3  # CLS's top patches a head names


class TowerRecorder:
    """A capture recorder of the vision tower's layers (`capture.VISION`), in blocks of rows
    (`capture.ROWS`) and call by call (`calls`). Where the rows the tower hands do not fit
    its map (`tower`), `unread` says how, and no view is made."""

    calls = True  # a layer run in several calls (windows) is read call by call

    def __init__(self, tower: Tower, n_layers: int, stack: str) -> None:
        from attnviz.core.capture import ROWS

        self.tower, self.stack = tower, stack
        self.wants = {layer: (ROWS,) for layer in range(n_layers)}
        self.places = tower.places()  # (N, 2): each token's cell, -1 outside a drawn grid
        self.starts = tower.starts()
        self.drawn = set(tower.sequences())
        self.unread: str | None = None
        self._sums: dict[int, dict[str, Any]] = {}  # layer: its running sums
        self._at: dict[int, list[int]] = {}  # layer: [its call, that call's first, its width]

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        pass  # the rows alone, in `receive_rows`

    def receive_rows(self, layer: int, start: int, rows: Any, call: int = 0) -> None:
        """Rows start … start+b−1 of every head, (B, H, b, W), of `layer`'s call `call`:
        each batch row a sequence of the tower (or the one sequence, of which a call is a
        window), summed into the layer's sums."""
        batch, n_heads, _, width = rows.shape
        if self.unread is not None:
            return
        if batch != len(self.tower.lengths):
            self.unread = (f"the tower read {batch} sequence(s), and its map has "
                           f"{len(self.tower.lengths)}")  # fmt: skip
            return
        at = self._at.setdefault(layer, [call, 0, width])
        if call != at[0]:  # a later call: its tokens follow the last call's
            at[:] = [call, at[1] + at[2], width]
        sums = self._sums.get(layer)
        if sums is None:
            sums = self._sums[layer] = _empty(n_heads, len(self.places))
        for row in range(batch):
            first = at[1]
            if first + width > self.tower.lengths[row]:
                self.unread = (f"the tower's layer {layer} read more tokens than the "
                               f"{self.tower.lengths[row]} its map has")  # fmt: skip
                return
            if row in self.drawn:
                base = self.starts[row] + first
                _add(sums, rows[row], base + start, base, self.places, self.tower)

    def view(self) -> TowerView:
        """The tower's heads over the picture, once the pass is over."""
        import numpy as np

        tower, layers = self.tower, sorted(self._sums)
        if len(layers) != len(self.wants):
            raise ValueError("the tower's recorder has not had every layer")
        maps, heads = [], []
        marks = list(tower.layout.marks)
        uniform = _uniform(tower)
        for layer in layers:
            sums = {key: value.numpy() if hasattr(value, "numpy") else value
                    for key, value in self._sums[layer].items()}  # fmt: skip
            received = sums["received"].copy()  # (H, N)
            for row in self.drawn:
                start, n = self.starts[row], tower.lengths[row]
                received[:, start : start + n] /= n
            shown = sums["cls"] if marks else received
            maps.append(shown.astype(np.float32))
            count = max(int(sums["count"]), 1)
            sink, local, reach = sums["sink"] / count, sums["local"] / count, sums["reach"] / count
            for head in range(shown.shape[0]):
                role = role_of(sink[head], local[head], reach[head], uniform)
                heads.append(VisionHead(layer, head, role, *_cls_view(tower, shown[head], marks),
                                        float(sink[head]), float(local[head]),
                                        float(reach[head])))  # fmt: skip
        return TowerView(tower, np.stack(maps), tuple(heads), bool(marks), uniform)


def _empty(n_heads: int, n_tokens: int) -> dict[str, Any]:
    """A layer's sums, float64, before any row."""
    import torch

    zeros = torch.zeros
    return {"received": zeros(n_heads, n_tokens, dtype=torch.float64),
            "cls": zeros(n_heads, n_tokens, dtype=torch.float64),
            "sink": zeros(n_heads, dtype=torch.float64),
            "local": zeros(n_heads, dtype=torch.float64),
            "reach": zeros(n_heads, dtype=torch.float64), "count": 0}  # fmt: skip


def _add(sums: dict[str, Any], probs: Any, first_query: int, first_key: int, places: Any,
         tower: Tower) -> None:  # fmt: skip
    """Add one block of one sequence, `probs` (H, b, W) float32: queries first_query …,
    keys first_key … (tokens of the tower), to a layer's sums. The patches' numbers are
    products of the block with (b, W) weights that are 0 at the keys outside the grid: no
    copy of the block is made but the rows of the patches, where a query of the block is
    none (CLS)."""
    import torch

    n_heads, b, width = probs.shape
    keys = slice(first_key, first_key + width)
    sums["received"][:, keys] += probs.sum(dim=1).double()  # b ≤ a block's rows: float32 sums
    for mark in tower.layout.marks:  # CLS's row, where it is among these queries
        if first_query <= mark < first_query + b:
            sums["cls"][:, keys] = probs[:, mark - first_query].double()
    at_q = torch.from_numpy(places[first_query : first_query + b]).float()  # (b, 2)
    at_k = torch.from_numpy(places[keys]).float()  # (W, 2)
    patch_q, patch_k = at_q[:, 0] >= 0, (at_k[:, 0] >= 0).float()
    if not bool(patch_q.any()):
        return
    rows = probs if bool(patch_q.all()) else probs[:, patch_q]  # (H, q, W): the patches' rows
    down = at_q[patch_q, 0, None] - at_k[None, :, 0]  # (q, W): rows apart
    across = at_q[patch_q, 1, None] - at_k[None, :, 1]
    near = ((down.abs() <= 1) & (across.abs() <= 1)).float() * patch_k  # own and 8 around
    far = torch.hypot(down, across).mul_(tower.patch * patch_k)  # (q, W) pixels
    # as matrix-vector products where they can be: a pass over the block each, not a
    # broadcast product and a sum (several times slower on a CPU)
    total = rows @ patch_k  # (H, q): each row's share on the patches
    sums["sink"] += (rows @ torch.ones(width) - total).sum(dim=1).double()
    sums["local"] += (rows.reshape(n_heads, -1) @ near.reshape(-1)).double()
    reach = torch.einsum("hqk,qk->hq", rows, far).double()  # (H, q)
    total = total.double()
    sums["reach"] += torch.where(total > 0, reach / total.clamp_min(1e-300), 0.0).sum(dim=1)
    sums["count"] += int(patch_q.sum())


def _uniform(tower: Tower) -> float:
    """The mean attention distance, in pixels, of a head attending to every patch of its
    grid alike: each drawn part's, weighted by its patches."""
    found = [(uniform_distance(part.grid, tower.patch), len(part.tokens))
             for part in tower.layout.parts]  # fmt: skip
    return sum(d * n for d, n in found) / sum(n for _, n in found)


def _cls_view(tower: Tower, row: Any, marks: list[int]) -> tuple[float | None, tuple, tuple]:
    """One head's CLS row (over every token of the tower) of its first sequence (the whole
    picture's, where the tower reads tiles after it): its entropy over that sequence, its
    share on CLS and its TOP_K patches, by label; (None, (), ()) without a CLS."""
    import numpy as np

    from attnviz.analysis.vision import cls_numbers

    if not marks:
        return None, (), ()
    part = tower.layout.parts[0]  # the first sequence's (the whole picture's)
    start = marks[0]
    seen = row[start : part.tokens[0] + len(part.tokens)]  # its sequence: CLS, then patches
    entropy, outside = cls_numbers(seen[None], part.tokens[0] - start)
    cells = np.asarray(row)[list(part.tokens)]
    order = np.argsort(-cells, kind="stable")[:TOP_K]
    cols = part.grid[1]
    top = tuple((part.label(*divmod(int(i), cols)), float(cells[i])) for i in order)
    return float(entropy[0]), (("CLS", float(outside[0].sum())),), top


@dataclass(frozen=True, eq=False)
class TowerView:
    """The vision tower's heads over the picture, from the run's one pass."""

    tower: Tower  # where its tokens sit on the picture
    maps: Any  # (L, H, N) float32: CLS's row (`cls`), else each token's mean received attention
    heads: tuple[VisionHead, ...]  # layer by layer, head by head
    cls: bool  # the maps are CLS's rows
    uniform: float  # pixels: uniform attention's mean distance over the grid

    @property
    def n_layers(self) -> int:
        return int(self.maps.shape[0])

    def layer(self, layer: int) -> list[VisionHead]:
        """Layer `layer`'s heads."""
        return [head for head in self.heads if head.layer == layer]

    def as_dict(self) -> dict[str, Any]:
        layout = self.tower.layout
        return {
            "drawn": "cls" if self.cls else "received",
            "layers": self.n_layers,
            "patch": self.tower.patch,
            "sequences": list(self.tower.lengths),
            "parts": [
                {
                    "name": part.name,
                    "grid": list(part.grid),
                    "box": list(part.box),
                    "tokens": list(part.tokens),  # each cell's tower token, row by row
                }
                for part in layout.parts
            ],
            "marks": list(layout.marks),  # the tower's tokens outside the grid (CLS)
            "uniform_distance_px": round(self.uniform, 4),
            "heads": [head.as_dict() for head in self.heads],
        }
