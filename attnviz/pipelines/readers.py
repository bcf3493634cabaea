"""Where a run's attention comes from: one reader per kind of model. A reader encodes the
text, gathers the consumers' recorders and edit, runs the one capture pass and puts the
attention it read on the run (`run.raw`; an encoder-decoder model's stacks in `run.stacks`).

    OneStack  encoders and decoders: the text (and a sentence pair), the chosen measure's
              values in place of the weights where it is not the weights; a decoder's
              prompt with the continuation it writes or is given (`core.generation`), its
              rows handed out as the model used them
    Stacks    encoder-decoder models: the source and its target (given, or written by the
              model), one stack's attention, or every stack for a page
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError
from attnviz.pipelines.consumers import Consumer, Run

if TYPE_CHECKING:
    from attnviz.core.model_info import LoadedModel
    from attnviz.pipelines.request import Request, ShowRequest


def run(request: ShowRequest, consumers: Sequence[Consumer] = ()) -> Run:
    """Load the model and read `request`'s text in one pass by the reader of its kind, with
    every consumer's recorders and edit, then view it and let each consumer finish (the
    request was checked with `checks.before_loading`; the writers have not run)."""
    from attnviz.pipelines import checks

    model = request.model()
    for consumer in consumers:
        consumer.early(model)
    loaded = model.load()
    checks.against(request, loaded.info)  # what the files did not say (a hub id)
    reader = Stacks if loaded.info.seq2seq else OneStack
    found = reader(loaded, request).read(consumers)
    for consumer in consumers:
        consumer.read(found)
    _view(found)
    for consumer in consumers:
        consumer.finish(found)
    return found


class OneStack:
    """A model with one attention stack (an encoder or a decoder)."""

    def __init__(self, loaded: LoadedModel, request: Request, whole: bool = False,
                 to: Path | None = None) -> None:  # fmt: skip
        self.loaded, self.request = loaded, request
        self.layers = list(request.layers) if request.layers else None
        self.whole, self.to = whole or to is not None, to
        self.cross: Any = None  # Mllama's cross-attention layers' recorder (`cross_recorder`)

    def read(self, consumers: Sequence[Consumer]) -> Run:
        """The request's text, read in one pass with the consumers' recorders and edit; a
        long one without holding any map whole (`core.memory.streams`), unless the reader
        was made to hold them (`whole`, the API: in memory where they fit, refused in one
        line before the model runs where they do not; or in the `.npy` file `to`)."""
        from attnviz.core import memory
        from attnviz.core.tokens import encode

        r, loaded = self.request, self.loaded
        if r.prompt is not None:  # a picture and a prompt (refused unless the model reads both)
            from attnviz.core.vlm import encode as encode_prompted

            encoded = encode_prompted(loaded, r.picture, r.prompt, r.raw)
        elif r.picture is not None:
            from attnviz.core.images import encode_picture

            encoded = encode_picture(loaded, r.picture)
        else:
            encoded = encode(loaded, r.text, r.truncate, r.pair)
        layers = loaded.info.pick_layers(self.layers)
        reading, tower = None, None
        if r.prompt is not None and any(c.wants_tower() for c in consumers):
            encoded, tower = tower_recorder(loaded, encoded)
        if any(c.wants_cross() for c in consumers):
            self.cross = cross_recorder(loaded, r, encoded)
        if self.whole and r.continues:  # before it is written: its length at most
            self._fits(layers, len(encoded) + (r.generate or 0))
        if r.continues:  # the tower runs in the prompt's pass: fed there
            heard = ([tower] if tower else []) + cross_while_writing(loaded, self.cross)
            encoded, reading = continued(loaded, r, encoded, layers, heard)
        run = Run(r, loaded, encoded, layers, tower=tower)
        facts = loaded.info
        if self.whole:
            self._fits(layers, len(encoded))
        else:
            n = len(encoded)
            run.streamed = memory.streams(facts.n_layers, facts.n_heads, n, memory.Asked.of(r))
        if run.streamed:
            return self._streamed(run, consumers, reading)
        recorders = [recorder for c in consumers for recorder in c.recorders(run)]
        edits = [c.edit(run) for c in consumers]
        recorders += _tower_in_pass(run, reading) + cross_in_pass(self.cross, reading)
        edit = _one_edit(edits)
        found, run.measure_recorder = self.batch([encoded], recorders, edit, reading)
        run.raw = found[0]
        self._read_cross(run)
        return run

    def _read_cross(self, run: Run) -> None:
        """`run.cross`: the cross-attention layers' rows, once every pass has run."""
        if self.cross is not None:
            run.cross = self.cross.attention(run.encoded, self.loaded, run.encoded.cross)

    def _fits(self, layers: Sequence[int], n_tokens: int) -> None:
        """Refuse, one line, maps of `layers` over `n_tokens` that the process cannot hold
        (in memory; with `to`, only the blocks), beside a layer's whole maps where the model
        runs eager attention."""
        from attnviz.core import memory

        info, r = self.loaded.info, self.request
        per_layer = r.measure in ("alti", "rollout")
        memory.check_held(len(layers), info.n_layers, 1 if per_layer else info.n_heads,
                          n_tokens, self.to is not None,
                          eager=info.implementation == "eager")  # fmt: skip

    def _streamed(self, run: Run, consumers: Sequence[Consumer], reading: Any = None) -> Run:
        """One pass in blocks of query rows, each block handed to the consumers' recorders
        and the views' (pooled maps, a window) and then let go: `run.raw` has the text's
        tokens and facts, its weights never held (a zero-size stand-in of their shape)."""
        import numpy as np

        from attnviz.core import capture, memory
        from attnviz.core.extract import text_attention
        from attnviz.core.tokens import pad
        from attnviz.pipelines.views import Views

        loaded, n = self.loaded, len(run.encoded)
        shape = (len(run.layers), loaded.info.n_heads, n, n)
        stand_in = np.broadcast_to(np.zeros((), np.float32), shape)  # read by no one
        run.raw = text_attention(run.encoded, loaded.info, run.layers, stand_in)
        run.views = Views(run, n, n)
        recorders = [recorder for c in consumers for recorder in c.recorders(run)]
        recorders += run.views.recorders(n) + _tower_in_pass(run, reading)
        recorders += cross_in_pass(self.cross, reading)
        block = memory.stream_rows(loaded.info.n_heads, n)
        capture.run(loaded, pad(loaded, [run.encoded]), recorders, block_rows=block,
                    reading=reading)  # fmt: skip
        self._read_cross(run)
        return run

    def batch(self, batch: Sequence[Any], recorders: Sequence[Any] = (), edit: Any = None,
              reading: Any = None):  # fmt: skip
        """Encoded texts read in one padded pass: each text's attention (the request's measure
        in place of the weights where it is not the weights) and the measure's recorder.
        With `reading`, the one text is a decoder's prompt and continuation, whose rows were
        kept as the model read it (`core.generation`; the weights alone)."""
        from attnviz.analysis.contributions import DEFAULT, read_measure, with_rollout
        from attnviz.core.extract import attend

        if reading is not None:
            found = attend(self.loaded, list(batch), self.layers, recorders, reading=reading,
                           to=self.to)  # fmt: skip
            return found, None
        r = self.request
        if r.measure == DEFAULT:  # the weights: extracted as they are
            found = attend(self.loaded, list(batch), self.layers, list(recorders), edit=edit,
                           to=self.to)  # fmt: skip
            return found, None
        kept: list = []
        measure = with_rollout(r.measure, r.fusion, r.discard)
        found = read_measure(self.loaded, list(batch), measure, self.layers, list(recorders),
                             kept, edit)  # fmt: skip
        return found, kept[0]


