"""Two questions about pictures side by side (`attnviz compare a.png b.png "Q" -m VLM`, or
`compare a.png "Q1" "Q2"`): per layer and head of the language model, where the answer looked
in A and in B.

Each side is read over the answer's rows, the rows that wrote its tokens (row t − 1 wrote
token t; without an answer, the prompt's last row, which writes the answer's first token), as
`picture_share` reads them, and their mean row is taken (the answers of A and B need not be as
long, nor their tokens correspond: their means do). Per head:

    share       Σ of the mean row over the picture's image tokens (cells and marks), in A
                and in B; `change` is B's minus A's
    divergence  the Jensen–Shannon divergence (natural log, nats; 0: the same, at most
                ln 2) between A's and B's mean rows over the picture's cells (the patches:
                marks, which stand for no patch, left out), each renormalised to sum to 1:
                where on the picture the head looks, whatever share it gives it

The cells pair by place: A's cell (r, c) of each part with B's. Two pictures are compared
over one grid (the same parts, each of the same rows and columns: two pictures of one size
through the same processor); one picture with two questions always is. The rows are summed a
block at a time as the capture pass makes them (`AnswerRows`), no map held whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.attention import Attention
    from attnviz.core.layouts import Layout

UNIT = "nats"
MEASURED = (
    "the mean of the answer's rows (the rows that wrote its tokens; without an answer, the "
    "prompt's last row) in each head; share: its sum over the picture's image tokens; "
    "divergence: the Jensen–Shannon divergence (natural log, nats; 0 = the same, at most "
    "ln 2 ≈ 0.693) between A's and B's mean row over the picture's cells, each renormalised "
    "to sum to 1, cells paired by place"
)


class AnswerRows:
    """A capture recorder (`capture.ROWS`): the sum of the query rows `rows` of every chosen
    layer and head, block by block; `mean()` is their mean, (L, H, T)."""

    def __init__(self, layers: Sequence[int], n_heads: int, n_tokens: int,
                 rows: Sequence[int]) -> None:  # fmt: skip
        import numpy as np

        if not rows:
            raise ValueError("the answer's mean row needs at least one row")
        self.layers, self.rows = list(layers), tuple(rows)
        self.wants = {layer: ("rows",) for layer in self.layers}
        self.slot = {layer: i for i, layer in enumerate(self.layers)}
        self.summed = np.zeros((len(self.layers), n_heads, n_tokens))  # (L, H, T) float64

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        """Nothing but rows is asked for."""

    def receive_rows(self, layer: int, start: int, rows: Any) -> None:
        from attnviz.analysis.picture_heads import asked_rows

        held = asked_rows(rows, start, self.rows)  # (H, R, W)
        if held is None:
            return
        width = rows.shape[3]  # W ≤ T: a decoder's block stops at its last query
        self.summed[self.slot[layer], :, :width] += held.sum(axis=1)

    def mean(self) -> np.ndarray:
        """The mean of the rows asked for, (L, H, T)."""
        return self.summed / len(self.rows)


@dataclass(frozen=True, eq=False)
class Side:
    """One side of a comparison: its prompt (and answer) as read, tokens and facts without a
    map (`att`), the answer's rows and their mean row in every head of `att.layers`."""

    att: Attention  # no map: (L, H, 0, 0)
    picture: str  # the picture's path as given
    prompt: str  # the question as given (the prompt's text before any chat template)
    rows: tuple[int, ...]
    mean: np.ndarray  # (L, H, T)

    @property
    def layout(self) -> Layout:
        assert self.att.layout is not None
        return self.att.layout

    def share(self) -> np.ndarray:
        """What the mean row gives the picture's image tokens, (L, H)."""
        return self.mean[..., self.layout.image_tokens()].sum(axis=-1)

    def cells(self) -> np.ndarray:
        """The mean row over the picture's cells, in the layout's order, each renormalised
        to sum to 1 (a row with nothing on the cells left at 0), (L, H, C)."""
        import numpy as np

        on = self.mean[..., self.layout.cells()]
        mass = on.sum(axis=-1, keepdims=True)
        return on / np.where(mass > 0, mass, 1.0)

    def answer(self) -> str | None:
        """The answer as text, or None without one."""
        c = self.att.continuation
        return None if c is None else self.att.text[c.text_at :]


