"""A vision-language model whose language model reads the picture in cross-attention layers
(Mllama's): those layers' rows, recorded in the run's pass, as one Attention of the text's
tokens (queries) over the picture's keys, each key on its cell of the picture
(`core.layouts`'s `cross`).

The cross-attention layers are the stack `cross` beside the language model's own
(`core.layer_map.generic`), numbered among themselves; they run attnviz's attention function
as the self-attention layers do. `CrossRows` holds their rows whole, (cross layers, H, T, S)
float32 over the text's T tokens and the picture's S keys (every tile's: its CLS, then its
patches; an empty tile's keys too, which the model's mask gives 0), counted before the pass
(`memory.require`). In generation each step is one more call of each cross layer, one query
over the picture's cached keys: its row follows the last call's.

A token before the picture (Mllama's mask lets it see no tile) gets a row all the same, the
model's uniform one over every key, and the model drops that row's output (its
`full_text_row_masked_out_mask`): `seen` says which tokens see the picture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.core.layer_map.generic import CROSS

if TYPE_CHECKING:
    from attnviz.core.attention import Attention, Encoded
    from attnviz.core.layouts import Layout
    from attnviz.core.model_info import LoadedModel


@dataclass(frozen=True, eq=False)
class CrossPicture:
    """Where each key of the cross-attention layers sits on the picture: `layout` (its token
    indices are keys), `keys` the layers' keys in all (an empty tile's, on no cell, too) and
    `layers` the model's own numbers of those layers, in order (() where its config does not
    say)."""

    layout: Layout
    keys: int
    layers: tuple[int, ...] = ()

    def key_labels(self) -> tuple[str, ...]:
        """Each key's label: its cell (`tile 0,1 (2, 3)`), its tile's CLS, or an empty tile's."""
        labels = ["empty tile"] * self.keys
        for index, label in self.layout.labels().items():
            labels[index] = label
        for part in self.layout.parts:
            if part.tokens[0] - 1 in self.layout.marks:
                labels[part.tokens[0] - 1] = f"{part.name} CLS"
        return tuple(labels)

    def describe(self) -> str:
        """One line: how many cross-attention layers read which keys of the picture."""
        grids = " + ".join(f"{p.grid[0]} × {p.grid[1]}" for p in self.layout.parts)
        numbers = ", ".join(map(str, self.layers))
        where = f" (the model's layer{'s' * (len(self.layers) > 1)} {numbers})" if numbers else ""
        empty = self.keys - len(self.layout.cells()) - len(self.layout.marks)
        padding = f", and {empty} of empty tiles, which the mask hides" if empty else ""
        return (f"the picture is read by {len(self.layers) or 'its'} cross-attention layer(s)"
                f"{where}, not as tokens of the prompt: their {self.keys} keys are its "
                f"{len(self.layout.parts)} tile(s) of patches ({grids}), each after its CLS"
                f"{padding} (`show`, its page and `export` draw these layers over the "
                "picture; the API's result holds them as `cross`); the self-attention "
                "layers, numbered among themselves, are read as text")  # fmt: skip


def of(loaded: LoadedModel, inputs: dict[str, Any], picture: Any, name: str) -> CrossPicture | None:
    """The keys of the model's cross-attention layers over `picture` (a PIL image), from the
    processor's `inputs`; None for a family that reads its picture otherwise."""
    from attnviz.core import layouts
    from attnviz.core.model_info import language_config

    config = loaded.model.config
    found = layouts.cross(config.model_type, inputs, config, loaded.processor, picture, name)
    if found is None:
        return None
    numbers = getattr(language_config(config), "cross_attention_layers", None) or ()
    return CrossPicture(found[0], found[1], tuple(int(n) for n in numbers))


def recorder(loaded: LoadedModel, picture: CrossPicture, n_tokens: int) -> CrossRows:
    """The recorder of the cross-attention layers over a text of at most `n_tokens` tokens,
    refused in one line where this process could not hold their rows (twice: as blocks, then
    as one array)."""
    from attnviz.core import layer_map
    from attnviz.core.memory import FLOAT, require

    n_layers = layer_map.n_layers(loaded.model, CROSS)
    n_heads = loaded.info.n_heads
    require(2 * FLOAT * n_layers * n_heads * n_tokens * picture.keys,
            f"the cross-attention layers' rows ({n_layers} layers × {n_heads} heads, "
            f"{n_tokens:,} tokens over the picture's {picture.keys:,} keys)")  # fmt: skip
    return CrossRows(n_layers, n_heads, picture.keys)