class Stacks:
    """An encoder-decoder model: the text is its source, the target given (teacher forcing)
    or written by the model; `request.stack_read` is the attention shown (cross-attention
    with a target, the encoder's without one)."""

    def __init__(self, loaded: LoadedModel, request: Request) -> None:
        self.loaded, self.request = loaded, request
        self.stack = request.stack_read
        self.layers = list(request.layers) if request.layers else None

    def read(self, consumers: Sequence[Consumer]) -> Run:
        """The request's source and target, read in one pass with the consumers' recorders;
        every stack, every layer where a consumer asks for them (a page's switch). Without
        --target or --generate the decoder reads its start token alone (nothing is written)."""
        from attnviz.core.seq2seq import encode_source_target

        r, loaded = self.request, self.loaded
        item = encode_source_target(loaded, r.text, r.target, r.generate, r.truncate,
                                    write=r.continues)  # fmt: skip
        run = Run(r, loaded, item, loaded.info.of_stack(self.stack).pick_layers(self.layers))
        recorders = [recorder for c in consumers for recorder in c.recorders(run)]
        if any(c.every_stack(run) for c in consumers):
            run.stacks = self.batch([item], recorders, every=True)[0]
            run.raw = run.stacks[self.stack].keep_layers(self.layers)
        else:
            run.raw = self.batch([item], recorders)[0][self.stack]
        return run

    def batch(self, batch: Sequence[Any], recorders: Sequence[Any] = (), every: bool = False):
        """Sources and targets read in one padded pass: each one's attention of the chosen
        stack (its measure's values where it is not the weights), or of every stack and
        layer (`every`, the weights)."""
        from attnviz.analysis.contributions import stack_values
        from attnviz.core.extract import attend_stacks
        from attnviz.core.layer_map import STACKS

        if every:
            return attend_stacks(self.loaded, list(batch), STACKS, None, list(recorders))
        values = stack_values(self.loaded, self.request.measure)
        return attend_stacks(self.loaded, list(batch), (self.stack,), self.layers,
                             list(recorders), values)  # fmt: skip


