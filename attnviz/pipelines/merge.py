"""`attnviz merge`: the report of a complete set of partials (`report --shard I/N --partial
DIR`), the files one process's report would write."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnviz.analysis.report import Report
    from attnviz.outputs.figures import Style


def merge(folders: list[Path], out: Path, style: Style) -> tuple[Report, list[Path]]:
    """Read every partial in `folders`, refuse a set that is not one of every shard of one run
    (one line), and write the report to `out`. No model is loaded."""
    from attnviz.outputs.files import prepare_dir
    from attnviz.outputs.partials import find_partials, read_partial
    from attnviz.outputs.report_files import write_report
    from attnviz.pipelines.shards import report_of

    paths = find_partials(folders)
    prepare_dir(out)
    result = report_of([(str(path), read_partial(path)) for path in paths])
    return result, write_report(result, out, style)
