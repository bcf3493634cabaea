"""Which heads matter: each head's importance to the model's objective, by ablation and by
gradient (Michel, Levy and Neubig 2019, "Are Sixteen Heads Really Better than One?").

A head's output is its slice of W_O's input (B, T, H·d_head); `core.capture` lets an edit
replace that input as the model runs.

- *Ablation*: head h's slice is set to 0 at every position (`zero`), or to its mean over the
  texts' tokens (`mean`); the score is how much the objective rises. Every ablated copy of the
  texts is a batch row of its own, so one forward pass ablates many heads. Removing a head of
  layer l changes nothing below l: a batch ablates heads of one layer only and starts there,
  its layer blocks below l returning the clean pass's outputs (`_LowerLayers`) instead of
  running. Where layers share one block (ALBERT), every layer runs, as without reuse.
- *Gradient*: a gate ξ_h = 1 multiplies each head's slice; the score is |∂L/∂ξ_h|, from one
  backward pass per batch of texts, of the same corpus objective L (so that −∂L/∂ξ_h is the
  first-order estimate of what zero ablation changes). No weight changes.

The objective depends on what the loaded model can predict (`OBJECTIVES`, picked by
`objective_of`): a decoder's next-token loss, an encoder's masked-LM loss when it has its MLM
head, otherwise how far the sentence embedding moves. Scores are `[layer, head]`, larger =
more important; heads not measured are NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from attnviz.analysis.ordered import OrderedSum
from attnviz.errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.attention import Encoded
    from attnviz.core.model_info import LoadedModel, ModelInfo

SEED = 0  # the masked-LM objective's choice of masked tokens
MASK_SHARE = 0.15
TOKEN_BUDGET = 2048  # padded tokens per ablation batch: the logits of a batch are its memory


@dataclass(frozen=True)
class Objective:
    """What importance measures a head against: its name, definition and unit."""

    name: str
    short: str  # in a figure's colour bar: "next-token loss"
    help: str
    unit: str
    at_optimum: bool  # with nothing removed, its gradient is 0: gradient importance says nothing


OBJECTIVES = {
    objective.name: objective
    for objective in (
        Objective(
            "next-token",
            "next-token loss",
            "mean next-token negative log-likelihood over every predicted token of the texts "
            "(tokens 1…T−1; BOS first where the model adds one)",
            "nats",
            False,
        ),
        Objective(
            "masked-lm",
            "masked-LM loss",
            f"masked-LM loss: mean negative log-likelihood of a fixed {MASK_SHARE:.0%} of each "
            f"text's word tokens (seed {SEED}), each replaced by the mask token",
            "nats",
            False,
        ),
        Objective(
            "embedding-cosine",
            "1 − cos of the embedding",
            "1 − cosine between the sentence embedding (the last hidden state mean-pooled over "
            "the text's tokens, as sentence-transformers pools it) with and without the change, "
            "mean over texts",
            "1 − cos",
            True,
        ),
    )
}


@dataclass(frozen=True)
class Kind:
    """A named way of doing something, with its help (a method, an ablation)."""

    name: str
    help: str


METHODS = {
    kind.name: kind
    for kind in (
        Kind("ablation", "remove each head in turn; score = how much the objective rises"),
        Kind("gradient", "|∂objective/∂gate| of a gate on each head's output (Michel et al.)"),
    )
}
# What `report --importance` takes: each method, or both (and their rank correlation).
BOTH = Kind("both", "both, with the Spearman correlation of their two rankings")
CHOICES = {**METHODS, BOTH.name: BOTH}


def methods_of(choice: str) -> list[str]:
    """The methods a choice of CHOICES runs, ablation first."""
    if choice not in CHOICES:
        raise InputError(f"unknown importance '{choice}'; known: {', '.join(CHOICES)}")
    return list(METHODS) if choice == BOTH.name else [choice]


ABLATIONS = {
    kind.name: kind
    for kind in (
        Kind("zero", "the head's output set to 0 at every position"),
        Kind("mean", "the head's output replaced by its mean over the texts' tokens"),
    )
}


@dataclass(frozen=True, eq=False)
class Importance:
    """Each head's importance to one objective over some texts."""

    scores: np.ndarray  # (L, H): larger = more important; NaN where not measured
    clean: float  # the objective with nothing removed
    objective: str  # its definition in words
    objective_name: str
    unit: str
    method: str
    ablation: str | None  # zero or mean, for method "ablation"
    texts: int
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    short: str = ""  # the objective in a few words

    @property
    def measure(self) -> str:
        """What a score is, with its unit: a colour bar's label."""
        unit = "" if self.unit in self.short else f" ({self.unit})"
        if self.method == "gradient":
            return f"|∂ {self.short} / ∂ gate|{unit}"
        how = "at its mean" if self.ablation == "mean" else "zeroed"
        return f"rise in {self.short}, head {how}{unit}"

    @property
    def how(self) -> str:
        """The method in a few words: "zero ablation", "mean ablation", "gradient"."""
        return "gradient" if self.method == "gradient" else f"{self.ablation} ablation"

    def ranks(self) -> np.ndarray:
        """(L, H): 1 for the most important head measured, 2 for the next …; 0 where not
        measured. Ties take the better rank of the two in layer, head order."""
        import numpy as np

        ranks = np.zeros(self.scores.shape, dtype=int)
        measured = np.flatnonzero(np.isfinite(self.scores.ravel()))
        order = measured[np.argsort(-self.scores.ravel()[measured], kind="stable")]
        ranks.ravel()[order] = np.arange(1, len(order) + 1)
        return ranks

    def top(self, n: int) -> list[tuple[int, int, float]]:
        """The `n` most important heads: (layer, head, score), best first."""
        import numpy as np

        ranks = self.ranks()
        found = [(int(r), int(layer), int(head)) for (layer, head), r in np.ndenumerate(ranks)]
        best = sorted((r, layer, head) for r, layer, head in found if r > 0)[:n]
        return [(layer, head, float(self.scores[layer, head])) for _, layer, head in best]

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "ablation": self.ablation,
            "objective": self.objective_name,
            "definition": self.objective,
            "unit": self.unit,
            "measure": self.measure,
            "clean": self.clean,
            "texts": self.texts,
        }


