"""`attnviz needle`: which heads fetch a fact from a long context (retrieval heads, Wu et al.
2024), found on needle-in-a-haystack runs and proven by removing them.

For each (length, depth) the prompt is built (`core.haystack`), the model answers greedily
as attnviz's attention function runs it (`core.generation.greedy`: the row that wrote each
token handed over as the model computed it, never eager), and the row's top key per head is
all that is kept (`analysis.retrieval.TopKeys`); each head's copying steps are counted by
the copy rule. Then, with `ablate_top`, every run is answered again with the k best heads
zero-ablated, and with k heads drawn at random (`seeds` draws), and the recalls compared.

Each run (and each ablated run) is one unit, `runs/…json` (`ablation/…/…json`), written
atomically with the settings it was made with: a re-run (after Ctrl-C) keeps the units whose
settings match and does the rest; the files (needle.json, heads.csv, report.md, figures)
are written from all of them at the end.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError, Interrupted, UnsupportedModelError

if TYPE_CHECKING:
    from attnviz.analysis.retrieval import Ablated, NeedleResult, NeedleRun
    from attnviz.core.haystack import Builder, Haystack, NeedlePrompt
    from attnviz.core.model_info import LoadedModel
    from attnviz.pipelines.request import NeedleRequest

RUNS, ABLATION = "runs", "ablation"


def needle(
    request: NeedleRequest,
    on_progress: Callable[[str, int, int], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> tuple[NeedleResult, list[Path]]:
    """Run the test `request` asks for: its result and the files written (none without
    `out`). Bad input is refused in one line before the model answers anything."""
    from attnviz.analysis.retrieval import NeedleResult, retrieval_scores
    from attnviz.core import haystack as hay
    from attnviz.core import interrupts, models
    from attnviz.outputs.files import check_writable, prepare_dir

    interrupts.new_run()
    warn = on_warning or (lambda message: None)
    _refuse_early(request, models.describe(request.load.model))
    if request.out is not None:
        check_writable(request.out)
    loaded = request.model().load()
    _refuse_model(loaded)
    found = hay.read_haystack(request.haystack)
    builder = hay.Builder(loaded.tokenizer, True, found, request.needle or hay.NEEDLE,
                          request.question or hay.QUESTION)  # fmt: skip
    lengths, depths = request.lengths, request.depths or hay.depths(11)
    _refuse_lengths(loaded, builder, lengths, request.answer_tokens)
    filled = builder.filled(max(lengths))
    if filled.repeats > 1:
        warn(f"the haystack ({found.name}) is shorter than {max(lengths):,} tokens: it is read "
             f"{filled.repeats} times over")  # fmt: skip
    base = _settings(loaded, request, builder, filled)
    if request.out is not None:
        prepare_dir(request.out)
    grid = [(length, depth) for length in lengths for depth in depths]
    units = _Units(request.out, base)
    try:
        runs = []
        for i, (length, depth) in enumerate(grid):
            runs.append(units.run(length, depth, lambda L=length, D=depth: _answer(
                loaded, builder, filled, L, D, request.answer_tokens)))  # fmt: skip
            if on_progress is not None:
                on_progress("runs", i + 1, len(grid))
        retrieval = retrieval_scores([r.scores for r in runs], [r.held for r in runs])
        ablations = _ablations(loaded, request, builder, filled, runs, retrieval, units,
                               on_progress, warn)  # fmt: skip
    except KeyboardInterrupt:
        raise Interrupted(units.said()) from None
    result = NeedleResult(loaded.info.name, loaded.info.ran(), found.name, filled.repeats,
                          builder.needle, builder.question, tuple(lengths), tuple(depths),
                          request.answer_tokens, tuple(runs), retrieval,
                          tuple(ablations))  # fmt: skip
    written: list[Path] = []
    if request.out is not None:
        from attnviz.outputs.figures import Style
        from attnviz.outputs.needle_files import write_needle

        written = write_needle(result, request.out, request.style or Style())
    return result, written


def _refuse_early(request: NeedleRequest, spec: Any) -> None:
    """What the options and the model's files refuse before it loads: an encoder or an
    encoder-decoder model, eager attention, a bad number."""
    if request.load.implementation == "eager":
        raise InputError("needle records the rows inside the model's attention call as it "
                         "writes; --attention eager does not go through it: use sdpa")  # fmt: skip
    if spec is not None and (spec.seq2seq or not spec.causal or spec.pictures):
        raise UnsupportedModelError(_NOT_A_DECODER.format(name=spec.name))
    if not request.lengths:
        raise InputError("--lengths: give at least one length, e.g. 1k,2k")
    if request.answer_tokens < 1:
        raise InputError(f"--answer-tokens {request.answer_tokens}: give at least 1")
    if request.seeds < 1:
        raise InputError(f"--seeds {request.seeds}: give at least 1")
    if any(k < 1 for k in request.ablate_top):
        raise InputError("--ablate-top: each k is a number of heads, at least 1")


_NOT_A_DECODER = (
    "{name} is not a decoder that writes text (an encoder, an encoder-decoder or a picture "
    "model): needle asks a decoder LLM to answer, e.g. -m smollm2"
)


def _refuse_model(loaded: LoadedModel) -> None:
    """What the loaded model refuses: not a decoder, a model reading pictures, eager."""
    from attnviz.core.capture import records

    info = loaded.info
    if info.seq2seq or not info.causal or info.pictures or info.prompted:
        raise UnsupportedModelError(_NOT_A_DECODER.format(name=info.name))
    if not records(loaded.model):
        raise UnsupportedModelError(
            f"{info.name} ('{info.model_type}') computes its attention in its own code: "
            "needle hears the rows inside transformers' attention interface as the model writes"
        )


def _refuse_lengths(loaded: LoadedModel, builder: Builder, lengths: Any, answer: int) -> None:
    """A length the needle does not fit in, beyond the model's window with the answer's
    room, or that this machine's memory cannot hold while the model answers."""
    from attnviz.core import memory

    info = loaded.info
    for length in lengths:
        if length < builder.least():
            raise InputError(
                f"--lengths {length:,}: the needle does not fit: the template, question and "
                f"needle alone take {builder.least():,} tokens"
            )
        if length + answer > info.max_tokens:
            room = info.max_tokens - answer
            raise InputError(
                f"--lengths {length:,}: with an answer of up to {answer} tokens this model "
                f"takes prompts of at most {room:,} tokens (its window is {info.max_tokens:,})"
            )
    longest = max(lengths) + answer
    from attnviz.core.models import weights_in_memory

    found = memory.generate_estimate(info.n_layers, info.n_heads, info.n_kv_heads or info.n_heads,
                                     info.d_head, info.d_model, weights_in_memory(loaded.model),
                                     longest)  # fmt: skip
    memory.refuse_estimate(found, f"an answer after {max(lengths):,} tokens",
                           "ask for shorter --lengths")  # fmt: skip


