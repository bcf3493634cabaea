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
        if continuation is None:
            return []
        self.rows = WritingRows(run.layers, continuation, len(run.encoded))
        return [self.rows]

    def finish(self, run: Run) -> None:
        if self.rows is not None:
            run.result["continuation"] = self.rows.written(run.encoded, self.request.top_k)