def hold(request: ShowRequest, to: Path | None = None) -> Run:
    """The run of what `request` asks for with every map held whole: what the API hands out,
    never a streamed run's stand-in. `run.shown` is the attention as it is shown (--words,
    --hide-special), `run.made.tower` a picture and a prompt's vision tower (`consumers.tower`,
    unless `request.tower` is False). The maps are held in memory where they fit, in the
    `.npy` file `to` (its memory map) when given; refused in one line before the model runs
    where they fit in neither (`core.memory.check_held`). `run.cross`: Mllama's
    cross-attention layers over the picture (`consumers.cross`), held in memory."""
    from attnviz.pipelines import checks
    from attnviz.pipelines.consumers.cross import Cross
    from attnviz.pipelines.consumers.tower import Tower

    loaded = request.model().load()
    checks.against(request, loaded.info)
    if loaded.info.seq2seq:
        if to is not None:
            raise InputError(
                f"to= writes the weights of a model with one attention stack; {loaded.info.name} "
                "is an encoder-decoder model: keep fewer layers (layers=[…]) instead"
            )
        return _shown(Stacks(loaded, request).read(()), ())
    consumers = [Tower(request), Cross(request)] if request.prompt is not None else []
    return _shown(OneStack(loaded, request, whole=True, to=to).read(consumers), consumers)


def _shown(run: Run, consumers: Sequence[Consumer]) -> Run:
    """`run` with its attention as shown (`run.shown`: --words, --hide-special) and what its
    `consumers` made of it."""
    from attnviz.analysis.transforms import transform

    run.shown = transform(run.raw, run.request.words, run.request.hide_special)
    for consumer in consumers:
        consumer.finish(run)
    return run


def continued(loaded: LoadedModel, request: Request, prompt: Any, layers: Sequence[int],
              others: Sequence[Any] = ()):  # fmt: skip
    """A decoder's prompt with the continuation `request` asks for (`--generate`, written
    by the model, or `--target`) as one Encoded, and the `generation.Reading` of `layers`
    the model used; `others`' recorders (the vision tower's, Mllama's cross-attention
    layers') fed by generation's passes as they run them."""
    from attnviz.core import generation

    settings = generation.Settings(request.generate, request.target, request.sample,
                                   request.temperature or 1.0, request.seed)  # fmt: skip
    return generation.write(loaded, prompt, settings, layers, others)


def tower_recorder(loaded: LoadedModel, encoded: Any) -> tuple[Any, Any]:
    """The recorder of a vision-language model's vision tower over `encoded`'s picture
    (`analysis.tower`), refused in one line where the process could not hold its sums
    (`memory.tower_bytes`): (`encoded`, it); or (`encoded` with a note that says why the
    tower's view is not drawn, None)."""
    from dataclasses import replace

    from attnviz.analysis.tower import TowerRecorder
    from attnviz.core import capture, layer_map, memory, recording, vlm

    model, why, tower = loaded.model, None, None
    kind = model.config.model_type
    if not capture.records(model):
        why = "the tower is read through attnviz's attention function, not eager attention"
    else:
        try:
            tower = vlm.tower(loaded, encoded)
        except ValueError as exc:
            why = str(exc)
    if tower is None:
        note = f"the vision tower's view is not drawn for {kind}: {why}"
        return replace(encoded, notes=(*encoded.notes, note)), None
    n_layers = layer_map.n_layers(model, capture.VISION)
    vision = model.config.vision_config
    n_heads = getattr(vision, "num_attention_heads", None) or vision.num_heads
    needed = memory.tower_bytes(n_layers, n_heads, tower.lengths, recording.BLOCK_ROWS)
    memory.require(needed, f"the vision tower's heads ({n_layers} layers × {n_heads} heads over "
                           f"{sum(tower.lengths):,} tokens)")  # fmt: skip
    return encoded, TowerRecorder(tower, n_layers, capture.VISION)


