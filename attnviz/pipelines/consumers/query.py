"""`--query TOKEN`: where one token looks in every chosen head."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnviz.pipelines.consumers import Consumer, Run, encoded_ahead

if TYPE_CHECKING:
    from attnviz.core.models import Model


class Query(Consumer):
    def early(self, model: Model) -> None:
        """Refuse a query that names no token with the model's tokenizer alone, where its
        files are here (an encoder-decoder model's target may be its own: checked after)."""
        from attnviz.analysis.query import check_query

        r = self.request
        if r.continues:  # the query may be a token the model has not written yet
            return
        ahead = encoded_ahead(r, model)
        if ahead is None:
            return
        _, encoded = ahead
        if not encoded.truncated:  # where a text is cut is the loaded model's to say
            check_query(encoded, r.query, r.words, r.hide_special)

    rows: Any = None  # analysis.query.QueryRows: a streamed run's query rows

    def recorders(self, run: Run) -> list[Any]:
        from attnviz.analysis.query import QueryRows, find_query

        if not run.streamed:
            return []
        index = find_query(run.raw, self.request.query)
        self.rows = QueryRows(run.layers, index, len(run.raw.key_tokens))
        return [self.rows]

    def finish(self, run: Run) -> None:
        from dataclasses import replace

        from attnviz.analysis.query import find_query, query_view

        index = find_query(run.shown, self.request.query)
        window = run.window
        if window is not None and window is not run.drawn:  # heads drawn in a window
            first, end = window.span
            if not first <= index < end:  # the query's figure too, so it is not drawn
                note = (
                    f"no query figure: it is drawn in the window, and --window {first}:{end}"
                    f" does not hold position {index}; widen it, or leave --window out"
                )
                run.shown = replace(run.shown, notes=(*run.shown.notes, note))
        ranked = run.shown if run.streamed else run.ranked  # streamed: the weights
        held = self.rows.held if self.rows is not None else None
        run.made.query = query_view(ranked, index, run.layers, run.heads, self.request.top_k, held)
