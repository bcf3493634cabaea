"""The exact cells of a window of a long text: queries START … END−1 over keys START … END−1
(`--window START:END`, or a window around `--query`), while the whole text is shown pooled.

`WindowCells` keeps those cells as blocks of query rows go by (`core.recording`), so a
window of a text whose whole maps would not fit in memory is still exact; `window_of` cuts
the same cells from a whole attention. Either way the window is an `Attention` of its own,
drawn and listed as any other; its rows do not sum to 1 (the keys outside the window are
left out), and its notes say so.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.attention import Attention

# Tokens on each side of a query when the window is put around it.
AROUND_QUERY = 64
_SPAN = re.compile(r"\s*(\d+)\s*:\s*(\d+)\s*")


def parse_window(text: str) -> tuple[int, int]:
    """`START:END` as two positions (END not included), refusing anything else in one line."""
    found = _SPAN.fullmatch(text)
    if found is None:
        raise InputError(f"--window '{text}': give START:END, token positions, e.g. 100:228")
    start, end = int(found.group(1)), int(found.group(2))
    if end <= start:
        raise InputError(f"--window {start}:{end}: END must be after START")
    return start, end


def check_window(start: int, end: int, n_tokens: int) -> None:
    """Refuse a window that is not inside a text of `n_tokens` tokens."""
    if end > n_tokens:
        raise InputError(
            f"--window {start}:{end} is outside the text: it has {n_tokens} tokens "
            f"(positions 0–{n_tokens - 1})"
        )


def around(index: int, n_tokens: int, side: int = AROUND_QUERY) -> tuple[int, int]:
    """A window of `side` tokens on each side of position `index` (shorter at the ends)."""
    return max(0, index - side), min(n_tokens, index + side + 1)


class WindowCells:
    """`--window`'s cells: each chosen layer's queries and keys start … end−1, kept from
    blocks of query rows (`add(layer, first, rows)`, rows (H, b, S)); a capture recorder too
    (`core.capture`'s `rows`: blocks of batch row 0)."""

    def __init__(self, layers: Sequence[int], n_heads: int, start: int, end: int) -> None:
        import numpy as np

        self.start, self.end = start, end
        width = end - start
        self.held = {layer: np.zeros((n_heads, width, width), np.float32) for layer in layers}
        self.wants = {layer: ("rows",) for layer in layers}

    def receive(self, layer: int, tensors: dict) -> None:
        return None

    def receive_rows(self, layer: int, first: int, rows: Any) -> None:
        self.add(layer, first, rows[0].numpy())  # (H, b, S) of batch row 0

    def add(self, layer: int, first: int, rows: np.ndarray) -> None:
        lo, hi = max(first, self.start), min(first + rows.shape[1], self.end)
        if lo < hi:  # a decoder's block may stop before the window's last key (those are 0)
            block = rows[:, lo - first : hi - first, self.start : self.end]
            self.held[layer][:, lo - self.start : hi - self.start, : block.shape[-1]] = block


def window_attention(
    att: Attention, cells: dict[int, np.ndarray], start: int, end: int
) -> Attention:
    """The window's own Attention: `att`'s tokens start … end−1 and `cells` (H, w, w) of each
    of its layers, noted as a window."""
    from dataclasses import replace

    import numpy as np

    weights = np.stack([cells[layer] for layer in att.held_layers()])  # (L, H, w, w)
    span = slice(start, end)
    words = att.words[span]
    first = words[0] if words else 0
    note = (f"window {start}:{end} of {len(att.tokens)} tokens: exact cells; its rows leave "
            "out the keys outside it, so they do not sum to 1")  # fmt: skip
    return replace(
        att,
        tokens=att.tokens[span],
        special=np.asarray(att.special)[span],
        weights=weights,
        words=tuple(w - first for w in words),
        word_labels=att.word_labels[first : words[-1] + 1] if words else (),
        notes=(*att.notes, note),
        segments=att.segments[span] if att.segments else None,
        keys=None,
        pooled=None,
        span=(start, end),
    )


def window_of(att: Attention, start: int, end: int) -> Attention:
    """The window of a whole attention: the same cells as `WindowCells` keeps."""
    check_window(start, end, len(att.tokens))
    layers = att.held_layers()
    cells = {layer: att.weights[att.slot(layer), :, start:end, start:end] for layer in layers}
    return window_attention(att, cells, start, end)
