"""`attnviz export` in the terminal."""

from __future__ import annotations

from typing import Any

from rich.console import Console


def print_export(console: Console, summary: Any) -> None:
    """What `attnviz export` prints of its summary (`pipelines.export.ExportSummary`): the
    counts (or that nothing was left to do), an earlier export removed, where the manifest is."""
    s = summary
    if s.nothing_to_do:
        too_long = f", {s.too_long} too long (skipped)" if s.too_long else ""
        console.print(
            f"nothing to do: {s.complete} {s.unit} already complete with these "
            f"settings{too_long} · {s.seconds:.1f} s (--overwrite redoes them)",
            highlight=False,
        )
    else:
        parts = [
            f"{s.sentences} {s.unit if s.sentences != 1 else s.unit[:-1]}",
            f"{s.written} written",
            f"{s.complete} already complete",
            f"{s.too_long} too long (skipped)",
            f"{s.truncated} truncated",
            f"{s.blank} blank lines skipped",
            f"{s.figures} figures",
            f"{s.seconds:.1f} s",
        ]
        if s.unit == "pictures":  # a picture is never too long, truncated or blank
            parts[3:6] = [f"{s.unreadable} not readable (skipped)"] if s.unreadable else []
        console.print(" · ".join(parts), highlight=False)
    if s.removed:
        console.print(
            f"removed {s.removed} sentence folders of an earlier export (--overwrite)",
            highlight=False,
        )
