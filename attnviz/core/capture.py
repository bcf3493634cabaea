"""The one place attnviz runs a model with hooks: one forward pass over a batch hands each
caller, layer by layer, exactly the tensors it asked for.

What a caller can ask for, per layer (`KINDS`):

    input   X (B, T, d_model): the attention block's input (a pre-LN decoder's X is already
            normalised; a post-LN encoder's is the previous layer's output)
    probs   (B, H, T, T): the attention probabilities, every row summing to 1
    output  (B, T, d_model): the block's output after W_O, before residual and normalisation
    residual (B, T, d_model): the residual stream the block's output is added to (X itself in
            a post-LN encoder; in a pre-LN decoder the stream before its input norm)
    heads   (B, T, H·d_head): W_O's input, the heads' outputs side by side (head h's slice is
            h·d_head … (h+1)·d_head); grouped-query models have one slice per query head
    kv_input (B, S, d_model): what the keys and values are made of: X itself in
            self-attention, the encoder's last hidden states in cross-attention
    scores  the layer's q and k as the model hands them to its attention, with its mask and
            extras (`recording.Scores`, on the CPU): any head's rows can be made from them
            later (`serve`'s tiles); attnviz's attention function only
    values  (B, H_kv, S, d_head) float32: the layer's v as the model hands it to its
            attention (after its projection and any norm); key head g serves query heads
            g·G … g·G + G − 1; attnviz's attention function only

An encoder-decoder model (T5, BART) has three stacks of attention layers, "encoder",
"decoder" and "cross" (`layer_map.STACKS`); a recorder's `stack` says which one its layers
are in (every other model has one stack, None, but a vision-language model, whose vision
tower's layers are the stack "vision" beside its language model's: `layer_map.generic.VISION`).

    rows    blocks of `probs`' query rows, for callers that keep running sums and never
            hold a layer's whole matrix: such a recorder's `receive_rows(layer, start, rows)`
            gets rows start … start+b−1 of every head, (B, H, b, W), block after block,
            after its `receive` has had the layer's other kinds it asked for; W ≤ S keys
            (a decoder's block stops at its last query: the later keys hold 0)
    entropy with `rows`: each row's entropy −Σ p ln p too, (B, H, b) float32, handed as
            `receive_rows(layer, start, rows, entropy)`; attnviz's function takes it from its
            softmax's own sums (`recording.Scores.rows`), no logarithm per cell

A `rows` recorder may register what it reads of every row of a block (`core.reductions`: a
row's sums over weighted keys, a key's over weighted queries, bins of rows pooled, a row's
largest weight) with `reductions(layer)`: every recorder's are read in one place from each
block while it is in cache, and handed beside the block as `receive_rows(…, found=[its
results])`. The attention function asks for them (`reductions(site)`) before it makes a
block, so that on the CPU the compiled pass makes them with the rows (`core.fused`); else
they are read here from the block.

The model runs attnviz's attention function (`core.recording`): `probs`, `rows`, `entropy`,
`heads` and `scores` come from inside the model's own attention call, the probabilities made
from its q and k a block of `block_rows` query rows at a time; the other kinds from hooks on
the modules the layer map names (`core.layer_map`, asked once a pass). With eager attention
(`--attention eager`, `check`) `probs` is read from the attention module's output instead. A
model type whose attention bypasses transformers' interface (BLOOM, GPT-Neo, Falcon before
transformers 5.25, …) runs eager with `output_attentions`: its attention modules are found once
by `own_attention`, and each layer's probabilities, read, are dropped from the module's output,
as the model drops them without `output_attentions`, so that no more than one layer's are held
at once.

A caller is a `Recorder`: the layers and kinds it wants, and a `receive(layer, tensors)`
called once that layer has produced all of them. Tensors are moved to the CPU as they come
and dropped once every recorder that wanted them has had them, so a long text's layers are
never all held at once (30 layers × 9 heads × 2,048² floats is 4.5 GB). Several recorders
share one pass: `show --html` gets its weights and the inside view's inputs from one run.

An `edit` changes the model as it runs (head ablation and gates, `analysis.importance`): it
gets each layer's W_O input (B, T, H·d_head) and returns what W_O reads instead; with
`gradients`, the pass records a graph so that a loss can be differentiated with respect to
tensors the edit used (the gates), and no weight changes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from attnviz.core import layer_map
from attnviz.core.layer_map import LayerMap, LayerModules, Site
from attnviz.core.model_info import language_config
from attnviz.errors import InputError, UnsupportedModelError

KINDS = ("input", "probs", "output", "residual", "heads", "kv_input", "scores", "values")
VISION = layer_map.generic.VISION  # the stack of a vision-language model's vision tower
ROWS = "rows"  # blocks of probability rows, for a recorder with `receive_rows` (see above)
ENTROPY = "entropy"  # with ROWS: each row's entropy beside it (see above)

# What an edit is: (layer, W_O input (B, T, H·d_head)) -> the tensor W_O reads instead.
Edit = Callable[[int, Any], Any]


class Recorder(Protocol):
    """What one caller of `run` wants, and where its tensors go (a recorder may also have a
    `stack`: which stack of an encoder-decoder model its layers are in)."""

    wants: Mapping[int, Sequence[str]]  # layer -> kinds, from KINDS

    def receive(self, layer: int, tensors: dict[str, Any]) -> None: ...


@dataclass
class Each:
    """A recorder from a function: `receive(layer, {kind: tensor})` for each of `layers`."""

    layers: Sequence[int]
    kinds: Sequence[str]
    receive: Callable[[int, dict[str, Any]], None]
    stack: str | None = None

    @property
    def wants(self) -> dict[int, Sequence[str]]:
        return {layer: self.kinds for layer in self.layers}


def run(
    loaded: Any,
    inputs: dict[str, Any],
    recorders: Sequence[Recorder],
    lm_head: bool = False,
    edit: Edit | None = None,
    gradients: bool = False,
    block_rows: int | None = None,
    reading: Any = None,
) -> Any:
    """Run `loaded`'s model once over `inputs` (padded ids and mask, see `tokens.pad`), feeding
    every recorder, and return the model's output.

    Without `lm_head` only the base model runs (no logits over the vocabulary); with it, the
    whole model, for callers that need the loss. `edit` replaces each layer's W_O input as
    the model runs; `gradients` runs with autograd on (for gates inside `edit`); `block_rows`
    is how many query rows each block of probabilities holds: given, the run is a streamed
    one (`memory.stream_rows`), whose freed blocks the allocator keeps for the next
    (`memory.reuse_freed_blocks`). With `reading` (`generation.Reading`: a decoder's prompt and
    the continuation it wrote or was given) the model does not run: the rows it used are
    handed out from what that pass kept, and recorders may ask for nothing else.
    """
    import torch

    from attnviz.core import memory, recording

    if block_rows is not None:
        memory.reuse_freed_blocks()

    model = loaded.model
    where = layer_map.of(model)
    wanted = _wanted(loaded, where, recorders)
    rows = recording.BLOCK_ROWS if block_rows is None else block_rows
    if rows < 1:
        raise InputError(f"block_rows must be at least 1, not {rows}")
    if reading is not None:
        return _replayed(loaded, where, recorders, wanted, rows, reading)
    inside = records(model)
    heard = _Pass(loaded, where, recorders, wanted, inside, rows, edit if inside else None)
    hooked = {site: heard.hooked(site) for site in wanted}
    read = sorted(_unhookable(where, hooked))
    if read:
        raise UnsupportedModelError(
            f"this needs each layer's {', '.join(read)}, which attnviz reads through its "
            f"adapters; '{model.config.model_type}' has none (docs/models.md)"
        )
    mode = torch.enable_grad() if gradients else torch.inference_mode()
    listen = recording.listening(heard) if inside else _nothing()
    asked = {"output_attentions": True} if where.own else {}  # its modules hand them out
    with _hooked(where, hooked, heard.arrive, None if inside else edit), listen, mode:
        output = (model if lm_head else model.base_model)(**inputs, **asked)
    heard.check_served()
    memory.return_freed_memory()  # the pass's activations, not held while the figures draw
    return output


def _wanted(loaded: Any, where: LayerMap, recorders: Sequence[Recorder]) -> dict[Site, set[str]]:
    """{site: the kinds asked of it} over `recorders`, each checked against the model's
    stacks (`where`)."""
    stacks = where.stacks
    wanted: dict[Site, set[str]] = {}
    for recorder in recorders:
        if _stack(recorder) not in stacks:  # a one-stack caller on an encoder-decoder model
            raise UnsupportedModelError(
                f"this reads models with one attention stack; {loaded.info.name} is an "
                "encoder-decoder model (docs/seq2seq.md says what works on it)"
            )
        for layer, kinds in recorder.wants.items():
            unknown = set(kinds) - {*KINDS, ROWS, ENTROPY}
            if unknown:
                raise ValueError(f"unknown capture kinds {sorted(unknown)}; known: {KINDS}")
            if {"probs", ROWS} <= set(kinds):
                raise ValueError("a recorder takes a layer's probabilities whole or in rows")
            wanted.setdefault((_stack(recorder), layer), set()).update(kinds)
    return wanted


def listener(loaded: Any, recorders: Sequence[Recorder]) -> Any:
    """What feeds `recorders` from a pass something else runs and listens to (the prompt pass
    of `core.generation`, whose listener hands it the vision tower's sites): a
    `recording.Listener` that serves each recorder its rows as `run` would, for recorders
    that ask for rows alone; its `check_served()` after the pass says, in one line, if a
    site it wanted never came."""
    from attnviz.core import recording

    where = layer_map.of(loaded.model)
    wanted = _wanted(loaded, where, recorders)
    other = sorted({kind for kinds in wanted.values() for kind in kinds} - {ROWS, ENTROPY})
    if other:
        raise ValueError(f"a listener serves rows alone, not {', '.join(other)}")
    return _Pass(loaded, where, recorders, wanted, True, recording.BLOCK_ROWS, None)


# Which module each hooked kind is read at (see `_hooked`): X's projection, W_O, the module
# whose input is the residual stream, and the one whose input makes the keys and values.
_AT = {"input": ("q",), "output": ("o",), "heads": ("o",), "residual": ("residual", "q"),
       "kv_input": ("kv_input", "q")}  # fmt: skip


def _unhookable(where: LayerMap, hooked: Mapping[Site, set[str]]) -> set[str]:
    """The kinds asked of a site whose module the layer map (its family's, or `generic`'s for
    a model without one) does not name."""
    missing = set()
    for site, kinds in hooked.items():
        mods = where.modules[site]
        for kind in kinds - {"probs"}:
            if all(getattr(mods, name) is None for name in _AT[kind]):
                missing.add(kind)
    return missing


def trace(model: Any, roots: Sequence[Any]) -> dict[int, list[list]]:
    """One pass of `model`'s base model over four tokens with every module under each of
    `roots` (a model's layers) traced: {id(root): its calls in order, each [module, order,
    first float input, output (the first of a tuple)]}. What `core.residual` reads how a
    block joins the residual stream from."""
    import torch

    seen: dict[int, list[list]] = {}
    handles = []

    def first_tensor(args: Any, kwargs: Any) -> Any:
        for value in (*args, kwargs.get("hidden_states"), *kwargs.values()):
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                return value
        return None

    def pre(calls: list, module: Any, args: Any, kwargs: Any) -> None:
        calls.append([module, len(calls), first_tensor(args, kwargs), None])

    def post(calls: list, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        call = next(c for c in reversed(calls) if c[0] is module and c[3] is None)
        call[3] = output[0] if isinstance(output, (tuple, list)) else output

    for root in {id(r): r for r in roots}.values():
        calls = seen.setdefault(id(root), [])
        for module in root.modules():
            before, after = functools.partial(pre, calls), functools.partial(post, calls)
            handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(module.register_forward_hook(after, with_kwargs=True))
    try:
        vocab = getattr(language_config(model.config), "vocab_size", None) or 4
        ids = (torch.arange(4) % vocab)[None].to(model.device)
        with torch.inference_mode():
            model.base_model(input_ids=ids)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def own_attention(model: Any, name: str) -> list[tuple[Any, int]]:
    """Where a model whose attention bypasses transformers' interface hands out each layer's
    probabilities: [(its attention module, the place in that module's output tuple)], layer
    0 first. One pass over four tokens with `output_attentions` and every module of the base
    model watched: layer i's is the innermost module whose output holds the very tensor the
    model hands back as its attentions[i] (a (B, H, T, T) array). A one-line
    UnsupportedModelError (`name`, the model's) where the model hands none back, one that no
    module's output holds (made anew after the modules), or one of another shape
    (Longformer's, a band of keys around each query)."""
    import torch

    seen: dict[int, tuple[Any, int, Any]] = {}  # id(tensor): (module, place, tensor kept)
    handles = []

    def hook(module: Any, args: Any, output: Any) -> None:
        if isinstance(output, (tuple, list)):
            for at, value in enumerate(output):
                if isinstance(value, torch.Tensor):  # the innermost module's comes first
                    seen.setdefault(id(value), (module, at, value))

    for module in model.base_model.modules():
        handles.append(module.register_forward_hook(hook))
    try:
        vocab = getattr(model.config, "vocab_size", None) or 4
        ids = (torch.arange(4) % vocab)[None].to(model.device)
        with torch.inference_mode():
            out = model.base_model(input_ids=ids, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    attentions = getattr(out, "attentions", None) or ()
    found = [seen.get(id(probs)) for probs in attentions]
    square = all(probs.dim() == 4 and probs.shape[-2:] == (4, 4) for probs in attentions)
    if not found or None in found or not square:
        raise UnsupportedModelError(
            f"{name} ('{model.config.model_type}') computes its attention in its own code, "
            "and none of its modules hands out each layer's (T, T) probabilities, which "
            "attnviz reads there (docs/models.md)"
        )
    return [(module, at) for module, at, _ in found]


def _replayed(loaded: Any, where: LayerMap, recorders: Sequence[Recorder], wanted: dict,
              block_rows: int, reading: Any) -> None:  # fmt: skip
    """`run` over a continuation's held rows (`generation.Reading.replay`)."""
    other = sorted({kind for kinds in wanted.values() for kind in kinds} - {"probs", ROWS, ENTROPY})
    if other:
        raise UnsupportedModelError(
            f"this needs each layer's {', '.join(other)}; a generated or given continuation "
            "keeps each layer's attention alone"
        )
    heard = _Pass(loaded, where, recorders, wanted, True, block_rows, None)
    reading.replay(heard, block_rows)
    heard.check_served()


INSIDE = {"probs", ROWS, ENTROPY, "heads", "scores", "values"}  # what attnviz's function hands out


def fast_attention(loaded: Any) -> str | None:
    """What layers nobody wants run (`recording.Listener.fast`): the model's fast attention
    (SDPA, flash_attention_2), or None: attnviz's blocks, recording nothing, for a model
    transformers runs without SDPA."""
    return loaded.info.implementation if getattr(loaded.model, "_supports_sdpa", True) else None


def records(model: Any) -> bool:
    """Whether `model` runs attnviz's attention function (`core.recording`), which records
    the probabilities inside the model's attention call; else it runs eager attention and
    `probs` are read from its attention modules."""
    from attnviz.core.recording import NAMES

    return getattr(model.config, "_attn_implementation", "eager") in NAMES


@contextmanager
def own_probabilities(model: Any) -> Iterator[None]:
    """`model` runs eager attention for the duration, so that `probs` are the model's own
    (what `check` compares with), not recorded by attnviz's function; its own after."""
    before = model.config._attn_implementation if records(model) else None
    if before is not None:
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if before is not None:
            model.set_attn_implementation(before)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


class _Pass:
    """One pass's bookkeeping: which tensors each site still waits for, the blocks of rows
    as the attention function hands them out (`recording.Listener`), and each recorder
    served once its site has all it asked for.

    A `rows` recorder gets its layer's other kinds before the blocks where they come first
    (X, the residual stream); where one comes only after the attention call (the block's
    output after W_O), its blocks wait until it has come.

    A layer whose module calls the attention function several times in one pass (a vision
    tower's windows or images: Qwen2.5-VL's, one call a window over its own tokens) hands
    each call's blocks in turn, each over that call's queries and keys alone; a recorder of
    such a layer says it reads them so (`calls = True`) and gets `receive_rows(…, call=n)`,
    n the layer's calls before this one in the pass; any other is refused at the second
    call rather than handed rows it would take for the layer's whole."""

    def __init__(self, loaded: Any, where: LayerMap, recorders: Sequence[Recorder], wanted: dict,
                 inside: bool, block_rows: int, edit: Edit | None) -> None:  # fmt: skip
        self.loaded, self.recorders, self.wanted = loaded, recorders, wanted
        self.inside, self.block_rows, self.edit = inside, block_rows, edit
        self.fast = fast_attention(loaded)
        self.entropy = any(ENTROPY in kinds for kinds in wanted.values())
        self._unserved = set(wanted)  # sites whose recorders have not had their tensors
        self._seen: dict[Site, dict[str, Any]] = {}
        self._waiting: dict[Site, list] = {}  # blocks held for recorders not yet served
        self._served: dict[Site, set[int]] = {}  # id(recorder) served its other kinds
        self._calls: dict[Site, int] = {}  # each site's calls finished in this pass
        self._asking: dict[Site, dict] = {}  # the reads `reductions` asked for the next block
        self._sites = Callers(where) if inside else None

    # what the hooks deliver ------------------------------------------------------------
    def hooked(self, site: Site) -> set[str]:
        """The kinds hooked at `site`: all but what the attention function hands out where
        it runs; with eager attention `rows` are cut from the module's `probs`."""
        kinds = set(self.wanted[site])
        if self.inside:
            return kinds - INSIDE
        if kinds & {"probs", ROWS}:
            kinds.add("probs")
        return kinds - {ROWS, ENTROPY}

    def arrive(self, kind: str, site: Site, tensor: Any) -> None:
        self._seen.setdefault(site, {})[kind] = tensor.detach().cpu()
        self._serve(site)

    # what the attention function hands out (`recording.Listener`) ---------------------
    def site(self, module: Any) -> Site | None:
        return self._sites.site(module)

    def wants(self, site: Site, shape: tuple[int, int, int, int]) -> bool:
        if not self.wanted.get(site, set()) & {"probs", ROWS}:
            return False
        if self._calls.get(site) and not all(getattr(r, "calls", False) for r in self._mine(site)):
            stack, layer = site
            raise UnsupportedModelError(
                f"layer {layer}{f' of the {stack} stack' if stack else ''} of "
                f"'{self.loaded.model.config.model_type}' runs its attention in several calls "
                "(one a window or an image), which this reads as one"
            )
        if "probs" in self.wanted[site]:  # (B, H, T, S) float32, filled by the blocks
            import torch

            self._seen.setdefault(site, {})["probs"] = torch.zeros(shape)
        return True

    def scores(self, site: Site, scores: Any, value: Any) -> None:
        wanted = self.wanted.get(site, ())
        if "scores" in wanted:
            self._seen.setdefault(site, {})["scores"] = scores.cpu()
        if "values" in wanted:
            self._seen.setdefault(site, {})["values"] = value.detach().float().cpu()

    def reductions(self, site: Site) -> tuple:
        self._seen.setdefault(site, {})
        takers = [r for r in self._takers(site) if self._ready(site, r)]
        self._asking[site] = asked = _asked(takers, site[1])
        return tuple(reduction for mine in asked.values() for reduction in mine)

    def block(self, site: Site, start: int, rows: Any, entropy: Any, found: Any = None) -> None:
        rows = rows.detach().cpu()
        entropy = entropy.detach().cpu() if entropy is not None else None
        got = self._seen.setdefault(site, {})
        takers = self._takers(site)
        ready = {id(recorder) for recorder in takers if self._ready(site, recorder)}
        # what the ready recorders read of the block: made with it by the function (`found`,
        # as `reductions` asked it), or here; one still waiting for its other kinds reads
        # its block itself when served
        asked = self._asking.pop(site, None)
        if found is not None and asked is not None and asked.keys() <= ready:
            parts = iter(found)
            by = {key: [next(parts) for _ in mine] for key, mine in asked.items()}
        else:
            by = _read([r for r in takers if id(r) in ready], site[1], start, rows)
        for recorder in takers:
            if id(recorder) in ready:
                self._give_rows(recorder, site, start, rows, entropy, by.get(id(recorder)))
            else:
                self._waiting.setdefault(site, []).append((recorder, start, rows, entropy))
        if self.inside and "probs" in got:  # a decoder's block stops at its last query's key
            got["probs"][:, :, start : start + rows.shape[2], : rows.shape[3]] = rows

    def done(self, site: Site, heads: Any) -> Any:
        if site in self.wanted:
            got = self._seen.setdefault(site, {})
            if "heads" in self.wanted[site]:
                got["heads"] = heads.detach().cpu()
            got["called"] = True
        # an edit acts on the language model's heads (its layers'), not another stack's
        edit = self.edit if site[0] is None else None
        edited = edit(site[1], heads) if edit is not None else heads
        self._serve(site)
        if site in self.wanted:
            self._calls[site] = self._calls.get(site, 0) + 1
        return edited

    # serving ---------------------------------------------------------------------------
    def _mine(self, site: Site) -> list:
        stack, layer = site
        return [r for r in self.recorders if _stack(r) == stack and r.wants.get(layer)]

    def _takers(self, site: Site) -> list:
        return [r for r in self._mine(site) if ROWS in r.wants[site[1]]]

    def _ready(self, site: Site, recorder: Recorder) -> bool:
        """Whether `recorder`'s other kinds at `site` have come; served them if so."""
        layer, got = site[1], self._seen[site]
        others = [k for k in recorder.wants[layer] if k not in (ROWS, ENTROPY)]
        if any(k not in got for k in others):
            return False
        served = self._served.setdefault(site, set())
        if id(recorder) not in served:
            served.add(id(recorder))
            recorder.receive(layer, {k: got[k] for k in others})
        return True

    def _give_rows(self, recorder: Recorder, site: Site, start: int, rows: Any, entropy: Any,
                   found: Any = None):  # fmt: skip
        layer = site[1]
        given = (rows, entropy) if ENTROPY in recorder.wants[layer] else (rows,)  # (B, H, b, W)
        named = {} if found is None else {"found": found}
        if getattr(recorder, "calls", False):  # which of the layer's calls these rows are of
            named["call"] = self._calls.get(site, 0)
        recorder.receive_rows(layer, start, *given, **named)

    def _complete(self, site: Site) -> bool:
        needs = self.hooked(site) | ({"called"} if self.inside else set())
        return needs <= self._seen.get(site, {}).keys()

    def _serve(self, site: Site) -> None:
        if site not in self.wanted or not self._complete(site):
            return
        got, layer = self._seen[site], site[1]
        if not self.inside and self.wanted[site] & {"probs", ROWS}:
            got["probs"] = got["probs"].float()  # a half-precision model's own, as float32
            self._cut_rows(site, got["probs"])
        for recorder in self._takers(site):
            self._ready(site, recorder)
        for recorder, start, *given in self._waiting.pop(site, []):
            self._give_rows(recorder, site, start, *given)
        for recorder in self._mine(site):
            if ROWS not in recorder.wants[layer]:
                recorder.receive(layer, {kind: got[kind] for kind in recorder.wants[layer]})
        del self._seen[site]  # every recorder has had this layer's tensors
        self._served.pop(site, None)
        self._unserved.discard(site)

    def check_served(self) -> None:
        """After the pass: every wanted site was served, or a one-line error says which was
        not (its attention never reached attnviz's function), rather than a silent gap."""
        if self._unserved:
            stack, layer = min(self._unserved, key=lambda site: (str(site[0]), site[1]))
            where = f"layer {layer}" + (f" of the {stack} stack" if stack else "")
            raise UnsupportedModelError(
                f"{where} of '{self.loaded.model.config.model_type}' gave attnviz nothing: its "
                "attention did not go through transformers' attention interface"
            )

    def _cut_rows(self, site: Site, whole: Any) -> None:
        """Eager attention: the module's whole (B, H, T, S) matrix, handed out in blocks."""
        import torch

        if not self._takers(site):
            return
        for start in range(0, whole.shape[2], self.block_rows):
            part = whole[:, :, start : start + self.block_rows]
            entropy = torch.special.entr(part).sum(dim=-1) if self.entropy else None
            self.block(site, start, part, entropy)


class Callers:
    """Which site (stack, layer) a module calling the attention function is. A module shared
    by several layers (ALBERT) is called once per layer, in order: its n-th call is the
    n-th layer that uses it."""

    def __init__(self, where: LayerMap) -> None:
        self._users = where.callers
        self._calls: dict[int, int] = {}

    def site(self, module: Any) -> Site | None:
        users = self._users.get(id(module))
        if users is None:
            return None
        n = self._calls.get(id(module), 0)
        self._calls[id(module)] = n + 1
        return users[n % len(users)]


def _asked(takers: Sequence[Recorder], layer: int) -> dict[int, tuple]:
    """What each of the recorders of a block registers of it (`core.reductions`: a
    recorder's `reductions(layer)`): {id(recorder): its reductions, in its order}."""
    return {id(r): tuple(r.reductions(layer)) for r in takers if hasattr(r, "reductions")}


def _read(takers: Sequence[Recorder], layer: int, start: int, rows: Any) -> dict[int, list]:
    """What the recorders of a block register of it (`_asked`), read in one place while the
    block is in cache: {id(recorder): its results, in the order it asked}."""
    from attnviz.core import reductions

    asked = _asked(takers, layer)
    if not asked:
        return {}
    found = iter(reductions.read(rows, start, [r for mine in asked.values() for r in mine]))
    return {key: [next(found) for _ in mine] for key, mine in asked.items()}


def _stack(recorder: Recorder) -> str | None:
    return getattr(recorder, "stack", None)


@contextmanager
def _hooked(
    where: LayerMap,
    wanted: Mapping[Site, set[str]],
    arrive: Callable[[str, Site, Any], None],
    edit: Edit | None = None,
) -> Iterator[None]:
    """Hooks that pass each wanted (kind, site) tensor to `arrive` as the layer runs, and
    one that lets `edit` replace each layer's W_O input. On a model run with
    `output_attentions` (`where.own`), each attention module's probabilities are dropped
    from its output once read: the model then keeps none of them to hand back at the end.

    Modules shared by several layers (ALBERT) are called once per layer, in order, so the
    n-th call of a shared module belongs to the n-th layer that uses it.
    """
    sites: list[tuple[Site, LayerModules]] = list(where.modules.items())
    if edit is not None and sites[0][0][0] is not None:
        raise ValueError("edits (head ablation, gates) are for models with one attention stack")
    handles: list[Any] = []

    def install(
        sites_of: Sequence[Site], pick: Callable[[LayerModules], Any], before: bool, act: Callable
    ) -> None:
        handles.extend(_install(sites, sites_of, pick, before, act))

    def record(kind: str, pick: Callable[[LayerModules], Any], before: bool, take: Callable):
        def act(site: Site, mods: LayerModules, args: Any, output: Any) -> None:
            arrive(kind, site, take(mods, args, output))

        install([site for site, kinds in wanted.items() if kind in kinds], pick, before, act)

    def first(_: LayerModules, args: Any, __: Any) -> Any:
        return args[0]

    record("input", lambda m: m.q, True, first)
    record("output", lambda m: m.o, False, lambda _, __, output: output)
    record("residual", lambda m: m.q if m.residual is None else m.residual, True, first)
    record("probs", lambda m: m.attention, False, lambda mods, _, output: output[mods.probs_at])
    record("heads", lambda m: m.o, True, first)
    record("kv_input", lambda m: m.q if m.kv_input is None else m.kv_input, True, first)
    if edit is not None:
        # After "heads": a recorder sees what the heads computed, W_O what the edit made of it.
        install(
            [site for site, _ in sites if site[0] is None],  # the language model's alone
            lambda m: m.o,
            True,
            lambda site, _, args, __: (edit(site[1], args[0]),),
        )
    if where.own:  # after "probs": a recorder has had them
        install([site for site, _ in sites], lambda m: m.attention, False, _dropped)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _dropped(_: Site, mods: LayerModules, __: Any, output: Any) -> tuple:
    """An attention module's output without its probabilities (None in their place, as the
    module returns without `output_attentions`)."""
    at = mods.probs_at
    return (*output[:at], None, *output[at + 1 :])


def _install(
    sites: list[tuple[Site, LayerModules]],
    sites_of: Sequence[Site],
    pick: Callable[[LayerModules], Any],
    before: bool,
    act: Callable,
) -> list[Any]:
    """Hook the module `pick` names in each of `sites`; `act(site, mods, args, output)` runs
    for `sites_of`, and what it returns (None: nothing) replaces the module's input or
    output. The hooks' handles."""
    if not sites_of:
        return []
    users: dict[int, list[tuple]] = {}  # id(module) -> the sites that call it, in order
    for site, mods in sites:
        users.setdefault(id(pick(mods)), []).append((site, mods))
    calls: dict[int, int] = {}

    def hook(module, args, output=None):
        n = calls.get(id(module), 0)
        calls[id(module)] = n + 1
        callers = users[id(module)]
        site, mods = callers[n % len(callers)]
        if site in sites_of:
            return act(site, mods, args, output)
        return None

    def pre_hook(module, args, kwargs):  # a layer may be handed its input by name
        if not args and "hidden_states" in kwargs:
            replaced = hook(module, (kwargs["hidden_states"],))
            if replaced is not None:
                kwargs = {**kwargs, "hidden_states": replaced[0]}
            return (), kwargs
        replaced = hook(module, args)
        return None if replaced is None else (replaced, kwargs)

    handles = []
    for module in {id(pick(m)): pick(m) for _, m in sites}.values():
        if module is None:  # not named for this model (`_unhookable` refused a want of it)
            continue
        if before:
            handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
        else:
            handles.append(module.register_forward_hook(hook))
    return handles