class CrossRows:
    """A capture recorder of the cross-attention layers (stack `cross`): every row of every
    layer kept, block by block (`capture.ROWS`) and call by call (`calls`: generation's steps,
    one call a step, each call's rows after the last call's)."""

    calls = True

    def __init__(self, n_layers: int, n_heads: int, keys: int) -> None:
        from attnviz.core.capture import ROWS

        self.stack, self.n_heads, self.keys = CROSS, n_heads, keys
        self.wants = {layer: (ROWS,) for layer in range(n_layers)}
        self._blocks: dict[int, list[tuple[int, Any]]] = {}  # layer: (first row, (H, b, S))
        self._at: dict[int, list[int]] = {}  # layer: [its call, that call's first row, its rows]

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        pass  # the rows alone, in `receive_rows`

    def receive_rows(self, layer: int, start: int, rows: Any, call: int = 0) -> None:
        """Rows start … start+b−1 of every head, (1, H, b, S), of `layer`'s call `call`."""
        batch, n_heads, b, width = rows.shape
        if batch != 1 or n_heads != self.n_heads or width != self.keys:
            raise ValueError(f"cross-attention rows of shape {tuple(rows.shape)}: the "
                             f"picture's map reads one text, {self.n_heads} heads over "
                             f"{self.keys} keys")  # fmt: skip
        at = self._at.setdefault(layer, [call, 0, 0])
        if call != at[0]:  # a later call (a generation step): its rows follow the last call's
            at[:] = [call, at[1] + at[2], 0]
        self._blocks.setdefault(layer, []).append((at[1] + start, rows[0].float().numpy().copy()))
        at[2] = max(at[2], start + b)

    def attention(self, encoded: Encoded, loaded: LoadedModel, picture: CrossPicture) -> Attention:
        """The rows kept, as the Attention of `encoded`'s tokens (the text as read: the prompt,
        and its answer) over the picture's keys, (cross layers, H, T, S); ValueError where a
        layer did not read every token once."""
        from dataclasses import replace

        import numpy as np

        from attnviz.core.attention import Attention, Keys

        n = len(encoded)
        weights = np.zeros((len(self.wants), self.n_heads, n, self.keys), np.float32)
        for layer in self.wants:
            _, first, count = self._at.get(layer, (0, 0, 0))
            if first + count != n:
                raise ValueError(f"cross-attention layer {layer} read {first + count} rows of "
                                 f"the text's {n} tokens")  # fmt: skip
            for start, rows in self._blocks.pop(layer):
                weights[layer, :, start : start + rows.shape[1]] = rows  # (H, b, S)
        labels = picture.key_labels()
        keys = Keys(picture.layout.name, labels, np.zeros(self.keys, bool),
                    tuple(range(self.keys)), labels)  # fmt: skip
        return Attention(
            text=encoded.text,
            tokens=encoded.tokens,
            special=np.array(encoded.special, dtype=bool),
            weights=weights,
            info=replace(loaded.info, n_layers=len(self.wants), stack=CROSS),
            unit="token",
            words=encoded.words,
            word_labels=encoded.word_labels,
            notes=(picture.describe(),),
            layers=tuple(self.wants),
            stack=CROSS,
            keys=keys,
            continuation=encoded.continuation,
            layout=picture.layout,
        )


def seen(encoded: Encoded) -> Any:
    """(T,) bool: which of `encoded`'s tokens see the picture (Mllama's
    `cross_attention_mask` lets them see a tile; the model drops the others' rows' output);
    a continuation's tokens see what the prompt's last token sees, as `generate` extends it."""
    import numpy as np

    mask = (encoded.inputs or {}).get("cross_attention_mask")
    if mask is None:
        return np.ones(len(encoded), bool)
    sees = mask[0].reshape(mask.shape[1], -1).bool().any(dim=-1).numpy()  # (T prompt,)
    return np.concatenate([sees, np.repeat(sees[-1:], len(encoded) - len(sees))])