@dataclass(frozen=True, eq=False)
class _Item:
    """One text as the objective reads it: what the model gets and what it is scored on."""

    encoded: Encoded  # for the masked-LM objective, with its chosen tokens masked
    labels: tuple[int, ...]  # per position, the token its logits are scored on; −100: none
    weight: int  # how many positions it scores (1 per text for the embedding objective)


def objective_of(loaded: LoadedModel) -> Objective:
    """The objective `loaded` can be measured by: a decoder's next-token loss, an encoder's
    masked-LM loss when its MLM head is loaded, else the sentence embedding's cosine."""
    if loaded.info.causal:
        return OBJECTIVES["next-token"]
    if has_mlm_head(loaded):
        return OBJECTIVES["masked-lm"]
    return OBJECTIVES["embedding-cosine"]


def has_mlm_head(loaded: LoadedModel) -> bool:
    """Whether an encoder was loaded with its masked-LM head (a *ForMaskedLM checkpoint)."""
    return not loaded.info.causal and loaded.model is not loaded.model.base_model


def check_method(loaded: LoadedModel, method: str) -> Objective:
    """The objective `method` will use on `loaded`, or a one-line InputError where gradients
    say nothing (the embedding's 1 − cosine is 0 with nothing removed, its gradient 0 too)."""
    objective = objective_of(loaded)
    if method == "gradient" and objective.at_optimum:
        raise InputError(
            f"gradient importance needs an objective away from its optimum: {loaded.info.name} "
            f"has no LM head, so its objective is 1 − cosine of the sentence embedding, which is "
            "0 with nothing removed, and so is its gradient; use --importance ablation"
        )
    return objective


