"""Where each image token of a prompt came from in its picture: a `Layout` of `Part`s, each
one grid of image tokens over a box of the picture, as a model family's processor cut it.

A family's reader (one module of this package) reads the grid from the processor's outputs
(the token ids it wrote, `image_grid_thw`, the pixel values' shape) and the model's config,
never from constants: LLaVA's 24 × 24 is 336 / 14 of its processor's crop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, eq=False)
class Part:
    """One grid of image tokens over one box of the picture: LLaVA's one grid over the crop
    it read, or one of Idefics3's sub-images."""

    name: str  # "" where the picture is one grid; "global", "tile 0,1", …
    tokens: tuple[int, ...]  # each cell's token index, row by row from the top left
    grid: tuple[int, int]  # cells down, across
    box: tuple[float, float, float, float] = (0.0, 0.0, 1.0, 1.0)  # top, left, bottom, right

    def label(self, row: int, col: int) -> str:
        """A cell's token label: `(3, 4)`, or `global (3, 4)` in a layout of several parts."""
        return f"{self.name} ({row}, {col})".strip()


@dataclass(frozen=True, eq=False)
class Layout:
    """A prompt's picture and where its image tokens sit on it (`parts`); `marks` are the
    image tokens that stand for no patch (newlines, row and column tokens, a start and end of
    image), shares of the picture too."""

    family: str
    pixels: Any  # (H, W, 3) uint8: the picture as given
    parts: tuple[Part, ...]
    marks: tuple[int, ...] = ()
    name: str = "image"  # the picture's file name

    def cells(self) -> list[int]:
        """Every token index that is a cell of a part, in the parts' order."""
        return [index for part in self.parts for index in part.tokens]

    def image_tokens(self) -> list[int]:
        """Every token index that stands for the picture: the cells and the marks."""
        return sorted({*self.cells(), *self.marks})

    def labels(self) -> dict[int, str]:
        """Each cell's token label, by its token index."""
        found = {}
        for part in self.parts:
            cols = part.grid[1]
            for i, index in enumerate(part.tokens):
                found[index] = part.label(i // cols, i % cols)
        return found

    def share(self, row: Any) -> float:
        """What one row of attention (over every token) gives the picture's tokens."""
        return float(row[self.image_tokens()].sum())

    def grids(self, row: Any) -> list[Any]:
        """One row of attention as each part's grid of cells, (rows, cols) each."""
        import numpy as np

        return [np.asarray(row)[list(part.tokens)].reshape(part.grid) for part in self.parts]

    def edges(self, size: tuple[int, int]) -> list[tuple[Any, Any]]:
        """Each part's cells' edges on a picture of `size` (H, W): (ys, xs), its rows' and
        columns' first pixels and one past the last, whole pixels of its box (which may reach
        past the picture: LLaVA-NeXT's whole cells over its padding)."""
        import numpy as np

        height, width = size
        found = []
        for part in self.parts:
            top, left, bottom, right = part.box
            ys = np.round(np.linspace(top * height, bottom * height, part.grid[0] + 1)).astype(int)
            xs = np.round(np.linspace(left * width, right * width, part.grid[1] + 1)).astype(int)
            found.append((ys, xs))
        return found

    def painted(self, row: Any, size: tuple[int, int] | None = None) -> Any:
        """One row of attention painted on the picture, (H, W) float32 at `size` (H, W; the
        picture's own by default): each cell's value over the pixels of its box (`edges`),
        parts that overlap (a global view and its tiles) added; a box that reaches past the
        picture painted where it is on it."""
        import numpy as np

        height, width = size if size is not None else self.pixels.shape[:2]
        canvas = np.zeros((height, width), np.float32)
        for grid, (ys, xs) in zip(self.grids(row), self.edges((height, width))):
            rows = np.repeat(np.arange(len(ys) - 1), np.diff(ys))  # each pixel row's cell
            cols = np.repeat(np.arange(len(xs) - 1), np.diff(xs))
            painted = grid[rows][:, cols]  # (ys[-1] - ys[0], xs[-1] - xs[0])
            y0, y1 = max(ys[0], 0), min(ys[-1], height)
            x0, x1 = max(xs[0], 0), min(xs[-1], width)
            canvas[y0:y1, x0:x1] += painted[y0 - ys[0] : y1 - ys[0], x0 - xs[0] : x1 - xs[0]]
        return canvas


@dataclass(frozen=True, eq=False)
class Tower:
    """Where each token of a vision-language model's vision tower sits on its picture. The
    tower reads `lengths` sequences (one a batch row: Idefics3's sub-images, LLaVA-NeXT's base
    image and tiles; or Qwen2-VL's one), its tokens counted one sequence after the other;
    `layout`'s parts are the sequences drawn, one part a sequence, each over the box of the
    picture the language model's image tokens of that image cover, its marks the tokens of
    those sequences that stand for no patch (CLIP's CLS); `patch`: a patch's side in pixels
    of the picture as the tower read it."""

    layout: Layout
    lengths: tuple[int, ...]
    patch: int

    def starts(self) -> list[int]:
        """Each sequence's first token."""
        return [sum(self.lengths[:i]) for i in range(len(self.lengths))]

    def sequences(self) -> list[int]:
        """The sequence each part is (the one holding its first cell's token)."""
        starts = self.starts()
        return [max(i for i, start in enumerate(starts) if start <= part.tokens[0])
                for part in self.layout.parts]  # fmt: skip

    def places(self) -> Any:
        """(N, 2) int64 over every token of the tower: its cell (row, col) on its part's
        grid; (-1, -1) for a mark and for a token of a sequence not drawn."""
        import numpy as np

        found = np.full((sum(self.lengths), 2), -1, np.int64)
        for part in self.layout.parts:
            rows, cols = np.divmod(np.arange(len(part.tokens)), part.grid[1])
            found[list(part.tokens)] = np.stack([rows, cols], axis=1)
        return found


def one_grid(inputs: Inputs, config: Any, part: Part, before: int, sequences: int = 1) -> tuple:
    """A tower that reads its picture (or each of `sequences`, one a batch row, the first
    drawn: the whole picture) as one grid of patches, `pixel_values`' size over the vision
    config's patch side, after `before` tokens (CLIP's CLS): (parts, marks, lengths), the
    part over `part`'s box."""
    from dataclasses import replace

    height, width = inputs["pixel_values"].shape[-2:]
    patch = config.vision_config.patch_size
    grid = (height // patch, width // patch)
    n = grid[0] * grid[1]
    drawn = replace(part, tokens=tuple(range(before, before + n)), grid=grid)
    return (drawn,), tuple(range(before)), (before + n,) * sequences


def positions(ids: Sequence[int], token: int) -> list[int]:
    """The indices of `token` among `ids`."""
    return [i for i, found in enumerate(ids) if found == token]


def image_token(config: Any, processor: Any) -> int:
    """The id of the token that stands for an image patch: the config's, else the
    processor's."""
    for name in ("image_token_id", "image_token_index"):
        found = getattr(config, name, None)
        if isinstance(found, int):
            return found
    return int(processor.tokenizer.convert_tokens_to_ids(processor.image_token))


def seen_box(image_processor: Any, size: tuple[int, int]) -> tuple[float, float, float, float]:
    """The box of a picture of `size` (W, H) its image processor keeps: the centre crop of
    a processor that resizes the shortest edge and crops (CLIP's), else the whole picture
    (a processor that resizes it whole)."""
    width, height = size
    crop = getattr(image_processor, "crop_size", None)
    shortest = (getattr(image_processor, "size", None) or {}).get("shortest_edge")
    if not getattr(image_processor, "do_center_crop", False) or not crop or not shortest:
        return (0.0, 0.0, 1.0, 1.0)
    scale = shortest / min(width, height)
    seen_w, seen_h = width * scale, height * scale
    top, left = (seen_h - crop["height"]) / 2 / seen_h, (seen_w - crop["width"]) / 2 / seen_w
    return (max(top, 0.0), max(left, 0.0), min(1 - top, 1.0), min(1 - left, 1.0))


def square(count: int, what: str) -> tuple[int, int]:
    """The side of a square grid of `count` cells; ValueError where `count` is no square."""
    side = round(count**0.5)
    if side * side != count:
        raise ValueError(f"{count} {what} make no square grid")
    return side, side


Inputs = Mapping[str, Any]  # the processor's outputs: input_ids, pixel_values, …
