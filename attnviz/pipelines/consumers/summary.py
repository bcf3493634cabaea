"""The per-head summary `show` prints and `--json` holds: each chosen head's pattern, top
keys and strongest links."""

from __future__ import annotations

from attnviz.pipelines.consumers import Consumer, Run


class Summary(Consumer):
    def finish(self, run: Run) -> None:
        from attnviz.analysis.summary import summarise

        summaries = summarise(run.ranked, run.layers, run.heads, self.request.top_k)
        run.result["summaries"] = summaries
