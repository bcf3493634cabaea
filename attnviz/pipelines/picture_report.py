"""`attnviz report` given pictures (files, folders) and a vision model: what each head does over
the pictures (`analysis.vision_report`), as heads.csv, heads.json, the mean attention distance
against depth and a summary in the terminal.

Each picture is read once, by the model's own image processor; pictures of one size go
through the model together, `batch_size` a pass, and each pass's rows are summed a block at a
time. A file that is not a picture attnviz can read is skipped with a note; none read, one
line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError
from attnviz.outputs.files import check_writable
from attnviz.pipelines import checks

if TYPE_CHECKING:
    from attnviz.analysis.vision_report import PictureReport
    from attnviz.core.attention import Encoded
    from attnviz.core.images import Pictures
    from attnviz.core.model_info import LoadedModel
    from attnviz.pipelines.request import ReportRequest


def picture_report(request: ReportRequest, **callbacks: Any) -> tuple[PictureReport, list[Path]]:
    """Check `request` (the options a picture cannot take, a model that reads text, layers
    and heads out of range), load the model, build the report over `request.pictures` and
    write it to `request.out`. `callbacks`: on_progress and on_warning, as
    `build_picture_report` takes them (the text report's others are not called)."""
    from attnviz.core.models import describe
    from attnviz.outputs.picture_report_files import write_picture_report

    model = request.model()
    checks.against(request, describe(model.name))
    layers, heads = list(request.layers or ()) or None, list(request.heads or ()) or None
    checks.ranges(model, layers, heads)
    check_writable(request.out)  # made when its files are written
    loaded = model.load()
    checks.against(request, loaded.info)  # a hub id: its files said nothing before it loaded
    said = {name: callbacks.get(name) for name in ("on_progress", "on_warning")}
    result = build_picture_report(loaded, request.pictures, layers, heads, request.batch_size,
                                  **said)  # fmt: skip
    return result, write_picture_report(result, request.out, request.style)


def build_picture_report(
    loaded: LoadedModel,
    pictures: Pictures,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    batch_size: int = 16,
    on_progress: Callable[[int], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> PictureReport:
    """Read every picture once through the vision model, summing each head's numbers of every
    chosen layer as the pass makes its rows (flat memory); their means over the pictures.
    The pictures a folder held beside files of other names, and those that cannot be read,
    are said through `on_warning` and kept in the report's `skipped`."""
    from attnviz.analysis.vision_report import PictureSums
    from attnviz.core import capture, memory
    from attnviz.core.images import prefix_labels
    from attnviz.core.tokens import pad

    info = loaded.info
    chosen, heads = info.pick_layers(layers), info.pick_heads(heads)
    skipped: list[str] = []
    note = pictures.note()
    if note is not None:
        _said(note, skipped, on_warning)
    sums = PictureSums(chosen, info.n_heads, tuple(prefix_labels(loaded.model.config)))
    for batch in _batches(_encoded(loaded, pictures.paths, skipped, on_warning), batch_size):
        block = memory.stream_rows(info.n_heads * len(batch), len(batch[0]))
        recorder = sums.batch([encoded.picture for encoded in batch])
        capture.run(loaded, pad(loaded, batch), [recorder], block_rows=block)
        if on_progress:
            on_progress(len(batch))
    if not sums.pictures:
        raise InputError(f"no picture could be read: {skipped[-1]}")
    return sums.report(info, heads, tuple(skipped))


def _said(note: str, skipped: list[str], on_warning: Callable[[str], None] | None) -> None:
    skipped.append(note)
    if on_warning:
        on_warning(note)


def _encoded(
    loaded: LoadedModel,
    paths: Iterable[Path],
    skipped: list[str],
    on_warning: Callable[[str], None] | None,
) -> Iterator[Encoded]:
    """Each picture as the model reads it; one that cannot be read is skipped and said."""
    from attnviz.core.images import encode_picture

    for path in paths:
        try:
            yield encode_picture(loaded, path)
        except InputError as error:
            _said(f"skipped {error}", skipped, on_warning)


def _batches(encoded: Iterable[Encoded], size: int) -> Iterator[list[Encoded]]:
    """Runs of up to `size` pictures of one size, in order (a processor that keeps each
    picture's aspect ratio gives pictures of several sizes, which one pass cannot hold)."""
    batch: list[Encoded] = []
    for item in encoded:
        if batch and (len(batch) == size or item.pixels.shape != batch[0].pixels.shape):
            yield batch
            batch = []
        batch.append(item)
    if batch:
        yield batch
