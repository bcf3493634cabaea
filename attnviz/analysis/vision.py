"""What a vision transformer's heads do on one picture: where CLS looks, how far the patches
look (mean attention distance, Dosovitskiy et al. 2021, Fig. 7), and a role per head.

Roles, tried in this order (the thresholds are ROLE_SHARE):
- sink:   the patches give, on average, at least half their attention to the tokens outside the
          grid (CLS, DeiT's distillation token, registers: the artifacts registers absorb,
          Darcet et al. 2024);
- local:  the patches give at least half their attention to their own patch and its 8
          neighbours;
- global: the patches' mean attention distance is at least GLOBAL_REACH of what it would be
          if each patch attended to every patch alike;
- mixed:  none of these.
Mean attention distance is over the patches as queries and keys, each row renormalised over
the patch keys (a sink's attention to CLS moves nothing across the picture), in pixels of the
picture as the model saw it, between patch centres.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnviz.core.attention import Attention

ROLE_SHARE = 0.5
GLOBAL_REACH = 0.75
ROLES = ("sink", "local", "global", "mixed")
# Each role's colour in figures and style in the terminal (the text roles' are in `roles`).
ROLE_LOOKS = {"sink": ("#7f7f7f", "dim"), "local": ("#2ca02c", "green"),
              "global": ("#ff7f0e", "bold #ff8700"), "mixed": ("#1f77b4", "blue")}  # fmt: skip


@dataclass(frozen=True)
class VisionHead:
    """One head on one picture."""

    layer: int
    head: int
    role: str
    cls_entropy: float | None  # nats, of CLS's row (None: no CLS token)
    cls_outside: tuple[tuple[str, float], ...]  # CLS's shares on CLS, dist, registers
    cls_top: tuple[tuple[str, float], ...]  # CLS's top patches
    sink: float  # the patches' mean share on the tokens outside the grid
    local: float  # the patches' mean share on their own patch and its 8 neighbours
    distance: float  # mean attention distance, pixels

    def as_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "head": self.head,
            "role": self.role,
            "cls_entropy": None if self.cls_entropy is None else round(self.cls_entropy, 6),
            "cls_outside": {label: round(share, 6) for label, share in self.cls_outside},
            "cls_top": [[label, round(share, 6)] for label, share in self.cls_top],
            "sink": round(self.sink, 6),
            "local": round(self.local, 6),
            "mean_distance_px": round(self.distance, 4),
        }


def distances(picture: Any) -> Any:
    """(P, P) pixels between the centres of every two patches of `picture`'s grid."""
    return _geometry(picture.grid, picture.patch)[0]


def neighbourhood(picture: Any) -> Any:
    """(P, P) bool: key patch within one row and one column of the query patch."""
    return _geometry(picture.grid, picture.patch)[1]


@functools.lru_cache(maxsize=8)
def _geometry(grid: tuple[int, int], patch: int) -> tuple[Any, Any]:
    """A grid's (P, P) distances in pixels and neighbourhood, made once per grid (a folder's
    pictures share one)."""
    import numpy as np

    rows, cols = grid
    r, c = np.divmod(np.arange(rows * cols), cols)
    dr, dc = r[:, None] - r[None, :], c[:, None] - c[None, :]
    return np.hypot(dr, dc) * patch, (np.abs(dr) <= 1) & (np.abs(dc) <= 1)


def uniform_distance(grid: tuple[int, int], patch: int) -> float:
    """The mean distance in pixels between the centres of two patches of a grid (every
    pair, a patch and itself too), counted by offsets, not pairs: what `distances`'
    mean is, without its (P, P) matrix."""
    import numpy as np

    rows, cols = grid
    down, across = np.arange(-rows + 1, rows), np.arange(-cols + 1, cols)
    pairs = (rows - np.abs(down))[:, None] * (cols - np.abs(across))[None, :]  # each offset's
    far = np.hypot(down[:, None], across[None, :]) * patch
    return float((pairs * far).sum() / (rows * cols) ** 2)


