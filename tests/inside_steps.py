"""The inside-one-head numbers of one text by a pass of their own: what the page's tests build
a page from beside an `extract`ed attention. The commands get them from the pass they run
anyway (`show --html`'s Page consumer, `analysis.contributions.PageParts`)."""

from __future__ import annotations

from typing import Any


def inside_of(loaded: Any, encoded: Any, stack: str | None = None) -> Any:
    """`analysis.inside.InsideSteps`' result for one text (an `Inside`, or why the view is
    left out); with `stack`, of one stack of an encoder-decoder model on a source and
    target (`encoded`)."""
    from attnviz.analysis.inside import InsideSteps
    from attnviz.core import capture

    steps = InsideSteps(loaded, [encoded], stack)
    if steps.wants:
        if stack is None:
            from attnviz.core.tokens import pad

            inputs = pad(loaded, [encoded])
        else:
            from attnviz.core.seq2seq import pad_pairs

            inputs = pad_pairs(loaded, [encoded])
        capture.run(loaded, inputs, [steps])
    return steps.result()
