"""`--ablate L.H`: the pass runs without those heads (zero ablation); a second pass reads the
text with and without them, for what changed (a decoder's loss and next tokens, an encoder's
embedding) and how far each kept head's pattern moved."""

from __future__ import annotations

from typing import Any

from attnviz.pipelines.consumers import Consumer, Run


class Ablation(Consumer):
    def edit(self, run: Run) -> Any:
        from attnviz.analysis.ablation import removing

        heads = self.request.ablate
        run.loaded.info.pick_layers([layer for layer, _ in heads])  # what the files did not say
        run.loaded.info.pick_heads([head for _, head in heads])
        return removing(run.loaded, heads)

    def read(self, run: Run) -> None:
        from dataclasses import replace

        from attnviz.analysis.ablation import ablated_pass
        from attnviz.analysis.compare import TwoRows, ablation_divergence
        from attnviz.analysis.query import find_query
        from attnviz.errors import InputError

        r, raw = self.request, run.raw
        at = None
        if r.query is not None:
            try:
                at = [find_query(raw, r.query)]  # a token; --words queries fall back to all
            except InputError:
                at = None
        rows = TwoRows(run.layers, len(run.encoded))  # both rows' patterns, from that pass
        compared = ablated_pass(run.loaded, run.encoded, r.ablate, at, also=[rows])
        run.made.ablation = compared
        run.made.ablation_divergence = ablation_divergence(raw, rows, r.ablate)
        removed = ", ".join(f"L{layer} H{head}" for layer, head in compared.heads)
        note = f"heads removed (zero ablation): {removed}"
        run.raw = replace(raw, notes=(*raw.notes, note), removed=compared.heads)