def cross_recorder(loaded: LoadedModel, request: Request, encoded: Any) -> Any:
    """The recorder of Mllama's cross-attention layers over `encoded`'s picture
    (`core.cross_picture`), for the prompt and at most the answer `request` asks for;
    refused in one line where the process could not hold their rows. None for any other
    model."""
    from attnviz.core import cross_picture
    from attnviz.core.generation import target_ids

    if encoded.cross is None:
        return None
    more = request.generate or 0
    if request.target is not None:
        more = len(target_ids(loaded, encoded.text, request.target))
    return cross_picture.recorder(loaded, encoded.cross, len(encoded) + more)


def cross_while_writing(loaded: LoadedModel, cross: Any) -> list[Any]:
    """The cross-attention recorder `cross` (`cross_recorder`), where generation's passes are
    heard (attnviz's function: they feed it as the model writes); else none."""
    from attnviz.core.capture import records

    return [cross] if cross is not None and records(loaded.model) else []


def cross_in_pass(cross: Any, reading: Any) -> list[Any]:
    """The cross-attention recorder `cross`, where the pass to come reads the text: no
    generation's pass fed it (`reading` None); else none."""
    return [cross] if cross is not None and reading is None else []


def _tower_in_pass(run: Run, reading: Any) -> list[Any]:
    """The tower's recorder, where the pass to come runs the tower (none did before it)."""
    return [run.tower] if run.tower is not None and reading is None else []


def read_texts(
    loaded: LoadedModel, request: Request, encoded: Sequence[Any], inside: bool = False
) -> tuple[list[Any], list[Any] | None]:
    """Each encoded text's attention (or the request's per-head measure), `batch_size` texts
    a pass; with `inside`, each text's inside-one-head numbers too (or why they are left out),
    from the same passes: what the compare page shows of each text."""
    from attnviz.analysis.inside import CONTINUED, InsideSteps
    from attnviz.core.extract import batched

    reader = OneStack(loaded, request)
    found: list[Any] = []
    insides: list[Any] = []
    if request.continues:  # one text at a time, each continued (no inside view: it needs X)
        layers = loaded.info.pick_layers(reader.layers)
        for prompt in encoded:
            whole, reading = continued(loaded, request, prompt, layers)
            found.extend(reader.batch([whole], reading=reading)[0])
        return found, [CONTINUED] * len(found) if inside else None
    for batch in batched(encoded, request.batch_size, same_size=request.pictures is not None):
        steps = InsideSteps(loaded, batch) if inside else None
        found.extend(reader.batch(batch, [steps] if steps else [])[0])
        if steps is not None:
            insides.extend(steps.result(row) for row in range(len(batch)))
    return found, insides if inside else None


def _one_edit(edits: list[Any]) -> Any:
    """The one edit of a pass (head ablation), or None."""
    made = [edit for edit in edits if edit is not None]
    if len(made) > 1:
        raise ValueError("one edit per pass: two consumers asked to change the model")
    return made[0] if made else None


def _view(run: Run) -> None:
    """The run's views: the attention as shown (--words, --hide-special: `run.shown`), its
    heads, the figures' style, and what is drawn and carried by the page (`Views.finish`:
    pooled for a long text, a --window's exact cells)."""
    from dataclasses import replace

    from attnviz.analysis.transforms import transform
    from attnviz.outputs.figures import Style

    r = run.request
    run.shown = transform(run.raw, r.words, r.hide_special)
    run.heads = run.shown.heads_held(list(r.heads) if r.heads else None)
    run.style = r.style or Style()
    if r.measure == "norm" and run.style.scale == "absolute":  # 1 = the text's largest value
        run.style = replace(run.style, top=float(run.shown.weights.max()) or 1.0)
    if run.views is None:  # held whole: pooled and cut from `shown`
        from attnviz.pipelines.views import Views

        run.views = Views(run, len(run.shown.tokens), len(run.shown.key_tokens))
    run.views.finish(run)