def _item(loaded: LoadedModel, index: int, encoded: Encoded, objective: Objective) -> _Item:
    """Text `index` of the corpus as `objective` reads it (its index seeds the masked tokens)."""
    import numpy as np

    n = len(encoded)
    if objective.name == "next-token":
        # logits at p predict token p + 1; the last position predicts nothing
        return _Item(encoded, (*encoded.ids[1:], -100), n - 1)
    if objective.name == "masked-lm":
        words = [p for p in range(n) if not encoded.special[p]]
        k = max(1, round(MASK_SHARE * len(words))) if words else 0
        chosen = set(np.random.default_rng([SEED, index]).choice(words, k, replace=False))
        mask_id = loaded.tokenizer.mask_token_id
        ids = tuple(mask_id if p in chosen else i for p, i in enumerate(encoded.ids))
        labels = tuple(i if p in chosen else -100 for p, i in enumerate(encoded.ids))
        return _Item(replace(encoded, ids=ids), labels, k)
    return _Item(encoded, (-100,) * n, 1)


class _Scorer:
    """Runs batches of items (each possibly edited) and sums each row's objective terms."""

    def __init__(self, loaded: LoadedModel, items: dict[int, _Item], objective: Objective) -> None:
        self.loaded, self.items = loaded, items  # by the text's index in the corpus
        self.lm_head = objective.name != "embedding-cosine"
        self.reference: dict[int, Any] = {}  # (d_model,) clean embeddings, cosine objective

    def run(self, rows: Sequence[int], edit: Any = None, gradients: bool = False, also=()) -> Any:
        """(B,): each row's sum of objective terms; row r reads item `rows[r]`."""
        import torch

        from attnviz.core import capture
        from attnviz.core.tokens import pad

        batch = [self.items[i] for i in rows]
        inputs = pad(self.loaded, [item.encoded for item in batch])
        output = capture.run(self.loaded, inputs, also, self.lm_head, edit, gradients)
        mask = inputs["attention_mask"]  # (B, W)
        if self.lm_head:
            labels = torch.full(mask.shape, -100, dtype=torch.long)
            for r, item in enumerate(batch):
                labels[r, : len(item.labels)] = torch.tensor(item.labels)
            logits = output.logits  # (B, W, V)
            labels = labels.to(logits.device)
            # Every position's loss, 0 where label −100: picking the scored positions' logits
            # first would copy them (a tenth of an ablation pass's time on SmolLM2's 49,152).
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), labels.flatten(), reduction="none"
            )  # (B·W,)
            return loss.view(labels.shape).double().sum(dim=1)  # (B,)
        pooled = _pool(output.last_hidden_state, mask)  # (B, d_model)
        if not self.reference:
            return torch.zeros(len(rows), dtype=torch.float64)
        reference = torch.stack([self.reference[i] for i in rows]).to(pooled.device)
        return 1.0 - torch.nn.functional.cosine_similarity(pooled, reference, dim=-1)

    def pooled(self, rows: Sequence[int]) -> Any:
        """(B, d_model): the clean sentence embeddings of `rows`."""
        from attnviz.core import capture
        from attnviz.core.tokens import pad

        inputs = pad(self.loaded, [self.items[i].encoded for i in rows])
        output = capture.run(self.loaded, inputs, [])
        return _pool(output.last_hidden_state, inputs["attention_mask"]).cpu()

    def width(self, rows: Sequence[int]) -> int:
        """The padded width of a batch of `rows`: its longest text's length."""
        return max(len(self.items[i].encoded) for i in rows)


def _pool(hidden: Any, mask: Any) -> Any:
    """(B, d_model) float64: the last hidden state (B, W, d_model) averaged over each row's
    tokens (mask (B, W)), as sentence-transformers pools it."""
    hidden = hidden.double()
    weights = mask[..., None].to(hidden.device, hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1)


class _HeadMeans:
    """A recorder: each layer's W_O input summed over one batch's real tokens, for `mean`."""

    def __init__(self, layers: Sequence[int], mask: Any) -> None:
        self.wants = {layer: ("heads",) for layer in layers}
        self.sums: dict[int, Any] = {}
        self.mask = mask  # (B, W) of the batch

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        heads = tensors["heads"].double()  # (B, T, H·d_head)
        weights = self.mask[..., None].to(heads.dtype)
        total = (heads * weights).sum(dim=(0, 1))  # (H·d_head,)
        self.sums[layer] = self.sums.get(layer, 0) + total