# What `patch_sums` sums over the patches as queries, in its order.
PATCH_SUMS = ("sink", "local", "distance")


def patch_sums(rows: Any, start: int, picture: Any) -> Any:
    """(3, H) float64: over the patch queries among `rows` (H, b, T), the rows of queries
    start … start+b−1 of one picture, each head's sums of PATCH_SUMS: the share on the tokens
    outside the grid, the share on the own patch and its 8 neighbours, and the attention
    distance in pixels (each row renormalised over the patch keys). Divided by the number of
    patches once every row is in, they are the means `vision_heads` reports."""
    import numpy as np

    first, n = picture.first, picture.grid[0] * picture.grid[1]
    low, high = max(start, first), min(start + rows.shape[1], first + n)
    if low >= high:
        return np.zeros((3, rows.shape[0]))
    block = rows[:, low - start : high - start].astype(np.float64)  # (H, q, T)
    keys = block[..., first : first + n]  # (H, q, P): the patch keys
    total = keys.sum(-1, keepdims=True)
    shares = keys / np.where(total > 0, total, 1.0)  # rows renormalised over the patches
    far, near = _geometry(picture.grid, picture.patch)
    queries = slice(low - first, high - first)  # (q,): these queries' patch indices
    sink = block[..., :first].sum((-1, -2))
    local = (keys * near[queries]).sum((-1, -2))
    distance = (shares * far[queries]).sum((-1, -2))
    return np.stack([sink, local, distance])


def cls_numbers(cls_rows: Any, first: int) -> tuple[Any, Any]:
    """CLS's row in each head, `cls_rows` (H, T): its entropy in nats (H,) and its shares on
    the `first` tokens outside the grid (H, first), float64."""
    import numpy as np

    rows = cls_rows.astype(np.float64)
    logs = np.log(np.where(rows > 0, rows, 1.0))  # 0 · ln 0 counts as 0
    return -(rows * logs).sum(-1), rows[:, :first]


def vision_heads(att: Attention, layers: list[int], heads: list[int], top_k: int = 3):
    """Each head's `VisionHead` on `att`'s picture, layer by layer."""
    picture = att.picture
    n = picture.grid[0] * picture.grid[1]
    uniform = float(distances(picture).mean())
    found = []
    for layer in layers:
        weights = att.weights[att.slot(layer)]  # (H, T, T)
        sink, local, reach = patch_sums(weights, 0, picture) / n  # (H,) each
        for head in heads:
            role = role_of(sink[head], local[head], reach[head], uniform)
            found.append(VisionHead(layer, head, role, *_cls_view(att, weights[head, 0], top_k),
                                    float(sink[head]), float(local[head]),
                                    float(reach[head])))  # fmt: skip
    return found


def _cls_view(att: Attention, cls: Any, top_k: int) -> tuple[float | None, tuple, tuple]:
    """One head's CLS row (T,): its entropy, its shares on the tokens outside the grid and
    its `top_k` patches, by label; (None, (), ()) for a model with no CLS token."""
    import numpy as np

    first, n = att.picture.first, att.picture.grid[0] * att.picture.grid[1]
    if not first:
        return None, (), ()
    entropy, outside = cls_numbers(cls[None], first)
    order = np.argsort(-cls[first : first + n], kind="stable")[:top_k]
    return (float(entropy[0]), tuple((att.tokens[i], float(outside[0, i])) for i in range(first)),
            tuple((att.tokens[first + i], float(cls[first + i])) for i in order))  # fmt: skip


def role_of(sink: float, local: float, reach: float, uniform: float) -> str:
    """A head's role by the rules of the module's docstring, from the patches' mean shares
    and mean attention distance, and the distance of uniform attention over the grid."""
    if sink >= ROLE_SHARE:
        return "sink"
    if local >= ROLE_SHARE:
        return "local"
    if reach >= GLOBAL_REACH * uniform:
        return "global"
    return "mixed"