def answer_rows(tokens: int, continuation: Any) -> tuple[int, ...]:
    """The rows that wrote the continuation's tokens, or the prompt's last row."""
    if continuation is None or continuation.start >= tokens:
        return (tokens - 1,)
    return tuple(range(continuation.start - 1, tokens - 1))


def grid_of(layout: Layout) -> str:
    """A layout's grids as said: `6 × 6`, `global 3 × 3 + tile 0,0 3 × 3`."""
    return " + ".join(f"{part.name} {part.grid[0]} × {part.grid[1]}".strip()
                      for part in layout.parts)  # fmt: skip


def refuse_layouts(a: Layout, b: Layout) -> None:
    """Refuse two pictures whose cells do not pair by place (other parts, or a part of other
    rows and columns), in one line that says each one's grid."""
    shape_a = [(part.name, part.grid) for part in a.parts]
    shape_b = [(part.name, part.grid) for part in b.parts]
    if shape_a != shape_b:
        raise InputError(
            f"{a.name} is read as {grid_of(a)} image tokens and {b.name} as {grid_of(b)}: "
            "compare pairs the two pictures' cells by place, which needs one grid; give two "
            "pictures of one size"
        )


@dataclass(frozen=True, eq=False)
class PictureComparison:
    """Two questions about pictures compared head by head (see the module's docstring):
    `share_a`, `share_b` (L, H), `divergence` (L, H) in nats, `cells_a`, `cells_b` (L, H, C)
    the mean rows over the cells renormalised."""

    a: Side
    b: Side
    layers: tuple[int, ...]
    share_a: np.ndarray
    share_b: np.ndarray
    cells_a: np.ndarray
    cells_b: np.ndarray
    divergence: np.ndarray

    @property
    def change(self) -> np.ndarray:
        """The picture's share in B minus in A, (L, H)."""
        return self.share_b - self.share_a

    @property
    def two_pictures(self) -> bool:
        return self.a.picture != self.b.picture

    def moved(self, n: int) -> list[tuple[int, int, float]]:
        """The `n` heads whose rows over the picture moved most: (layer, head, divergence),
        largest first; a head that did not move (0) is not listed."""
        import numpy as np

        order = np.argsort(-self.divergence, axis=None, kind="stable")[:n]
        slots = [np.unravel_index(int(i), self.divergence.shape) for i in order]
        return [(self.layers[int(s)], int(h), float(self.divergence[s, h]))
                for s, h in slots if self.divergence[s, h] > 0]  # fmt: skip

    def as_dict(self, top: int = 6) -> dict[str, Any]:
        def side(s: Side) -> dict[str, Any]:
            c = s.att.continuation
            found = {
                "picture": s.picture,
                "prompt": s.prompt,
                "tokens": list(s.att.tokens),
                "rows": list(s.rows),
                "grid": grid_of(s.layout),
                "answer": s.answer(),
            }
            return {**found, "continuation": c.as_dict()} if c is not None else found

        return {
            "unit": UNIT,
            "measured": MEASURED,
            "compared": "two pictures, one question"
            if self.two_pictures
            else "one picture, two questions",
            "layers": list(self.layers),
            "a": side(self.a),
            "b": side(self.b),
            "share_a": self.share_a.tolist(),
            "share_b": self.share_b.tolist(),
            "share_change": self.change.tolist(),
            "divergence": self.divergence.tolist(),
            "moved": [
                {
                    "layer": layer,
                    "head": head,
                    "divergence": value,
                    "share_a": float(self.share_a[self.layers.index(layer), head]),
                    "share_b": float(self.share_b[self.layers.index(layer), head]),
                }
                for layer, head, value in self.moved(top)
            ],  # fmt: skip
        }


def compare_pictures(a: Side, b: Side) -> PictureComparison:
    """How every head's look at the picture moved from side `a` to side `b` (same layers,
    cells paired by place: `refuse_layouts`)."""
    from attnviz.analysis.compare import js_divergence

    refuse_layouts(a.layout, b.layout)
    cells_a, cells_b = a.cells(), b.cells()  # (L, H, C)
    return PictureComparison(a, b, tuple(a.att.held_layers()), a.share(), b.share(), cells_a,
                             cells_b, js_divergence(cells_a, cells_b))  # fmt: skip