def _settings(loaded: LoadedModel, request: NeedleRequest, builder: Builder,
              filled: Haystack) -> dict[str, Any]:  # fmt: skip
    """What decides a unit's content: a unit made with other settings is made again."""
    digest = hashlib.sha256(filled.text.encode("utf-8")).hexdigest()[:16]
    return {"model": loaded.info.name, **loaded.info.ran(),
            "haystack": digest, "needle": builder.needle, "question": builder.question,
            "answer_tokens": request.answer_tokens}  # fmt: skip


def _answer(loaded: LoadedModel, builder: Builder, filled: Haystack, length: int,
            depth: float, answer_tokens: int) -> NeedleRun:  # fmt: skip
    """One run: the prompt, the greedy answer with every row's top key per head, the copy
    rule's steps per head."""
    from attnviz.analysis.retrieval import NeedleRun, TopKeys, copies, recall
    from attnviz.core.generation import greedy

    prompt = builder.build(filled, length, depth)
    info = loaded.info
    top = TopKeys(info.n_layers, info.n_heads, len(prompt.ids) - 1)
    written = greedy(loaded, prompt.ids, answer_tokens, range(info.n_layers), top.take)
    answer = loaded.tokenizer.decode(written, skip_special_tokens=True)
    found = copies(top.positions(len(written)), written, prompt.ids, prompt.start, prompt.stop)
    return NeedleRun(length, depth, len(prompt.ids), prompt.start, prompt.stop, prompt.placed,
                     answer, tuple(written), recall(builder.needle, answer), found)  # fmt: skip


def ablated_recall(loaded: LoadedModel, builder: Builder, prompt: NeedlePrompt,
                   heads: Any, answer_tokens: int) -> float:  # fmt: skip
    """The needle's recall in the answer with `heads` ((layer, head) pairs) zero-ablated."""
    from attnviz.analysis.ablation import removing
    from attnviz.analysis.retrieval import recall
    from attnviz.core.generation import greedy

    written = greedy(loaded, prompt.ids, answer_tokens, edit=removing(loaded, heads))
    return recall(builder.needle, loaded.tokenizer.decode(written, skip_special_tokens=True))


def _ablations(loaded, request, builder, filled, runs, retrieval, units, on_progress,
               warn) -> list[Ablated]:  # fmt: skip
    """Every run answered again with the k best heads removed, and with k random heads
    (`seeds` draws, none of the k best), for each k of `ablate_top`."""
    from attnviz.analysis.retrieval import Ablated, random_heads

    if not request.ablate_top:
        return []
    if retrieval is None:
        warn("no answer held the needle: no head has a retrieval score, so there are no top "
             "heads to remove (--ablate-top skipped)")  # fmt: skip
        return []
    info = loaded.info
    total = info.n_layers * info.n_heads
    wanted = []
    for k in request.ablate_top:
        if k >= total:
            raise InputError(f"--ablate-top {k}: this model has {total} heads; give fewer")
        top = retrieval.top(k)
        wanted.append((k, "top", None, top))
        wanted += [(k, "random", seed, random_heads(info.n_layers, info.n_heads, k, seed, top))
                   for seed in range(request.seeds)]  # fmt: skip
    found, done, count = [], 0, len(wanted) * len(runs)
    for k, kind, seed, heads in wanted:
        recalls = []
        for run in runs:
            recalls.append(units.ablated(run, k, kind, seed, heads, lambda r=run, h=heads:
                ablated_recall(loaded, builder, builder.build(filled, r.length, r.depth), h,
                               request.answer_tokens)))  # fmt: skip
            done += 1
            if on_progress is not None:
                on_progress("ablation", done, count)
        found.append(Ablated(k, kind, seed, tuple(heads), tuple(recalls)))
    return found


class _Units:
    """The runs' units in the output folder: kept where their settings match, else made
    (`make`) and written atomically; without a folder, always made."""

    def __init__(self, out: Path | None, base: dict[str, Any]) -> None:
        self.out, self.base = out, base
        self.made = self.kept = 0

    def run(self, length: int, depth: float, make: Callable[[], NeedleRun]) -> NeedleRun:
        from attnviz.analysis.retrieval import NeedleRun

        settings = {**self.base, "length": length, "depth": depth}
        path = self._path(RUNS, f"L{length}-D{depth:g}.json")
        held = self._read(path, settings)
        if held is not None:
            return NeedleRun.from_dict(held)
        run = make()
        self._write(path, settings, run.as_dict())
        return run

    def ablated(self, run: NeedleRun, k: int, kind: str, seed: int | None, heads: Any,
                make: Callable[[], float]) -> float:  # fmt: skip
        settings = {**self.base, "length": run.length, "depth": run.depth,
                    "removed": [f"{layer}.{head}" for layer, head in heads]}  # fmt: skip
        which = f"top-{k}" if kind == "top" else f"random-{k}-seed{seed}"
        path = self._path(f"{ABLATION}/{which}", f"L{run.length}-D{run.depth:g}.json")
        held = self._read(path, settings)
        if held is not None:
            return float(held["recall"])
        found = make()
        self._write(path, settings, {"recall": found})
        return found

    def said(self) -> str:
        """What a Ctrl-C leaves: the units written so far, and how to finish."""
        if self.out is None:
            return "stopped; nothing was written"
        return (f"stopped after {self.made} new runs ({self.kept} kept from before) in "
                f"{self.out}: the same command again finishes the rest")  # fmt: skip

    def _path(self, folder: str, name: str) -> Path | None:
        return None if self.out is None else self.out / folder / name

    def _read(self, path: Path | None, settings: dict[str, Any]) -> dict[str, Any] | None:
        if path is None:
            return None
        try:
            held = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if held.get("settings") != settings:
            return None
        self.kept += 1
        return held["found"]

    def _write(self, path: Path | None, settings: dict[str, Any], found: dict[str, Any]) -> None:
        from attnviz.outputs.files import write_text_atomic

        self.made += 1
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps({"settings": settings, "found": found}))
