"""How figures become files fast: a figure drawn once and redrawn per frame (`Frames`:
blitting, and heatmaps painted straight into the canvas as whole pixels; `Framed`, a figure
that holds them), PNG encoding
(`png_bytes`), and saving any figure atomically (`save_figure`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.outputs.figures.style import Style
from attnviz.outputs.files import write_atomic

if TYPE_CHECKING:
    import numpy as np


def png_bytes(rgba: np.ndarray, dpi: int) -> bytes:
    """Encode an (height, width, 4) uint8 image as PNG: no row filter, deflate level 1.

    Twice as fast as Pillow's encoder on these figures: flat colour compresses well without
    filtering, and keeping the (opaque) alpha channel avoids a strided copy. Pixels are exact.
    Deflated by ISA-L (`isal`) where it is installed, six times as fast as zlib at its fastest
    level, in smaller files: zlib took half of a 512-token head's frame.
    """
    import struct
    import zlib

    import numpy as np

    try:
        from isal.isal_zlib import compress
    except ImportError:  # a platform without its wheels: the same stream, slower
        from zlib import compress

    height, width, _ = rgba.shape
    rows = np.empty((height, width * 4 + 1), np.uint8)  # each row: filter byte 0, then RGBA
    rows[:, 0] = 0
    rows[:, 1:] = rgba.reshape(height, -1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    per_metre = round(dpi / 0.0254)
    return b"".join(
        (
            b"\x89PNG\r\n\x1a\n",
            chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)),
            chunk(b"pHYs", struct.pack(">IIB", per_metre, per_metre, 1)),
            chunk(b"IDAT", compress(rows, 1)),
            chunk(b"IEND", b""),
        )
    )


class Frames:
    """A figure drawn once, then redrawn per frame by drawing only its `dynamic` artists.

    Heatmaps among them whose cells are whole pixels are painted straight into the canvas
    (`_paint_cells`), the same pixels Agg's nearest-neighbour resampling gives, without its
    detour through float RGBA images: at 512 tokens that is half of a frame's time.
    """

    def __init__(self, fig: Any, dynamic: list[Any], style: Style) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.image import AxesImage

        self.fig = fig
        self.canvas = FigureCanvasAgg(fig)
        self.dynamic = dynamic
        self.style = style
        self._background = None
        self._heatmaps = {id(a) for a in dynamic if isinstance(a, AxesImage)}

    def save(self, path: Path) -> Path:
        """Write the current state of the figure atomically to `path`."""
        if self.style.fmt != "png":
            return write_atomic(
                path, lambda h: self.fig.savefig(h, format=self.style.fmt, dpi=self.style.dpi)
            )
        import numpy as np

        self.lay_out()
        self.canvas.restore_region(self._background)
        for artist in self.dynamic:
            if id(artist) not in self._heatmaps or not _paint_cells(self.canvas, artist):
                self.fig.draw_artist(artist)
        png = png_bytes(np.asarray(self.canvas.buffer_rgba()), self.style.dpi)
        return write_atomic(path, lambda handle: handle.write(png))

    def lay_out(self) -> None:
        """Draw what every frame shares (all but the dynamic artists), once: before the first
        frame, or ahead of it, while there is nothing to draw yet (`render.prepare`)."""
        if self._background is not None or self.style.fmt != "png":
            return
        visible = [artist.get_visible() for artist in self.dynamic]
        for artist in self.dynamic:
            artist.set_visible(False)
        self.canvas.draw()
        self._background = self.canvas.copy_from_bbox(self.fig.bbox)
        for artist, shown in zip(self.dynamic, visible):
            artist.set_visible(shown)

    def close(self) -> None:
        self.fig.clear()


class Framed:
    """A figure laid out once and redrawn per frame: its `frames`, freed by `close`."""

    frames: Frames

    def close(self) -> None:
        self.frames.close()


def _paint_cells(canvas: Any, image: Any) -> bool:
    """Paint a nearest-neighbour heatmap with whole pixels per cell into the Agg canvas: each
    cell's colour read from the colour map's table as matplotlib reads it (value × N, floored,
    in the data's precision; NaN, a masked cell, in the map's "bad" colour), repeated over its
    pixels. Return False, painting nothing, for any other image (the caller draws it the usual
    way).
    """
    import numpy as np
    from matplotlib.colors import Normalize

    data = np.asarray(image.get_array())
    norm = image.norm
    if (
        image.get_interpolation() != "nearest"
        or data.ndim != 2
        or data.dtype.kind != "f"
        or type(norm) is not Normalize
        or (norm.vmin, norm.vmax) != (0.0, 1.0)
        or image.get_alpha() is not None
        or image.origin != "upper"
    ):
        return False
    box = image.axes.get_window_extent()  # display pixels, origin bottom left
    height = canvas.get_width_height()[1]
    edges = np.array([box.x0, box.x1, height - box.y1, height - box.y0])  # left right top bottom
    whole = np.round(edges)
    if np.abs(edges - whole).max() > 1e-3:
        return False
    x0, x1, y0, y1 = (int(v) for v in whole)
    rows, cols = data.shape
    if (y1 - y0) % rows or (x1 - x0) % cols or (y1 - y0) // rows != (x1 - x0) // cols:
        return False
    masked = np.isnan(data)
    some = bool(masked.any())
    values = np.where(masked, data.dtype.type(0), data) if some else data
    # (an infinity fails these too)
    if not (values.min() >= 0 and values.max() <= 1):
        return False  # the map's under and over colours: matplotlib's business
    cmap = image.get_cmap()
    index = (values * data.dtype.type(cmap.N)).astype(np.int32)  # 0 to N (a value of 1)
    np.minimum(index, cmap.N - 1, out=index)
    if some:
        index[masked] = cmap.N
    table = np.empty((cmap.N + 1, 4), np.uint8)  # the map's N colours, then its bad one
    table[:-1] = cmap(np.arange(cmap.N), bytes=True)
    table[-1] = cmap(np.nan, bytes=True)
    # a pixel's 4 bytes read as one uint32: one value a pixel to look up and copy
    colours = table.view(np.uint32)[:, 0][index]  # (rows, cols)
    k = (x1 - x0) // cols
    pixels = np.asarray(canvas.buffer_rgba()).view(np.uint32)[..., 0]  # (height, width)
    # (rows, k, cols × k): splitting an axis is a view, so the writes reach the canvas; each
    # row of cells widened once, then written k times as whole pixel rows (3× as fast as
    # broadcasting over both axes)
    cells = pixels[y0:y1, x0:x1].reshape(rows, k, cols * k)
    cells[:] = colours.repeat(k, axis=1)[:, None, :]
    return True


def whole_pixels(pixels: Any, left: int, bottom: int) -> Any:
    """An artist that puts an (h, w, 3) uint8 image at figure pixels (`left`, `bottom`: its
    lower left corner), unresampled, straight into an Agg canvas's buffer (PNG only: another
    format draws a `figimage`). A twelfth of a picture overlay's time, where matplotlib's
    image path resamples even at one to one."""
    from matplotlib.artist import Artist

    class WholePixels(Artist):
        zorder = 0  # under the frames and titles, as an image is

        def draw(self, renderer: Any) -> None:
            import numpy as np

            if not self.get_visible():
                return
            canvas = np.asarray(renderer.buffer_rgba())  # (height, width, 4), rows down
            h, w = pixels.shape[:2]
            top = canvas.shape[0] - bottom - h
            canvas[top : top + h, left : left + w, :3] = pixels
            canvas[top : top + h, left : left + w, 3] = 255

    made = WholePixels()
    made.pixels, made.left, made.bottom = pixels, left, bottom
    return made


def figure_png(fig: Any) -> bytes:
    """A figure drawn and encoded as PNG bytes (the fast encoder)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return png_bytes(np.asarray(canvas.buffer_rgba()), int(fig.dpi))


def save_figure(fig: Any, path: Path, style: Style) -> Path:
    """Write a figure atomically in the chosen format (PNG by the fast encoder), then free it."""
    if style.fmt == "png":
        png = figure_png(fig)
        path = write_atomic(path, lambda handle: handle.write(png))
    else:
        path = write_atomic(path, lambda h: fig.savefig(h, format=style.fmt, dpi=style.dpi))
    fig.clear()
    return path
