"""One token's view: where a chosen query token looks, in every head.

A query is named as a user would write it: a token or word as written (case-insensitive,
first occurrence), `it#2` for its second occurrence, or an integer position.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analysis.summary import Target, rank_keys
from attnviz.errors import InputError

if TYPE_CHECKING:
    from attnviz.core.attention import Attention, Encoded

_SHOWN_TOKENS = 60  # tokens listed in an error message before "…"


@dataclass(frozen=True)
class QueryHead:
    """One head's row for the query: its top-k keys, and the top key that is not special
    (none for a head removed from the pass)."""

    layer: int
    head: int
    top: tuple[Target, ...]
    best: Target | None  # the most-attended non-special key (None if every key is special)
    removed: bool = False

    def as_dict(self) -> list[dict[str, Any]] | None:
        return None if self.removed else [t.__dict__ for t in self.top]


@dataclass(frozen=True)
class QueryView:
    """Where the query token at `index` looks in each chosen head."""

    index: int
    token: str
    heads: tuple[QueryHead, ...]

    def ranked(self, n: int = 10) -> list[QueryHead]:
        """The heads whose top non-special key gets the most weight, strongest first."""
        scored = [h for h in self.heads if h.best is not None]
        return sorted(scored, key=lambda h: -h.best.weight)[:n]  # type: ignore[union-attr]

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "token": self.token}


def normal_form(token: str) -> str:
    """How --query compares tokens, and the terminal finds repeated ones: case-insensitive,
    word pieces without their "##"."""
    return token.removeprefix("##").strip().lower()


def _token_list(att: Attention) -> str:
    shown = " ".join(f"{i}:{t}" for i, t in enumerate(att.tokens[:_SHOWN_TOKENS]))
    more = len(att.tokens) - _SHOWN_TOKENS
    return shown + (f" … ({more} more)" if more > 0 else "")


def find_query(att: Attention, query: str) -> int:
    """The position of the token `query` names in `att`; InputError listing the tokens if none.

    `query` is a position ("9"), a token as written ("it", case-insensitive; word pieces
    match without their "##"), or a token and its occurrence ("it#2"); of a picture, a
    patch "ROW,COL" too.
    """
    query = query.strip()
    n = len(att.tokens)
    patch = re.fullmatch(r"\(?\s*(\d+)\s*,\s*(\d+)\s*\)?", query)
    if patch and att.picture is not None:
        return att.picture.index(int(patch.group(1)), int(patch.group(2)))
    if re.fullmatch(r"\d+", query):
        index = int(query)
        if index >= n:
            raise InputError(
                f"query position {index} out of range: this text has {att.unit}s 0–{n - 1}"
            )
        return index
    match = re.fullmatch(r"(.+)#(\d+)", query)
    word, occurrence = (match.group(1), int(match.group(2))) if match else (query, 1)
    if not word or occurrence < 1:
        raise InputError(f"query '{query}' is empty; give a {att.unit}, {att.unit}#N or a position")
    found = [i for i, token in enumerate(att.tokens) if normal_form(token) == normal_form(word)]
    if not found:
        hint = ""
        if att.unit == "token" and any(
            normal_form(w) == normal_form(word) for w in att.word_labels
        ):
            hint = " (it is split into pieces here: pass --words to query whole words)"
        raise InputError(
            f"no {att.unit} '{word}' in this text{hint}; {att.unit}s: {_token_list(att)}"
        )
    if occurrence > len(found):
        raise InputError(
            f"'{word}' occurs {len(found)} time(s), so '{query}' names none; "
            f"at positions {', '.join(map(str, found))}"
        )
    return found[occurrence - 1]


def check_query(
    encoded: Encoded, query: str, words: bool = False, hide_special_tokens: bool = False
) -> int:
    """`find_query` on a tokenised text as the views will show it (`words`,
    `hide_special_tokens`): the tokens alone, no weights, so a query naming no token is
    refused before the model loads."""
    import numpy as np

    from attnviz.analysis.transforms import transform
    from attnviz.core.attention import Attention

    n = len(encoded)
    labels = Attention(
        text=encoded.text,
        tokens=encoded.tokens,
        special=np.array(encoded.special, dtype=bool),
        weights=np.zeros((0, 0, n, n), dtype=np.float32),  # (L=0, H=0, T, T): labels only
        info=None,  # no model facts: the transforms and find_query read none
        unit="token",
        words=encoded.words,
        word_labels=encoded.word_labels,
        pair=encoded.pair,
        segments=encoded.segments,
    )
    return find_query(transform(labels, words, hide_special_tokens), query)


def query_view(
    att: Attention,
    index: int,
    layers: list[int],
    heads: list[int],
    top_k: int = 3,
    held: dict[int, Any] | None = None,
) -> QueryView:
    """The query row `att.pattern(layer, head)[index, :]` of every chosen head, summarised
    (a removed head's row is empty: `Attention.removed`); `held` gives each layer's rows
    (H, S) where `att` holds no whole maps (`QueryRows`)."""
    rows = []
    for layer in layers:
        for head in heads:
            if att.is_removed(layer, head):
                rows.append(QueryHead(layer, head, (), None, removed=True))
                continue
            if held is not None:
                row = held[layer][head]  # (S,)
            else:
                row = att.pattern(layer, head)[index]  # (T,) over keys; sums to 1
            top, best = rank_keys(att.key_tokens, att.key_special, row, top_k)
            rows.append(QueryHead(layer, head, top, best))
    return QueryView(index, att.tokens[index], tuple(rows))


class QueryRows:
    """A capture recorder keeping one query's row of every head of `layers`, (H, S) a layer,
    from the blocks of rows the pass hands out (batch row 0): what `query_view` takes where
    the whole maps are not held."""

    def __init__(self, layers: list[int], index: int, n_keys: int) -> None:
        self.index, self.n_keys = index, n_keys
        self.held: dict[int, Any] = {}
        self.wants = {layer: ("rows",) for layer in layers}

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        return None

    def receive_rows(self, layer: int, start: int, rows: Any) -> None:
        import numpy as np

        if start <= self.index < start + rows.shape[2]:
            row = rows[0, :, self.index - start].numpy()  # (H, W): a decoder's W ≤ S keys
            self.held[layer] = np.zeros((row.shape[0], self.n_keys), np.float32)
            self.held[layer][:, : row.shape[1]] = row
