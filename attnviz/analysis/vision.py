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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnviz.core.attention import Attention

ROLE_SHARE = 0.5
GLOBAL_REACH = 0.75
ROLES = ("sink", "local", "global", "mixed")


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
    import numpy as np

    rows, cols = picture.grid
    r, c = np.divmod(np.arange(rows * cols), cols)
    dr, dc = r[:, None] - r[None, :], c[:, None] - c[None, :]
    return np.hypot(dr, dc) * picture.patch


def neighbourhood(picture: Any) -> Any:
    """(P, P) bool: key patch within one row and one column of the query patch."""
    import numpy as np

    rows, cols = picture.grid
    r, c = np.divmod(np.arange(rows * cols), cols)
    return (np.abs(r[:, None] - r[None, :]) <= 1) & (np.abs(c[:, None] - c[None, :]) <= 1)


def mean_distance(grid_rows: Any, picture: Any) -> Any:
    """Mean attention distance of each head: `grid_rows` (H, P, T) rows of the patches as
    queries over every token; (H,) pixels."""
    import numpy as np

    first, n = picture.first, picture.grid[0] * picture.grid[1]
    over_patches = grid_rows[:, :, first : first + n]
    total = over_patches.sum(-1, keepdims=True)
    shares = over_patches / np.where(total > 0, total, 1.0)
    return (shares * distances(picture)[None]).sum(-1).mean(-1)


def vision_heads(att: Attention, layers: list[int], heads: list[int], top_k: int = 3):
    """Each head's `VisionHead` on `att`'s picture, layer by layer."""
    import numpy as np

    picture = att.picture
    first, n = picture.first, picture.grid[0] * picture.grid[1]
    uniform = float(distances(picture).mean())
    near = neighbourhood(picture)
    found = []
    for layer in layers:
        weights = att.weights[att.slot(layer)]  # (H, T, T)
        patches = weights[:, first : first + n]  # (H, P, T): the patches as queries
        reach = mean_distance(patches, picture)
        for head in heads:
            rows = patches[head]
            sink = float(rows[:, :first].sum(-1).mean()) if first else 0.0
            local = float((rows[:, first : first + n] * near).sum(-1).mean())
            role = _role(sink, local, float(reach[head]), uniform)
            cls = weights[head, 0] if first else None
            entropy = None
            outside: tuple = ()
            top: tuple = ()
            if cls is not None:
                positive = cls[cls > 0]
                entropy = float(-(positive * np.log(positive)).sum())
                outside = tuple((att.tokens[i], float(cls[i])) for i in range(first))
                order = np.argsort(-cls[first : first + n], kind="stable")[:top_k]
                top = tuple((att.tokens[first + i], float(cls[first + i])) for i in order)
            found.append(VisionHead(layer, head, role, entropy, outside, top, sink, local,
                                    float(reach[head])))  # fmt: skip
    return found


def _role(sink: float, local: float, reach: float, uniform: float) -> str:
    if sink >= ROLE_SHARE:
        return "sink"
    if local >= ROLE_SHARE:
        return "local"
    if reach >= GLOBAL_REACH * uniform:
        return "global"
    return "mixed"
