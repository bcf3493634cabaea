"""`attnviz export` in the terminal, and where any command wrote its images and page."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from attnviz.core.attention import Attention


def print_export(console: Console, summary: Any) -> None:
    """What `attnviz export` prints of its summary (`pipelines.export.ExportSummary`): the
    counts (or that nothing was left to do), an earlier export removed, where the manifest is."""
    s = summary
    if s.nothing_to_do:
        too_long = f", {s.too_long} too long (skipped)" if s.too_long else ""
        console.print(
            f"nothing to do: {s.complete} sentences already complete with these "
            f"settings{too_long} · {s.seconds:.1f} s (--overwrite redoes them)",
            highlight=False,
        )
    else:
        parts = [
            f"{s.sentences} sentences",
            f"{s.written} written",
            f"{s.complete} already complete",
            f"{s.too_long} too long (skipped)",
            f"{s.truncated} truncated",
            f"{s.blank} blank lines skipped",
            f"{s.figures} figures",
            f"{s.seconds:.1f} s",
        ]
        console.print(" · ".join(parts), highlight=False)
    if s.removed:
        console.print(
            f"removed {s.removed} sentence folders of an earlier export (--overwrite)",
            highlight=False,
        )


def print_written(
    console: Console,
    images: Sequence[Any],
    folder: Any,
    page: Any = None,
    drawn: Attention | None = None,
    window: Attention | None = None,
) -> None:
    """Where a command wrote its images (and its interactive page); how they show a long text
    (`drawn` pooled, the head figures from `window`'s exact cells)."""
    if images:
        console.print(f"wrote {len(images)} images to [bold]{folder}/[/]", highlight=False)
    if images and drawn is not None and drawn.pooled is not None:
        pooled = drawn.pooling()
        if window is not None and window.span is not None:
            first, end = window.span
            exact = f"head figures: exact cells {first}:{end}"
            said = f"overview, layer grids pooled ({pooled}); {exact}"
        else:
            said = f"the maps pooled: {pooled} (--window START:END draws exact cells)"
        console.print(f"  {said}", highlight=False, soft_wrap=True)
    if page is not None:
        console.print(
            f"wrote the interactive page [bold]{page}[/]", highlight=False, soft_wrap=True
        )
