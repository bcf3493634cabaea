"""The capture recorders that turn one forward pass into the contribution measures: each
head's values and W_O as the pass hands them over (`Values`), a measure's maps (`MeasureRecorder`),
the summary's special shares, report's sums over a corpus, and the page's every measure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analysis.contributions.maths import (
    MIXING,
    AltiLayer,
    Mixed,
    alti_layer,
    head_lengths,
    mixed,
    mixing_ratios,
    mixing_rows,
    rollout_layer,
    special_means,
    special_reads,
    special_rows,
    value_heads,
)
from attnviz.analysis.contributions.measures import (
    DEFAULT,
    MEASURES,
    Measure,
    get,
    refuse_on_stacks,
)
from attnviz.core.memory import held_bytes, held_what, require

if TYPE_CHECKING:
    import torch

    from attnviz.core.model_info import LoadedModel


class Values:
    """Each head's values and W_O^h, layer by layer, from what the pass hands over: X through
    the family's W_V and W_O where attnviz has an adapter (`value_heads`), else the values v
    the model handed its own attention, through W_O found by name
    (`layer_map.generic.OUTPUT_PROJECTIONS`: any model whose attention attnviz records).
    `kind` is the capture kind it reads; `weights` the adapter's, or None."""

    def __init__(self, loaded: LoadedModel, stack: str | None = None) -> None:
        from attnviz.core import capture, families, layer_map
        from attnviz.core.layer_map import generic
        from attnviz.errors import UnsupportedModelError

        model = loaded.model
        self.weights: Any = None
        if families.knows(model):
            self.weights = families.EachLayer(model, stack)
            self.kind = "input" if stack is None else "kv_input"
            return
        names = ", ".join(generic.OUTPUT_PROJECTIONS)
        if generic.own(model):
            raise UnsupportedModelError(
                "without an adapter, each head's values are read inside attnviz's attention "
                f"function; '{model.config.model_type}' computes its attention in its own code, "
                "which attnviz reads eager (docs/models.md)"
            )
        if not capture.records(model):
            raise UnsupportedModelError(
                "without an adapter, each head's values are read inside attnviz's attention "
                f"function; '{model.config.model_type}' runs eager attention here (leave "
                "--attention eager out)"
            )
        count = layer_map.n_layers(model, stack)
        self._projections = [
            generic.output_projection(model, layer, stack) for layer in range(count)
        ]
        if any(found is None for found in self._projections):
            raise UnsupportedModelError(
                f"'{model.config.model_type}' has no output projection attnviz finds by name "
                f"in its attention modules (it looks for {names})"
            )
        self.kind = "values"

    def heads(self, layer: int, tensors: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(v^h_j (B, T, H, d_k), W_O^h (H, d_k, d_model)) of `layer`, float32, from its
        tensors of the pass (query head h reads value head h // G)."""
        from attnviz.core.families.base import linear

        if self.weights is not None:
            weights = self.weights[layer]
            v = value_heads(tensors[self.kind].float(), weights)
            return v, weights.w_o.float().reshape(weights.n_heads, weights.d_k, -1)
        values = tensors["values"].float()  # (B, H_kv, S, d)
        w_o = linear(self._projections[layer])[0].float()  # (H·d, d_model)
        d = values.shape[-1]
        n_heads = w_o.shape[0] // d
        v = values.transpose(1, 2).repeat_interleave(n_heads // values.shape[1], dim=2)
        return v, w_o.reshape(n_heads, d, -1)

    def of(self, layer: int, tensors: dict[str, Any]) -> torch.Tensor:
        """‖f^h(x_j)‖ of `layer`, (B, H, S) float32, from its tensors of the pass
        (`maths.head_lengths`)."""
        return head_lengths(*self.heads(layer, tensors))


def values_of(loaded: LoadedModel, stack: str | None = None) -> Values | None:
    """`Values` of the model (of `stack`), or None where attnviz cannot read each head's
    values and W_O (a measure of norms then has nothing to work with)."""
    from attnviz.errors import UnsupportedModelError

    try:
        return Values(loaded, stack)
    except UnsupportedModelError:
        return None


class MeasureRecorder:
    """The recorder that turns one forward pass into a measure's values: `held` is (B, L, H,
    T, T) for a per-head measure, (B, L, 1, T, T) for a per-layer one (L: the chosen layers;
    per-layer measures compose every layer from 0 up to the last chosen one)."""

    def __init__(
        self,
        loaded: LoadedModel,
        measure: Measure,
        layers: list[int],
        n_batch: int,
        width: int,
        key_width: int | None = None,
        stack: str | None = None,
        lengths: list[int] | None = None,
    ) -> None:
        import numpy as np

        from attnviz.core import residual

        self.measure = measure
        self.lengths_of = lengths  # each batch row's tokens (rollout's discard counts them)
        self.per_layer = measure.per_layer
        self.stack = stack  # an encoder-decoder model's stack (norm only): keys are (B, S)
        self.slot = {layer: i for i, layer in enumerate(layers)}
        needed = range(max(layers) + 1) if measure.per_layer else layers
        kinds = measure.kinds
        model = loaded.model
        self._norms = {}
        self._values: Values | None = None
        if "input" in measure.kinds:  # each head's values: X through W_V, or v as handed over
            from attnviz.errors import UnsupportedModelError

            try:
                self._values = Values(loaded, stack)
            except UnsupportedModelError as error:
                raise UnsupportedModelError(
                    f"--measure {measure.name} is not defined here: it needs each head's value "
                    f"and output weights, and {error}"
                ) from None
            try:
                if measure.name == "alti":
                    self._norms = {layer: residual.norm_after(model, layer) for layer in needed}
            except UnsupportedModelError as error:
                raise UnsupportedModelError(
                    f"--measure alti is not defined here: it needs the residual stream and the "
                    f"normalisation around each block, and {error}"
                ) from None
            kinds = tuple(self._values.kind if kind == "input" else kind for kind in kinds)
        self.wants = {layer: kinds for layer in needed}
        heads = 1 if measure.per_layer else loaded.info.of_stack(stack).n_heads
        keys = width if key_width is None else key_width
        shape = (n_batch, len(layers), heads, width, keys)
        require(held_bytes(shape), held_what(shape))
        self.held = np.empty(shape, np.float32)
        self.mixing: dict[int, AltiLayer] = {}  # alti: each composed layer's mixing ratios
        # norm: each key's ‖f^h(x_j)‖, (B, L, H, S): what the page multiplies into the weights
        self.lengths = np.empty((n_batch, len(layers), heads, keys), np.float32)
        self._composed: torch.Tensor | None = None

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        import torch

        name = self.measure.name
        probs = tensors["probs"].float()
        if name == "weights":
            values = probs
        elif name == "norm":
            lengths = self._values.of(layer, tensors)  # (B, H, S)
            if layer in self.slot:
                self.lengths[:, self.slot[layer]] = lengths.numpy()
            values = probs * lengths[:, :, None, :]  # ‖α f(x_j)‖ = α ‖f(x_j)‖
        else:
            if name == "rollout":
                measure = self.measure
                step = rollout_layer(probs, measure.fusion, measure.discard, self.lengths_of)
            else:
                norm, (v, w_o) = self._norms[layer], self._values.heads(layer, tensors)
                residual, output = tensors["residual"].float(), tensors["output"].float()
                vectors = torch.einsum("bthk,hkd->bhtd", v, w_o)  # f^h(x_j)
                step = alti_layer(probs, vectors, residual, output, norm)
                ratios = mixing_ratios(probs, mixed(v, w_o, residual, output, norm))
                self.mixing[layer] = AltiLayer(step, ratios)
            previous = self._composed
            self._composed = step if previous is None else step @ previous  # R_l = C_l R_{l−1}
            values = self._composed[:, None]
        if layer in self.slot:
            self.held[:, self.slot[layer]] = values.numpy()


class SpecialShares:
    """The recorder behind the summary's line on special tokens: for each chosen layer and head,
    the mean over non-special queries of the share special keys get, by weight and by norm
    ‖α f(x)‖ (each row as shares, as `shares` makes them): `by_weight` and `by_norm`, (B, L, H)
    each. Summed from blocks of query rows as the pass hands them out (after each layer's X,
    which gives each key's ‖f^h(x_j)‖), so no layer's whole matrix is held for it."""

    def __init__(self, loaded: LoadedModel, layers: list[int], special: list[Any]) -> None:
        import numpy as np

        from attnviz.core.capture import ROWS

        self._reader = Values(loaded)  # each key's ‖f^h(x_j)‖
        self.wants = {layer: (self._reader.kind, ROWS) for layer in layers}
        self.slot = {layer: i for i, layer in enumerate(layers)}
        self._special = [np.asarray(marked, dtype=bool) for marked in special]  # (T_row,) bool
        shape = (2, len(special), len(layers), loaded.info.n_heads)
        self._sums = np.zeros(shape)  # by weight, by norm: summed over non-special queries
        self._lengths: Any = None  # the layer's ‖f^h(x_j)‖, (B, H, T)
        self._reads: Any = None  # what it reads of the layer's blocks (`special_reads`)

    @classmethod
    def of(cls, loaded: LoadedModel, layers: list[int], special: list[Any]) -> SpecialShares | None:
        """The recorder, or None where the model's value weights cannot be read (the summary
        then gives the share by weight alone)."""
        from attnviz.errors import UnsupportedModelError

        try:
            return cls(loaded, layers, special)
        except UnsupportedModelError:
            return None

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        self._lengths = self._reader.of(layer, tensors).numpy()
        self._reads = special_reads(self._lengths, self._special)

    def reductions(self, layer: int) -> tuple:
        """What it reads of every block (`core.reductions`), once its layer's X has come."""
        return (self._reads,)

    def receive_rows(self, layer: int, start: int, rows: Any, found: Any = None) -> None:
        """Query rows start … start+b−1 of `layer`, (B, H, b, S), and `found`, what it
        reads of them where the pass read it."""
        sums = None if found is None else found[0]
        self._sums[:, :, self.slot[layer]] += special_rows(
            rows, start, self._lengths, self._special, sums
        )

    def means(self) -> Any:
        """The special tokens' share of each head, by weight and by norm: (2, B, L, H)
        float32, means over each batch row's non-special queries."""
        return special_means(self._sums, self._special).astype("f4")


class ContributionSums:
    """report's special shares and mixing ratios as sums over the texts, each text's at its
    index in the corpus (`analysis.ordered`), so that parts summed apart `merge` into the
    same bits. `mixing`: whether mixing ratios are measured; `by_norm`: whether the value
    weights could be read (special shares by norm)."""

    def __init__(self, n_layers: int, n_heads: int, mixing: bool, by_norm: bool) -> None:
        from attnviz.analysis.ordered import OrderedSum

        self.shape = (n_layers, n_heads)
        self.by_norm = by_norm
        self.special_sums = OrderedSum()  # of (2, L, H) per text: by weight, by norm
        self.texts = 0  # with a non-special query: where the share is defined
        self.mixing_sums = OrderedSum() if mixing else None  # of (3, L) per text, × tokens
        self.tokens = 0  # summed over every token

    def add(self, index: int, special: Any, mixing: Any, n_tokens: int) -> None:
        """Text `index`'s special shares (2, L, H) (None: no non-special query) and the sum
        of its tokens' mixing ratios (3, L) (None: not measured), over its `n_tokens`."""
        self.special_sums.add(index, special)
        self.texts += special is not None
        if self.mixing_sums is not None:
            self.mixing_sums.add(index, mixing)
            self.tokens += n_tokens if mixing is not None else 0

    def merge(self, other: ContributionSums) -> ContributionSums:
        merged = ContributionSums(*self.shape, self.mixing_sums is not None, self.by_norm)
        merged.special_sums = self.special_sums.merge(other.special_sums)
        merged.texts = self.texts + other.texts
        if self.mixing_sums is not None and other.mixing_sums is not None:
            merged.mixing_sums = self.mixing_sums.merge(other.mixing_sums)
            merged.tokens = self.tokens + other.tokens
        return merged

    def special(self) -> Any:
        """(2, L, H): each head's special share by weight and by norm ‖α f(x)‖, means over the
        texts (NaN where undefined: no text with a non-special query; by norm, unreadable
        value weights)."""
        import numpy as np

        total = self.special_sums.total()
        found = total / self.texts if self.texts else np.full((2, *self.shape), np.nan)
        if not self.by_norm:
            found[1] = np.nan
        return found

    def mixing(self) -> Any:
        """(4, L): each layer's mixing ratios in the order of MIXING, means over every token of
        every text; None for a stack of an encoder-decoder model or unreadable value weights."""
        if self.mixing_sums is None or not self.tokens:
            return None
        return self.mixing_sums.total() / self.tokens


def norms_after(loaded: LoadedModel) -> dict[int, Any] | str:
    """Each layer's normalisation after its block (`core.residual.norm_after`; None where the
    block is added to the stream as it is), or why they cannot be read."""
    from attnviz.core import residual
    from attnviz.errors import UnsupportedModelError

    try:
        return {layer: residual.norm_after(loaded.model, layer)
                for layer in range(loaded.info.n_layers)}  # fmt: skip
    except UnsupportedModelError as error:
        return str(error)


def mixing_left_out(loaded: LoadedModel) -> str | None:
    """Why `report` leaves a one-stack model's mixing ratios out (it cannot read each head's
    values and W_O, or how a block joins the residual stream), or None: they are measured."""
    if loaded.info.seq2seq:
        return None  # defined for one-stack models only (docs/seq2seq.md)
    if values_of(loaded) is None:
        return "attnviz cannot read each head's values and W_O of this model"
    found = norms_after(loaded)
    return found if isinstance(found, str) else None


class CorpusContributions:
    """report's special shares and mixing ratios over a corpus, batch by batch (flat memory):
    `recorders(special)` before a batch's pass, `add(row, att)` for each of its texts after it,
    then `special()` and `mixing()` (the sums themselves: `sums`). `stack`: an
    encoder-decoder model's self-attention stack (special shares only: mixing ratios are for
    one-stack models). A batch's `mixed` vectors of each layer serve both."""

    def __init__(self, loaded: LoadedModel, stack: str | None = None) -> None:

        info = loaded.info.of_stack(stack)
        self._stack = stack
        self._values = values_of(loaded, stack)  # for norm and mixing
        self._norms: dict[int, Any] | None = None  # the normalisation after each block
        if stack is None and self._values is not None:
            found = norms_after(loaded)
            self._norms = found if isinstance(found, dict) else None
        mixing = self._norms is not None
        by_norm = self._values is not None
        self.sums = ContributionSums(info.n_layers, info.n_heads, mixing, by_norm)
        self._n_layers = info.n_layers
        self._added = 0
        self._batch: _ContributionPass | None = None

    def recorders(self, special: list[Any]) -> list[Any]:
        """One batch's recorders, from its texts' special masks ((T_row,) bool, of the
        queries: the source's for the encoder, the target's for the decoder)."""
        if self._values is None:
            return []
        self._batch = _ContributionPass(
            self._values, self._n_layers, self._norms, special, self._stack
        )
        return [self._batch]

    def add(self, row: int, att: Any, index: int | None = None, by_weight: Any = None) -> None:
        """Batch row `row`'s text, whose attention (all layers, tokens) is `att`, at its
        `index` in the corpus (default: after the texts added so far); `by_weight`, its
        special shares by weight (L, H) where `att` holds no maps (a long text's, summed from
        blocks of rows)."""
        import numpy as np

        from attnviz.analysis.summary import special_shares

        batch = self._batch
        n = len(att.tokens)
        mixing = None
        if self.sums.mixing_sums is not None and batch is not None:
            mixing = batch.mixing[row] * n  # each token weighs the same
        special = None
        if (~att.special).any():
            if by_weight is None:
                by_weight = special_shares(att.weights, ~att.special, att.key_special)  # (L, H)
            by_norm = batch.by_norm[row] if batch is not None else np.zeros_like(by_weight)
            special = np.stack([by_weight, by_norm])
        self.sums.add(self._added if index is None else index, special, mixing, n)
        self._added += 1

    def special(self) -> Any:
        return self.sums.special()

    def mixing(self) -> Any:
        return self.sums.mixing()


class _ContributionPass:
    """One batch's recorder for `CorpusContributions`: each layer's special shares by norm
    (B, L, H) and, given the normalisations after the blocks (`norms`: one-stack models), the
    mean over each row's tokens (special ones too) of its mixing ratios (B, 4, L), one
    layer's own quantity, nothing composed. `weights`: each layer's `mha.LayerWeights`.
    Summed from blocks of query rows as the pass hands them out (after each layer's X, which
    gives each key's vectors), so no layer's whole matrix is held for it."""

    def __init__(
        self,
        values: Values,
        n_layers: int,
        norms: dict[int, Any] | None,
        special: list[Any],
        stack: str | None,
    ) -> None:
        import numpy as np

        from attnviz.core.capture import ROWS

        self.stack = stack
        self._values, self._norms = values, norms
        self._special = [np.asarray(marked, dtype=bool) for marked in special]
        kinds = (values.kind, ROWS, *(("output", "residual") if norms is not None else ()))
        self.wants = {layer: kinds for layer in range(n_layers)}
        self._by_norm = None  # sums over queries, (B, L, H) once the first layer is in
        self._mixing = np.zeros((len(special), len(MIXING), n_layers))  # sums over tokens
        self._n_layers = n_layers
        self._lengths: Any = None  # the layer's ‖f^h(x_j)‖, (B, H, T)
        self._mixed: Mixed | None = None

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        import numpy as np

        if self._norms is None:
            self._lengths = self._values.of(layer, tensors).numpy()
        else:
            residual, output = tensors["residual"], tensors["output"]
            v, w_o = self._values.heads(layer, tensors)
            self._mixed = mixed(v, w_o, residual, output, self._norms[layer])
            self._lengths = self._mixed.lengths().numpy()
        if self._by_norm is None:
            shape = (len(self._special), self._n_layers, self._lengths.shape[1])
            self._by_norm = np.zeros(shape)

    def receive_rows(self, layer: int, start: int, rows: Any) -> None:
        """Query rows start … start+b−1 of `layer`, (B, H, b, W)."""
        self._by_norm[:, layer] += special_rows(rows, start, self._lengths, self._special)[1]
        if self._mixed is None:
            return
        # the padded batch at once: a text's queries give its padding keys no weight, so
        # their ratios are the text's own (`test_report_contributions`: batch sizes agree)
        ratios = mixing_rows(rows, start, self._mixed)  # (B, b) each
        for row, marked in enumerate(self._special):
            mine = slice(0, max(0, len(marked) - start))  # the block's queries of this text
            for k, ratio in enumerate(ratios):
                self._mixing[row, k, layer] += float(ratio[row, mine].sum())

    @property
    def by_norm(self) -> Any:
        return special_means(self._by_norm, self._special)

    @property
    def mixing(self) -> Any:
        import numpy as np

        return self._mixing / np.array([len(marked) for marked in self._special])[:, None, None]


def read_measure(
    loaded: LoadedModel,
    batch: list[Any],
    measure: str | Measure = DEFAULT,
    layers: list[int] | None = None,
    also: list[Any] | None = None,
    keep: list[MeasureRecorder] | None = None,
    edit: Any = None,
) -> list[Any]:
    """Each encoded text's `Attention` whose weights are `measure`'s values (one forward pass;
    recorders in `also` are fed by it too; a `Measure` carries rollout's options). `keep`
    gets the measure's recorder (ALTI's mixing ratios are on it); `edit` changes the model as
    it runs (`capture.run`: heads removed)."""
    from attnviz.core.extract import attend

    chosen = measure if isinstance(measure, Measure) else get(measure)
    if chosen.name == DEFAULT:
        return attend(loaded, batch, layers, also=also or [], edit=edit)
    lengths = [len(encoded) for encoded in batch]

    def make(layers: list[int], n_batch: int, width: int) -> MeasureRecorder:
        made = MeasureRecorder(loaded, chosen, layers, n_batch, width, lengths=lengths)
        if keep is not None:
            keep.append(made)
        return made

    return attend(loaded, batch, layers, also=also or [], values=make, edit=edit)


def stack_values(loaded: LoadedModel, measure: str) -> Any:
    """For `extract.attend_stacks`: a factory of recorders giving `measure`'s values on an
    encoder-decoder model's stacks (None for the weights). Of the contribution measures,
    norm is defined there (cross-attention's values are made of the encoder's output);
    ALTI and rollout compose one stack's layers with its residual stream, which
    cross-attention adds to the decoder's, and are refused."""
    chosen = refuse_on_stacks(measure)
    if chosen.name == DEFAULT:
        return None

    def make(stack: str, layers: list[int], n_batch: int, width: int, key_width: int):
        return MeasureRecorder(loaded, chosen, layers, n_batch, width, key_width, stack)

    return make


def mixing_means(recorder: MeasureRecorder, row: int, n: int) -> dict[int, dict[str, float]]:
    """Each layer's mean mixing ratio over the first `n` tokens of batch row `row`: how much of
    a token's update comes from other tokens (`mixing_rows`), by weights, by norms, with the
    residual, and with the residual and normalisation (Kobayashi et al. 2021's Attn-W,
    Attn-N, AttnRes-N and AttnResLn-N)."""
    return {
        layer: {name: float(ratios[row, :n].mean()) for name, ratios in zip(MIXING, found.ratios)}
        for layer, found in sorted(recorder.mixing.items())
    }


@dataclass(frozen=True, eq=False)
class PageMeasures:
    """Every measure of one text for the interactive page's switch: the weights, the others
    by name, and each key's ‖f^h(x_j)‖ for norm (None where it cannot stand for the norm: a
    word view, whose norms are sums over pieces)."""

    weights: Any  # Attention
    others: dict[str, Any]  # name -> Attention
    lengths: Any = None  # (L, H, T)


class EveryMeasure:
    """Recorders for the measures a pass does not make already (`chosen` is made by
    `read_measure`), so that one forward pass over a batch of `width` padded tokens gives each
    text's page all four: those the model allows (norm: v and W_O, `ValueLengths`; ALTI:
    X and the norms around the block, which attnviz reads through its adapters only)."""

    def __init__(
        self, loaded: LoadedModel, layers: list[int], batch: list[Any], chosen: str
    ) -> None:
        from attnviz.errors import UnsupportedModelError

        width = max(len(encoded) for encoded in batch)  # as `tokens.pad` pads
        self.recorders = {}
        for name, measure in MEASURES.items():
            if name == chosen:
                continue
            try:  # a measure this model cannot give (ALTI without an adapter) is left out
                self.recorders[name] = MeasureRecorder(loaded, measure, layers, len(batch), width)
            except UnsupportedModelError:
                continue

    def page(
        self,
        raw: Any,
        shown: Any,
        transform: Any,
        kept: MeasureRecorder | None = None,
        row: int = 0,
    ) -> PageMeasures:
        """Batch row `row`'s measures for its page: `shown` is the chosen measure as the
        command shows it, `raw` the same before `transform` (words, hide-special), which is
        applied to the others in the same way. Norm is left out where special tokens are hidden
        (its rows are lengths, which hiding would renormalise)."""
        from dataclasses import replace

        n = len(raw.tokens)
        made = {shown.measure: shown}
        for name, recorder in self.recorders.items():
            if name == "norm" and shown.hidden_special:
                continue
            values = replace(
                raw,
                weights=recorder.held[row][..., :n, :n],
                measure=name,
                per_layer=recorder.per_layer,
            )
            made[name] = transform(values)
        norm = self.recorders.get("norm") or kept
        lengths = None
        if shown.unit == "token" and not shown.hidden_special and norm is not None:
            lengths = norm.lengths[row][..., :n]
        weights = made.pop("weights")
        return PageMeasures(weights, made, lengths)


class PageParts:
    """What a page needs besides the chosen measure, read by the same pass, built here alone
    (`show --html`'s Page consumer, `export --html`): the inside view's steps
    (`analysis.inside.InsideSteps`) and, with `measures`, every other measure for the page's
    switch (`EveryMeasure`)."""

    def __init__(self, loaded: LoadedModel, layers: list[int], batch: list[Any], chosen: str,
                 measures: bool = True) -> None:  # fmt: skip
        from attnviz.analysis.inside import InsideSteps

        self.inside = InsideSteps(loaded, batch)
        self.every = EveryMeasure(loaded, layers, batch, chosen) if measures else None

    def recorders(self) -> list[Any]:
        """The recorders the pass feeds: the steps', then each measure's."""
        return [self.inside, *(self.every.recorders.values() if self.every else ())]
