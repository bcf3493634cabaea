"""How much of a vision-language model's attention goes to the picture, as it answered: per
layer and head, the share of the answer's rows (the rows that wrote each generated or given
token, or the prompt's last row where there is no answer) that its image tokens hold.

In cross-attention over the picture (Mllama's: `core.cross_picture`) every key is the
picture's, so a row's share of the picture is 1: what is said there is the share of its
patches, each tile's CLS left out (`shared`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnviz.core.attention import Attention


@dataclass(frozen=True, eq=False)
class PictureShares:
    """`share[slot, head]`: the mean, over `rows`, of what each row gives the image tokens."""

    layers: tuple[int, ...]
    rows: tuple[int, ...]  # the answer's rows: row t − 1 wrote token t
    share: Any  # (L, H) float

    def top_heads(self, slot: int, k: int = 3) -> list[tuple[int, float]]:
        """The `k` heads of layer slot `slot` that give the picture most: (head, share)."""
        order = self.share[slot].argsort()[::-1][:k]
        return [(int(head), float(self.share[slot, head])) for head in order]


def answer_rows(att: Attention) -> tuple[int, ...]:
    """The rows that wrote the continuation's tokens, or the prompt's last row."""
    n = len(att.tokens)
    if att.continuation is None:
        return (n - 1,)
    return tuple(range(att.continuation.start - 1, n - 1))


def shared(att: Attention) -> list[int]:
    """The keys whose sum is the share a row gives the picture: its image tokens (cells and
    marks); in cross-attention over the picture, its patches (the cells) alone."""
    return att.layout.cells() if att.stack == "cross" else att.layout.image_tokens()


def shared_what(att: Attention) -> str:
    """What `shared`'s keys are, as a title says it: "picture" or "patches"."""
    return "patches" if att.stack == "cross" else "picture"


def picture_shares(att: Attention) -> PictureShares:
    """Each layer's and head's share of the answer's attention on the picture's tokens (its
    patches, in cross-attention: `shared`)."""
    rows = answer_rows(att)
    image = shared(att)
    held = att.weights[:, :, list(rows)]  # (L, H, R, T)
    share = held[..., image].sum(axis=-1).mean(axis=-1)  # (L, H)
    return PictureShares(tuple(att.held_layers()), rows, share)


def whose_rows(att: Attention) -> str:
    """Whose rows `answer_rows` are, as a figure's title says it."""
    if att.continuation is None:
        return "where the prompt's last token looks (the row that writes the answer)"
    n = len(att.tokens) - att.continuation.start
    if n == 1:
        return "where the answer looked, the row that wrote its token"
    return f"where the answer looked, the mean of the {n} rows that wrote its tokens"


def looked(att: Attention, layer: int, rows: tuple[int, ...]) -> Any:
    """(H, T): the mean of query rows `rows` in each head of layer `layer`."""
    return att.weights[att.slot(layer)][:, list(rows)].mean(axis=1)


def cross_fields(cross: Attention) -> dict[str, Any]:
    """Mllama's cross-attention over the picture as JSON-ready values (`show --json`'s
    `cross`, export's cross.json): its layers, each key's label, each tile's grid, box and
    keys row by row, the keys on no cell (each tile's CLS), and each layer's and head's share
    of the answer's rows on the patches."""
    found = picture_shares(cross)
    return {
        "layers": cross.info.n_layers,
        "key_tokens": list(cross.key_tokens),
        "parts": [
            {
                "name": part.name,
                "grid": list(part.grid),
                "box": list(part.box),
                "keys": list(part.tokens),
            }
            for part in cross.layout.parts
        ],  # fmt: skip
        "marks": list(cross.layout.marks),
        "rows": list(found.rows),
        "patch_share": found.share.round(6).tolist(),
    }
