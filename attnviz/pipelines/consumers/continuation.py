"""`--generate` and `--target` on a decoder: each continuation token's probability and where
the model looked as it wrote it, from the same rows as the maps."""

from __future__ import annotations

from typing import Any

from attnviz.pipelines.consumers import Consumer, Run


class Continued(Consumer):
    rows: Any = None  # analysis.continuation.WritingRows

    def recorders(self, run: Run) -> list[Any]:
        from attnviz.analysis.continuation import WritingRows

        continuation = getattr(run.encoded, "continuation", None)  # none on a source/target
        if continuation is None or not run.streamed:  # held whole: read from `run.shown`
            return []
        self.rows = WritingRows(run.layers, continuation, len(run.encoded))
        return [self.rows]

    def finish(self, run: Run) -> None:
        from attnviz.analysis.continuation import written

        if self.rows is not None:  # streamed: no --words or --hide-special
            run.made.continuation = self.rows.written(run.shown, self.request.top_k)
        elif run.shown.continuation is not None:  # as shown: words, special tokens hidden
            run.made.continuation = written(run.shown, self.request.top_k)