def _split_heads(x: Any, n_heads: int) -> Any:
    b, t, width = x.shape
    return x.reshape(b, t, n_heads, width // n_heads)  # (B, T, H, d_head)


def ablating(drops: dict[int, Any], n_heads: int, means: dict[int, Any] | None = None):
    """An edit for `capture.run`: in layer l, batch row r's head h reads 0 (or its mean)
    where `drops[l][r, h]` (a bool tensor (B, H)) is set."""
    import torch

    def edit(layer: int, x: Any) -> Any:
        drop = drops.get(layer)
        if drop is None:
            return x
        heads = _split_heads(x, n_heads)  # (B, T, H, d_head)
        if means is None:
            fill = torch.zeros((), dtype=x.dtype, device=x.device)
        else:
            fill = means[layer].reshape(n_heads, -1).to(x.device, x.dtype)  # (H, d_head)
        kept = torch.where(drop.to(x.device)[:, None, :, None], fill, heads)
        return kept.reshape(x.shape)

    return edit


def _layer_blocks(model: Any, n_layers: int) -> list[Any] | None:
    """Each layer's block (the module the model calls once per layer, holding that layer's
    attention), from the model's list of `n_layers` blocks; None where layers share a block
    (ALBERT), no such list is found, or the blocks return more than their hidden states (a
    model whose attention bypasses transformers' interface: BLOOM's blocks return
    (hidden states, probabilities), which a block's clean output alone cannot stand for)."""
    from torch import nn

    from attnviz.core import layer_map
    from attnviz.core.layer_map import generic

    if generic.own(model):
        return None
    attentions = [layer_map.layer_modules(model, layer).attention for layer in range(n_layers)]
    if len({id(a) for a in attentions}) < n_layers:
        return None
    for module in model.modules():
        if (
            isinstance(module, nn.ModuleList)
            and len(module) == n_layers
            and all(a in set(block.modules()) for block, a in zip(module, attentions))
        ):
            return list(module)
    return None


class _LowerLayers:
    """A recorder for the clean pass over one batch of texts: the outputs of the layer blocks
    below the highest ablated layer, so that an ablated copy of a text can start at its
    ablated layer.

    Block l−1's output is block l's input, which is the residual stream that capture's
    `residual` reads at layer l: every family's model hands each block's output to the next
    block as it is (its blocks return their hidden states alone in transformers 5; the tests
    check it for every family)."""

    def __init__(self, blocks: list[Any], texts: Sequence[int], below: int, device: Any) -> None:
        self.blocks, self.texts, self.device = blocks, list(texts), device
        self.wants = {layer: ("residual",) for layer in range(1, below + 1)}
        self.outputs: dict[int, Any] = {}  # block -> its output (B, W, d_model)

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        self.outputs[layer - 1] = tensors["residual"].to(self.device)

    @contextmanager
    def starting_at(self, layer: int, texts: Sequence[int], width: int) -> Iterator[None]:
        """Blocks 0 … layer−1 skip their work while a batch of rows reading `texts` (padded to
        `width`) runs: each returns its clean output for those texts. The layers that run still
        get the masks and position embeddings the model makes from the batch's ids."""
        import torch

        rows = torch.tensor([self.texts.index(t) for t in texts], device=self.device)

        def clean(output: Any) -> Any:
            def forward(*args: Any, **kwargs: Any) -> Any:
                return output.index_select(0, rows)[:, :width].contiguous()  # (B, width, …)

            return forward

        stubbed = self.blocks[:layer]
        # A block's own `forward` in its __dict__ (accelerate's wrappers) is put back after.
        saved = [block.__dict__.get("forward") for block in stubbed]
        for i, block in enumerate(stubbed):
            block.forward = clean(self.outputs[i])
        try:
            yield
        finally:
            for block, forward in zip(stubbed, saved):
                if forward is None:
                    del block.forward
                else:
                    block.forward = forward


@dataclass
class ImportanceSums:
    """One method's sums over a run's batches of texts, each batch's at its index among them
    (`analysis.ordered`), so that parts run apart `merge` into the same bits."""

    weight: int = 0  # the positions (or texts) the objective scores, a whole number
    clean: OrderedSum = field(default_factory=OrderedSum)  # (1,) per batch: nothing removed
    # per batch: ablation, each (layer, head)'s objective terms (C,); gradient, ∂Σ/∂gate (L, H)
    scored: OrderedSum = field(default_factory=OrderedSum)
    # mean ablation, per batch: each chosen layer's W_O input summed over its tokens
    means: OrderedSum = field(default_factory=OrderedSum)
    tokens: int = 0

    def merge(self, other: ImportanceSums) -> ImportanceSums:
        return ImportanceSums(
            self.weight + other.weight,
            self.clean.merge(other.clean),
            self.scored.merge(other.scored),
            self.means.merge(other.means),
            self.tokens + other.tokens,
        )


def _configs(layers: list[int], heads: list[int]) -> list[tuple[int, int]]:
    """The (layer, head) pairs ablation removes, each in rows of its own, in their order."""
    return [(layer, head) for layer in sorted(layers) for head in heads]


def batches_of(lengths: Sequence[int], batch_size: int | None = None) -> list[list[int]]:
    """The batches of texts importance runs, given every text's length: `batch_size` rows each
    (default: as many as fit TOKEN_BUDGET padded tokens of the longest text)."""
    n, size = len(lengths), batch_size or max(1, TOKEN_BUDGET // max(lengths))
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


class ImportanceRun:
    """Head importance by one method over a corpus's texts, in parts that any process can run:
    `clean` over some of the run's batches of texts (the objective with nothing removed, the
    heads' mean outputs for mean ablation, and for gradient everything), then, for ablation,
    `ablate` over the same batches given the means over all of them. The parts'
    `ImportanceSums` merge exactly; `result` turns the whole into scores.

    `texts` maps a text's index in the corpus to its encoding (those of the batches this
    process runs are enough); `lengths` are every text's token counts, which fix the batches
    (as many rows as fit TOKEN_BUDGET padded tokens, or `batch_size`).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        texts: dict[int, Encoded],
        lengths: Sequence[int],
        method: str = "ablation",
        ablation: str = "zero",
        layers: list[int] | None = None,
        heads: list[int] | None = None,
        batch_size: int | None = None,
        reuse: bool = True,
    ) -> None:
        if method not in METHODS:
            raise InputError(f"unknown importance method '{method}'; known: {', '.join(METHODS)}")
        if ablation not in ABLATIONS:
            raise InputError(f"unknown ablation '{ablation}'; known: {', '.join(ABLATIONS)}")
        if not lengths:
            raise InputError("importance needs at least one text")
        info = loaded.info
        self.loaded, self.method, self.ablation = loaded, method, ablation
        self.layers, self.heads = info.pick_layers(layers), info.pick_heads(heads)
        self.objective = check_method(loaded, method)
        items = {i: _item(loaded, i, encoded, self.objective) for i, encoded in texts.items()}
        self.scorer = _Scorer(loaded, items, self.objective)
        self.rows_per_batch = batch_size or max(1, TOKEN_BUDGET // max(lengths))
        self.batches = batches_of(lengths, batch_size)
        self.lengths = list(lengths)
        self.configs = _configs(self.layers, self.heads)
        blocks = _layer_blocks(loaded.model, info.n_layers) if method == "ablation" else None
        self.blocks = blocks if reuse else None
        self.lower: _LowerLayers | None = None  # the lower layers' outputs of one batch

    def clean(
        self, parts: Sequence[int], on_progress: Callable[[int, int], None] | None = None
    ) -> ImportanceSums:
        """The sums of the batches `parts` (indices into `batches`) with nothing removed: the
        objective's terms and, for mean ablation, the heads' outputs; for gradient, the
        gates' gradients too (`on_progress(done, total)` after each batch)."""
        sums = ImportanceSums()
        sums.weight = sum(self.scorer.items[i].weight for b in parts for i in self.batches[b])
        if self.method == "gradient":
            for done, b in enumerate(parts, start=1):
                self._gradient(sums, b)
                if on_progress:
                    on_progress(done, len(parts))
            return sums
        if self.objective.name == "embedding-cosine":
            for b in parts:
                pooled = self.scorer.pooled(self.batches[b])
                self.scorer.reference.update(zip(self.batches[b], pooled))
        for b in parts:
            rows = self.batches[b]
            also: list[Any] = []
            means = None
            if self.ablation == "mean":
                means = _HeadMeans(self.layers, _mask(self.loaded, self._encoded(rows)))
                also.append(means)
            if self.blocks is not None and self.lower is None:
                self.lower = _LowerLayers(self.blocks, rows, max(self.layers), self.loaded.device)
                also.append(self.lower)
            sums.clean.add(b, [float(self.scorer.run(rows, also=also).sum())])
            if means is not None:
                import torch

                sums.means.add(b, torch.stack([means.sums[layer] for layer in self.layers]).cpu())
                sums.tokens += sum(self.lengths[i] for i in rows)
        return sums

    def _gradient(self, sums: ImportanceSums, b: int) -> None:
        """Batch `b`'s objective terms and their gradient with respect to a gate ξ_h = 1 on
        each head's output."""
        import torch

        info = self.loaded.info
        dtype = next(self.loaded.model.parameters()).dtype
        gates = torch.ones((info.n_layers, info.n_heads), dtype=dtype, device=self.loaded.device)
        gates.requires_grad_(True)

        def gated(layer: int, x: Any) -> Any:
            gate = gates[layer].to(x.device)  # a layer accelerate put on another GPU
            return (_split_heads(x, info.n_heads) * gate[None, None, :, None]).reshape(
                x.shape
            )  # (B, T, H, d_head) times each head's gate

        value = self.scorer.run(self.batches[b], gated, gradients=True).sum()
        (grad,) = torch.autograd.grad(value, gates)
        sums.scored.add(b, grad.double().cpu().numpy())
        sums.clean.add(b, [float(value.detach())])

    def means(self, sums: ImportanceSums) -> dict[int, Any] | None:
        """For mean ablation, each chosen layer's W_O input averaged over every token of the
        texts, from the sums of all the batches."""
        import torch

        if self.ablation != "mean" or self.method != "ablation":
            return None
        total = sums.means.total()  # (len(layers), H·d_head)
        return {
            layer: torch.from_numpy(total[k] / sums.tokens) for k, layer in enumerate(self.layers)
        }

    def _encoded(self, rows: Sequence[int]) -> list[Encoded]:
        return [self.scorer.items[i].encoded for i in rows]

    def ablate(
        self,
        sums: ImportanceSums,
        parts: Sequence[int],
        means: dict[int, Any] | None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Add to `sums` each (layer, head)'s objective terms over the batches `parts`, the
        head removed (zero, or `means`). A pass holds one batch of texts and one layer's
        heads, in rows of their own, so that it can start at that layer."""
        import numpy as np
        import torch

        passes = []  # (the batch of texts, the layer, rows (config, text))
        for b in parts:
            for layer in sorted(self.layers):
                pairs = [(c, t) for c, (at, _) in enumerate(self.configs) if at == layer
                         for t in self.batches[b]]  # fmt: skip
                size = -(-len(pairs) // -(-len(pairs) // self.rows_per_batch))  # as even as can be
                passes += [(b, layer, pairs[s : s + size]) for s in range(0, len(pairs), size)]
        scored = {b: np.zeros(len(self.configs)) for b in parts}
        n_heads = self.loaded.info.n_heads
        for done, (b, layer, batch) in enumerate(passes, start=1):
            rows = self.batches[b]
            if self.lower is not None and self.lower.texts != rows:
                # A later batch of texts: the clean pass again, its lower outputs kept for this
                # batch of texts alone (memory stays flat).
                self.lower = _LowerLayers(self.blocks, rows, max(self.layers), self.loaded.device)
                self.scorer.run(rows, also=[self.lower])
            texts_of = [t for _, t in batch]
            starting = nullcontext()
            if self.lower is not None:
                starting = self.lower.starting_at(layer, texts_of, self.scorer.width(texts_of))
            drops = torch.zeros((len(batch), n_heads), dtype=torch.bool)
            for r, (c, _) in enumerate(batch):
                drops[r, self.configs[c][1]] = True
            with starting:
                values = self.scorer.run(texts_of, ablating({layer: drops}, n_heads, means))
            np.add.at(scored[b], [c for c, _ in batch], values.cpu().numpy())  # (B,) each
            if on_progress:
                on_progress(done, len(passes))
        for b in parts:
            sums.scored.add(b, scored[b])

    def result(self, sums: ImportanceSums) -> Importance:
        """The scores from the sums of every batch."""
        return score(sums, self.loaded.info, self.objective, self.method, self.ablation,
                     self.layers, self.heads, len(self.lengths))  # fmt: skip


def score(
    sums: ImportanceSums,
    info: ModelInfo,
    objective: Objective,
    method: str,
    ablation: str,
    layers: list[int],
    heads: list[int],
    n_texts: int,
) -> Importance:
    """Each head's score from the sums of every batch of an `ImportanceRun` (no model needed)."""
    import numpy as np

    if sums.weight == 0:
        raise InputError("the texts give the objective nothing to score: each is one token long")
    scores = np.full((info.n_layers, info.n_heads), np.nan)
    clean = float(sums.clean.total()[0]) / sums.weight
    if method == "gradient":
        pick = np.ix_(layers, heads)
        scores[pick] = np.abs(sums.scored.total()[pick]) / sums.weight
        return _result(scores, clean, objective, method, None, n_texts, layers, heads)
    # The embedding objective is 0 with nothing removed by definition (the rest is rounding).
    clean = 0.0 if objective.at_optimum else clean
    scored = sums.scored.total()
    for c, (layer, head) in enumerate(_configs(layers, heads)):
        scores[layer, head] = scored[c] / sums.weight - clean
    return _result(scores, clean, objective, method, ablation, n_texts, layers, heads)


def importance(
    loaded: LoadedModel,
    texts: Sequence[Encoded],
    method: str = "ablation",
    ablation: str = "zero",
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    batch_size: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    reuse: bool = True,
) -> Importance:
    """Each chosen head's importance (default: every head) to the model's objective over
    `texts`, by `method` ("ablation" or "gradient"), in one process (`ImportanceRun`).

    `batch_size` is rows per forward pass (default: as many as fit TOKEN_BUDGET padded
    tokens); `on_progress(done, total)` is called after each batch. `reuse=False` runs every
    layer of every ablated copy instead of starting it at its ablated layer (the same scores,
    to rounding: for tests and benchmarks).
    """
    run = ImportanceRun(loaded, dict(enumerate(texts)), [len(t) for t in texts], method,
                        ablation, layers, heads, batch_size, reuse)  # fmt: skip
    every = range(len(run.batches))
    sums = run.clean(every, on_progress)
    if method == "ablation":
        run.ablate(sums, every, run.means(sums), on_progress)
    return run.result(sums)


def _mask(loaded: LoadedModel, batch: list[Encoded]) -> Any:
    """(B, W) on the CPU: 1 for each text's tokens, 0 for padding."""
    from attnviz.core.tokens import pad

    return pad(loaded, batch)["attention_mask"].cpu()


def _result(scores, clean, objective, method, ablation, n_texts, layers, heads) -> Importance:
    return Importance(
        scores=scores,
        clean=float(clean),
        objective=objective.help,
        objective_name=objective.name,
        unit=objective.unit,
        method=method,
        ablation=ablation,
        texts=n_texts,
        layers=tuple(layers),
        heads=tuple(heads),
        short=objective.short,
    )


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two score arrays over the cells finite in both (ties
    share their mean rank); NaN with fewer than two such cells or a constant side."""
    import numpy as np

    both = np.isfinite(a) & np.isfinite(b)
    if both.sum() < 2:
        return float("nan")
    x, y = _mean_ranks(a[both]), _mean_ranks(b[both])
    x, y = x - x.mean(), y - y.mean()
    spread = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / spread) if spread > 0 else float("nan")


def _mean_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1…n of `values`, tied values sharing the mean of their ranks."""
    import numpy as np

    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks
