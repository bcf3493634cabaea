"""What a vision transformer's heads do over many pictures (`attnviz report` given pictures):
each head's numbers of `analysis.vision` on each picture, averaged over the pictures, and a
role per head by the same rules applied to the averages.

Per picture and head: the mean attention distance in pixels (Dosovitskiy et al. 2021, Fig. 7:
Σ_k p(q, k) · d(q, k) over the patch keys, each row renormalised over them, then the mean over
the query patches), the patches' mean shares on the tokens outside the grid (sink) and on their
own patch and its 8 neighbours (local), and CLS's row: its entropy (nats) and its shares on
CLS, the distillation token and each register. Every picture weighs the same. A role compares
the mean distance with the mean over the pictures of uniform attention's distance.

The sums are fed by the capture pass a block of query rows at a time (`capture.ROWS`): no
layer's whole matrix is held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analysis.vision import GLOBAL_REACH, ROLE_SHARE, cls_numbers, patch_sums, role_of

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.attention import Picture
    from attnviz.core.model_info import ModelInfo


@dataclass(frozen=True, eq=False)
class PictureReport:
    """Each head's numbers averaged over the pictures: arrays (L, H) over the chosen `layers`
    (in order) and every head; rows and files cover the chosen `heads`."""

    info: ModelInfo
    pictures: int
    skipped: tuple[str, ...]  # what was not read, and why
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    outside: tuple[str, ...]  # the tokens before the patches: CLS, dist, reg0, …
    grids: tuple[tuple[int, int], ...]  # the patch grids met, (rows, cols)
    patch: int  # a patch's side, pixels
    distance: np.ndarray  # mean attention distance, pixels
    sink: np.ndarray  # the patches' mean share on the tokens outside the grid
    local: np.ndarray  # the patches' mean share on their own patch and its 8 neighbours
    cls_entropy: np.ndarray | None  # nats, of CLS's row (None: no CLS token)
    cls_shares: np.ndarray | None  # (len(outside), L, H): CLS's share on each of `outside`
    uniform: float  # uniform attention's mean distance, pixels, averaged over the pictures

    def role(self, layer: int, head: int) -> str:
        """The role of `layer`'s `head` (`analysis.vision.role_of`, on the averages)."""
        at = (self.layers.index(layer), head)
        return role_of(self.sink[at], self.local[at], self.distance[at], self.uniform)

    def rows(self) -> list[dict[str, Any]]:
        """One row per chosen head: layer, head, role and its numbers (pandas-ready); CLS's
        shares as `cls_share_CLS`, `cls_share_reg0`, …; None where undefined."""
        rows = []
        for slot, layer in enumerate(self.layers):
            for head in self.heads:
                at = (slot, head)
                row: dict[str, Any] = {"layer": layer, "head": head,
                                       "role": self.role(layer, head),
                                       "mean_distance_px": _finite(self.distance[at]),
                                       "sink": _finite(self.sink[at]),
                                       "local": _finite(self.local[at])}  # fmt: skip
                if self.cls_entropy is not None:
                    row["cls_entropy"] = _finite(self.cls_entropy[at])
                for k, label in enumerate(self.outside):
                    row[f"cls_share_{label}"] = _finite(self.cls_shares[(k, *at)])
                rows.append(row)
        return rows

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.info.as_dict(),
            **self.info.ran(),
            "pictures": self.pictures,
            "skipped": list(self.skipped),
            "grids": [list(grid) for grid in self.grids],
            "patch_px": self.patch,
            "uniform_distance_px": self.uniform,
            "thresholds": {"role_share": ROLE_SHARE, "global_reach": GLOBAL_REACH},
            "layers": list(self.layers),
            "head_indices": list(self.heads),
            "heads": self.rows(),
        }


def _finite(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


class PictureSums:
    """Running sums over pictures, in float64, of each head's numbers in the chosen `layers`:
    `batch(pictures)` gives the recorder of one pass over a batch of pictures."""

    def __init__(self, layers: list[int], n_heads: int, outside: tuple[str, ...]) -> None:
        import numpy as np

        self.layers, self.outside = layers, outside
        self.slot = {layer: i for i, layer in enumerate(layers)}
        shape = (len(layers), n_heads)
        self.patches = np.zeros((3, *shape))  # sink, local, distance (`vision.PATCH_SUMS`)
        self.entropy = np.zeros(shape)
        self.shares = np.zeros((len(outside), *shape))
        self.uniform = 0.0
        self.pictures = 0
        self.grids: dict[tuple[int, int], None] = {}  # the grids met, in order
        self.patch = 0

    def batch(self, pictures: list[Picture]) -> _Batch:
        """The capture recorder that adds `pictures` (one padded pass, in this order)."""
        from attnviz.analysis.vision import distances

        for picture in pictures:
            self.uniform += float(distances(picture).mean())
            self.grids[picture.grid] = None
            self.patch = picture.patch
        self.pictures += len(pictures)
        return _Batch(self, pictures)

    def report(self, info: ModelInfo, heads: list[int], skipped: tuple[str, ...]):
        """The means over the pictures added, as a `PictureReport`."""
        n = self.pictures
        if not n:
            raise ValueError("no picture to average")
        sink, local, distance = self.patches / n
        has_cls = bool(self.outside) and self.outside[0] == "CLS"
        return PictureReport(
            info, n, skipped, tuple(self.layers), tuple(heads), self.outside,
            tuple(self.grids), self.patch, distance, sink, local,
            self.entropy / n if has_cls else None, self.shares / n if has_cls else None,
            self.uniform / n,
        )  # fmt: skip


class _Batch:
    """A capture recorder of a batch of pictures' rows, block by block (`capture.ROWS`):
    each picture's patch sums (divided by its number of patches: its means) and its CLS
    row's numbers, added to `sums`."""

    def __init__(self, sums: PictureSums, pictures: list[Picture]) -> None:
        self.sums, self.pictures = sums, pictures
        self.wants = {layer: ("rows",) for layer in sums.layers}

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        """Nothing but rows is asked for."""

    def receive_rows(self, layer: int, start: int, rows: Any) -> None:
        sums, slot = self.sums, self.sums.slot[layer]
        for picture, own in zip(self.pictures, rows.float().numpy()):  # own: (H, b, T)
            n = picture.grid[0] * picture.grid[1]
            sums.patches[:, slot] += patch_sums(own, start, picture) / n
            if start == 0 and sums.outside[:1] == ("CLS",):  # CLS is the first row
                entropy, shares = cls_numbers(own[:, 0], picture.first)
                sums.entropy[slot] += entropy
                sums.shares[:, slot] += shares.T
