"""`attnviz export`: heatmap files for many sentences, batched, parallel, resumable.

Each sentence gets a folder `NNNN-slug-hash/` (its number, the start of its text and a hash
of the text) with its figures and, written last, `done.json`. A folder whose `done.json`
records the same settings is complete and is skipped on a re-run; anything else in it is
redone. Every file is written atomically, so an interrupted run leaves whole files or none.

An output folder holds the export of one sentence list (or of the start of it: a list with
sentences added at the end resumes). Sentence folders of another list are refused before any
work, or removed with `overwrite`, so numbers never repeat and the manifest lists every
sentence folder there. A re-run that finds everything done says so without loading the model.

An encoder-decoder model reads `source<TAB>target` lines and exports one attention stack
(`stack`: encoder, decoder or cross, the default) of each pair, read with teacher forcing.
"""

from __future__ import annotations

import csv
import gc
import io
import json
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.core import interrupts
from attnviz.core.models import describe
from attnviz.errors import InputError, OutputError, TextTooLongError
from attnviz.outputs.files import (
    DONE,
    TEXT_FILES,
    clear_previous,
    prepare_dir,
    read_done,
    text_folder_name,
    write_atomic,
    write_done,
    write_text_atomic,
)
from attnviz.outputs.render import KINDS
from attnviz.pipelines import checks

if TYPE_CHECKING:
    from attnviz.analysis.contributions import PageMeasures
    from attnviz.analysis.inside import Inside
    from attnviz.analysis.tower import TowerView
    from attnviz.core.attention import Attention, Encoded, SourceTarget
    from attnviz.core.inputs import Sentence, Sentences
    from attnviz.core.model_info import LoadedModel, ModelSpec
    from attnviz.outputs.figures import Style
    from attnviz.pipelines.request import ExportRequest


@dataclass(frozen=True)
class ExportOptions:
    """Everything that decides what an export writes (and so whether a folder is complete)."""

    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    figures: tuple[str, ...] = KINDS
    words: bool = False
    hide_special: bool = False
    truncate: bool = False
    save_raw: bool = False
    fmt: str = "png"
    dpi: int = 100
    cmap: str = "viridis"
    scale: str = "absolute"
    query: str | None = None  # "it", "it#2" or a position: also each sentence's query figure
    html: bool = False  # also attention.html, the interactive page, in each sentence's folder
    measure: str = "weights"  # or norm, alti, rollout (analysis.contributions.MEASURES)
    fusion: str = "mean"  # rollout's head fusion
    discard: float = 0.0  # rollout's discard ratio
    pictures: bool = False  # a vision model's pictures: each "text" is a picture's path
    questions: bool = False  # a vision-language model's pictures and prompts (a JSONL file)
    tower: bool = True  # questions: each one's vision tower's heads too (--no-tower: not)
    stack: str | None = None  # encoder-decoder models: encoder, decoder or cross
    dtype: str = "auto"  # the model's weights (--dtype): half precision moves the numbers
    # a decoder's continuation of each text (--generate N, --sample, --temperature, --seed;
    # --target TEXT, the same for every text)
    generate: int | None = None
    target: str | None = None
    sample: bool = False
    temperature: float | None = None
    seed: int | None = None

    @classmethod
    def of(cls, request: ExportRequest) -> ExportOptions:
        """The settings `request` writes with, each field the request's own (the figures'
        look from its style); an encoder-decoder model's stack is set once its kind is known."""
        from attnviz.outputs.figures import Style

        drawn = {f.name for f in fields(Style)}
        style = request.style or Style()
        found = {f.name: getattr(style if f.name in drawn else request, f.name)
                 for f in fields(cls) if f.name != "dtype"}  # fmt: skip
        return cls(**{**found, "figures": request.figures or KINDS, "dtype": request.load.dtype,
                      "pictures": request.pictures is not None,
                      "questions": request.questions is not None})  # fmt: skip


@dataclass
class Record:
    """What happened to one sentence."""

    index: int
    line: int
    text: str  # an encoder-decoder model's source
    folder: str
    status: str  # written | complete (skipped) | too long (skipped)
    tokens: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    target: str | None = None  # an encoder-decoder model's target
    key_tokens: list[str] | None = None  # cross-attention: the source's tokens
    # a decoder's --generate / --target: where the continuation starts, how it came, each
    # of its tokens' probabilities (`core.attention.Continuation`)
    continuation: dict[str, Any] | None = None
    picture: str | None = None  # a question's picture, as its line gives it


@dataclass
class ExportSummary:
    """Counts and time of one export run."""

    out: Path
    sentences: int = 0
    written: int = 0
    complete: int = 0
    blank: int = 0
    too_long: int = 0
    unreadable: int = 0  # files of a folder of pictures that are not readable pictures
    unit: str = "sentences"  # or pictures (a vision model's)
    truncated: int = 0
    figures: int = 0
    seconds: float = 0.0
    render_seconds: float = 0.0  # after the model was loaded: forward passes and figures
    removed: int = 0  # sentence folders of an earlier export of other sentences (overwrite)
    nothing_to_do: bool = False  # every sentence was complete or too long: no model loaded
    interrupted: bool = False
    skipped: dict[int, Record] = field(default_factory=dict)  # too-long sentences, by index

    def as_dict(self) -> dict[str, Any]:
        """The run's counts, time and where its manifest is (for `--json`)."""
        return {
            "out": str(self.out),
            "manifest": str(self.out / "manifest.json"),
            **{key: getattr(self, key) for key in COUNTS},
            **({"unreadable": self.unreadable} if self.unreadable else {}),
            "seconds": round(self.seconds, 3),
            "interrupted": self.interrupted,
        }


COUNTS = (
    "sentences",
    "written",
    "complete",
    "blank",
    "too_long",
    "truncated",
    "figures",
    "removed",
)


Progress = Callable[[Record, int], None]  # (record, figures written for it)


def _folder_name(sentence: Sentence, width: int) -> str:
    name = text_folder_name(sentence.text, 32, sentence.target, sentence.given)
    return f"{sentence.index:0{width}d}-{name}"


# A name `_folder_name` makes: the sentence's number, a slug, 8 hex digits of a hash.
_SENTENCE_FOLDER = re.compile(r"\d{4,}-[a-z0-9-]+-[0-9a-f]{8}")


def _other_exports(out: Path, expected: set[str]) -> list[Path]:
    """Sentence folders in `out` that are not this list's: named as an export names them, and
    holding its `done.json` or a file named as it names figures."""

    def written_by_export(folder: Path) -> bool:
        return (folder / DONE).is_file() or any(
            TEXT_FILES.fullmatch(path.name) for path in folder.iterdir()
        )

    return sorted(
        path
        for path in out.iterdir()
        if path.name not in expected
        and _SENTENCE_FOLDER.fullmatch(path.name)
        and path.is_dir()
        and written_by_export(path)
    )


def _refuse_other_export(out: Path, others: list[Path]) -> OutputError:
    n = len(others)
    return OutputError(
        f"{out} holds an export of other sentences ({n} sentence folder{'s' * (n != 1)} not "
        f"in this list, such as {others[0].name}); choose another --out, or pass --overwrite "
        "to replace that export"
    )


def _remove_export(out: Path, folders: list[Path], warn: Callable[[str], None]) -> int:
    """Remove an earlier export's manifests, then its sentence folders, deleting only the files
    attnviz writes there; a folder that holds anything else is kept. The folders removed."""
    for name in ("manifest.json", "manifest.csv"):  # first: never a manifest of missing folders
        (out / name).unlink(missing_ok=True)
    removed = 0
    for folder in folders:
        clear_previous(folder, text_folder=True)
        try:
            folder.rmdir()
        except OSError:
            warn(f"kept {folder}: it holds files attnviz did not write")
            continue
        removed += 1
    return removed


def _all_too_long(
    spec: ModelSpec | None, sentences: list[Sentence], truncate: bool
) -> list[TextTooLongError] | None:
    """Each sentence's error when the model's files alone show that every one is too long,
    else None (the loaded model decides)."""
    if spec is None:
        return None
    errors = []
    for sentence in sentences:
        try:
            spec.check_length(sentence.text, truncate)
        except TextTooLongError as error:
            errors.append(error)
            continue
        return None
    return errors


def _settings(model_name: str, sentence: Sentence, options: ExportOptions) -> dict[str, Any]:
    settings = {"model": model_name, "text": sentence.text, **asdict(options)}
    if options.dtype == "auto":  # folders written before --dtype stay complete
        del settings["dtype"]
    for name in ("generate", "target", "sample", "temperature", "seed"):
        if settings[name] in (None, False):  # folders written before --generate stay complete
            del settings[name]
    for name, default in (
        ("fusion", "mean"),
        ("discard", 0.0),
        ("pictures", False),
        ("questions", False),
    ):
        if settings[name] == default:  # folders written before these options stay complete
            del settings[name]
    if not (options.questions and options.tower):  # as written before the tower was read
        del settings["tower"]
    if options.pictures:  # the picture's bytes, not only its name, decide what is complete
        settings["picture_sha1"] = _sha1(Path(sentence.text))
    if sentence.picture is not None:  # a question's picture: its path and bytes
        settings["picture"] = sentence.given
        settings["picture_sha1"] = _sha1(sentence.picture)
        settings["target"] = sentence.target
    if options.stack is None:  # a one-stack model's folders stay complete as they were
        del settings["stack"]
    else:
        settings["target"] = sentence.target
    return settings


def _sha1(path: Path) -> str | None:
    import hashlib

    try:
        return hashlib.sha1(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _done_record(folder: Path, settings: dict[str, Any]) -> Record | None:
    """The record in a folder's `done.json` when it was written with `settings`, else None."""
    done = read_done(folder)
    if done is None or done.get("settings") != json.loads(json.dumps(settings)):
        return None
    return Record(**done["record"])


def _completed(folder: Path, settings: dict[str, Any]) -> Record | None:
    """The record of a folder finished earlier with the same settings, else None."""
    record = _done_record(folder, settings)
    if record is not None:
        record.status = "complete"
    return record


def _count_done(summary: ExportSummary, todo: list[tuple[Sentence, Path, dict[str, Any]]]) -> None:
    """After an interrupt, count from the folders: a sentence is written when its folder holds
    `done.json` with this run's settings, as the manifest lists it. The running count can be
    short: drawing processes finish the sentences they started after Ctrl-C, and Ctrl-C can
    land between a sentence's `done.json` and its count."""
    found = [record for _, folder, settings in todo if (record := _done_record(folder, settings))]
    summary.written = len(found)
    summary.figures = sum(_figures(record) for record in found)
    summary.too_long = sum(r.status.startswith("too long") for r in summary.skipped.values())


def render_sentence(
    att: Attention,
    folder: Path,
    layers: list[int],
    heads: list[int],
    style: Style,
    options: ExportOptions,
    record: Record,
    settings: dict[str, Any],
    query: int | None = None,
    page: str | None = None,
    sides: dict[str, tuple[str, ...]] | None = None,
    tower: TowerView | None = None,
    cross: Attention | None = None,
) -> Record:
    """Write one sentence's figures (and raw array, and `page` as attention.html), then
    `done.json`; runs in a worker too. `sides`: an encoder-decoder model's source and target
    tokens, for the raw array; `tower`: a picture and a prompt's vision tower's heads
    (tower-layer-L figures, tower.json, and its maps in the raw array); `cross`: Mllama's
    cross-attention layers over the picture (`cross_files`)."""
    from attnviz.outputs.raw import save_raw
    from attnviz.outputs.render import render_text

    interrupts.hold()
    folder.mkdir(parents=True, exist_ok=True)
    clear_previous(folder, text_folder=True)
    written = render_text(att, folder, layers, heads, style, kinds=options.figures, query=query)
    if att.picture is not None:  # a vision model's: its views over the picture too
        from attnviz.outputs.figures.pictures import draw_pictures, rollout_how

        how = rollout_how(options.fusion, options.discard)
        written += draw_pictures(att, folder, layers, heads, style, query, how)
    if att.layout is not None:  # a picture and a prompt: where each image token sits
        from attnviz.outputs.raw import layout_json

        written.append(write_text_atomic(folder / "layout.json", layout_json(att.layout)))
    if tower is not None:  # its vision tower's heads over the picture, and their numbers
        from attnviz.outputs.figures.pictures import tower_tasks

        written += [task[0](*task[1:]) for task in tower_tasks(att, tower, folder, style)]
        written.append(write_text_atomic(folder / "tower.json", json.dumps(tower.as_dict(),
                                                                           indent=1)))  # fmt: skip
    if cross is not None:
        written += cross_files(cross, folder, heads, style)
    if page is not None:
        written.append(write_text_atomic(folder / "attention.html", page))
    if options.save_raw:
        written.append(save_raw(att, folder / "attention.npz", layers, heads, sides, tower,
                                cross))  # fmt: skip
    record.files = [str(path.relative_to(folder.parent)) for path in written]
    write_done(folder, settings, asdict(record))
    # Figures live in reference cycles; left to the collector's schedule, megabytes of pixel
    # buffers pile up over a long run. Cheap once the long-lived objects are frozen.
    gc.collect()
    return record


def cross_files(cross: Attention, folder: Path, heads: list[int], style: Style) -> list[Path]:
    """Mllama's cross-attention layers over the picture, as `show` draws them: every cross
    layer's `heads` over the picture (picture-answer-layer-L, L the cross-attention layer),
    their share on the patches by layer (picture-share), and cross.json (`show --json`'s
    `cross`: each key's label, each tile's grid, box and keys, the shares)."""
    from attnviz.analysis.picture_share import cross_fields, picture_shares, whose_rows
    from attnviz.outputs.figures.pictures import layout_tasks, share_figure
    from attnviz.outputs.figures.raster import save_figure

    layers = cross.held_layers()
    written = [task[0](*task[1:]) for task in layout_tasks(cross, folder, layers, heads, style,
                                                           None)]  # fmt: skip
    share = picture_shares(cross).share[:, heads]  # (cross layers, chosen heads)
    figure = share_figure(cross, share, layers, heads, whose_rows(cross), style)
    written.append(save_figure(figure, folder / f"picture-share.{style.fmt}", style))
    fields = json.dumps(cross_fields(cross), ensure_ascii=False, indent=1)
    return [*written, write_text_atomic(folder / "cross.json", fields)]


def _freeze_long_lived() -> None:
    """Move everything alive now (torch, transformers, matplotlib) out of the collector's view."""
    import matplotlib.figure  # noqa: F401  (imported here so that it is frozen too)

    gc.collect()
    gc.freeze()


def export(
    request: ExportRequest,
    on_progress: Progress | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> ExportSummary:
    """Export heatmaps for every sentence of `request.sentences` under `request.out`,
    skipping complete folders.

    Refuses (OutputError) when the folder holds sentence folders of another list, unless
    `request.overwrite`, which removes them once the model has loaded. The model is loaded
    only when some sentence is still to do.
    """
    interrupts.new_run()  # a Ctrl-C of an earlier run (a notebook's) does not stop this one
    made = not request.out.exists()  # an interrupted or failed run leaves no empty folder
    try:
        run = _Export(request, on_progress, on_warning or (lambda message: None))
        if not run.plan():
            return run.nothing_to_do()
        return run.render()
    finally:
        if made and request.out.is_dir() and not any(request.out.iterdir()):
            request.out.rmdir()


class _Export:
    """One export run: its plan (folders, what is complete, what is left), then the batched
    passes and the figures of what is left, counted into `summary`."""

    def __init__(
        self, request: ExportRequest, on_progress: Progress | None, warn: Callable
    ) -> None:
        self.request, self.on_progress, self.warn = request, on_progress, warn
        self.started = time.perf_counter()
        self.model = request.model()
        self.todo: list[tuple[Sentence, Path, dict[str, Any]]] = []
        self.settings: dict[int, dict[str, Any]] = {}  # by sentence index (`settings_of`)

    def plan(self) -> bool:
        """Refuse what cannot run, then find the sentences still to do; False when none is."""
        from attnviz.analysis.contributions import get

        r, model = self.request, self.model
        get(r.measure)
        spec = describe(model.name)
        refuse = checks.against if r.questions is None else checks.questions
        refuse(r, spec)
        facts = spec
        if facts is None:  # a hub id not downloaded yet: only its loaded config tells its kind
            facts = model.load().info
            refuse(r, facts)
        self.sentences, self.options = r.sentences, ExportOptions.of(r)
        if facts.seq2seq:
            from attnviz.core.inputs import split_pairs
            from attnviz.core.model_info import DEFAULT_STACK

            self.sentences = split_pairs(r.sentences)
            self.options = replace(self.options, stack=r.stack or DEFAULT_STACK)
        asked = (list(r.layers) if r.layers else None, list(r.heads) if r.heads else None)
        if spec is not None:
            spec.of_stack(self.options.stack).pick_layers(asked[0])
            spec.of_stack(self.options.stack).pick_heads(asked[1])
        if r.questions is None and r.pictures is None:  # a picture's: its processor's grid
            checks.fits(r, model, [s.text for s in self.sentences.items])
        out = prepare_dir(r.out)
        self.width = max(4, len(str(len(self.sentences.items))))
        folders = [out / _folder_name(sentence, self.width) for sentence in self.sentences.items]
        self.others = _other_exports(out, {folder.name for folder in folders})
        if self.others and not r.overwrite:
            raise _refuse_other_export(out, self.others)
        self.model_name = spec.name if spec is not None else model.name  # as loading names it
        unit = "pictures" if r.pictures is not None else "sentences"
        unit = "questions" if r.questions is not None else unit
        self.summary = ExportSummary(out, len(self.sentences.items),
                                     blank=self.sentences.blank, unit=unit)  # fmt: skip
        if r.pictures is not None and r.pictures.note():
            self.warn(r.pictures.note())
        for sentence, folder in zip(self.sentences.items, folders, strict=True):
            settings = self.settings_of(sentence)
            if not r.overwrite and (record := _completed(folder, settings)) is not None:
                self.summary.complete += 1
                self.report(record)
            else:
                self.todo.append((sentence, folder, settings))
        # (a pair's target may be too long when its source is not: the loaded model decides)
        pictured = r.pictures is not None or r.questions is not None
        spec_length = None if facts.seq2seq or pictured else spec
        errors = _all_too_long(spec_length, [s for s, _, _ in self.todo], r.truncate)
        if errors is not None:
            for (sentence, folder, _), error in zip(self.todo, errors, strict=True):
                self.too_long(sentence, folder, error)
            self.todo = []
        return bool(self.todo)

    def settings_of(self, sentence: Sentence) -> dict[str, Any]:
        """A sentence's settings, made once (a picture's hold its bytes' hash: read once)."""
        if sentence.index not in self.settings:
            self.settings[sentence.index] = _settings(self.model_name, sentence, self.options)
        return self.settings[sentence.index]

    def report(self, record: Record) -> None:
        if record.status.endswith("(skipped)"):  # too long, or not a picture
            self.summary.skipped[record.index] = record
        if self.on_progress:
            self.on_progress(record, _figures(record) if record.status == "written" else 0)

    def too_long(self, sentence: Sentence, folder: Path, error: TextTooLongError) -> None:
        self.warn(f"{self.sentences.origin}, line {sentence.line}: skipped, {error}")
        self.summary.too_long += 1
        self.report(Record(sentence.index, sentence.line, sentence.text, folder.name,
                           "too long (skipped)", target=sentence.target))  # fmt: skip

    def nothing_to_do(self) -> ExportSummary:
        summary = self.summary
        summary.nothing_to_do = summary.complete > 0
        if self.others:
            summary.removed = _remove_export(summary.out, self.others, self.warn)
        summary.seconds = time.perf_counter() - self.started
        write_manifest(summary, self.sentences, self.width, self.settings_of)
        return summary

    def render(self) -> ExportSummary:
        """Load the model, read the sentences left in batches and draw each one's files."""
        from attnviz.analysis.contributions import get
        from attnviz.outputs.figures import Style, check_cmap

        r, options, summary = self.request, self.options, self.summary
        if r.jobs > 1:
            from attnviz.outputs.render import start_workers

            start_workers(r.jobs)  # they import matplotlib while this process loads the model
        self.style = Style(options.fmt, options.dpi, check_cmap(options.cmap), options.scale)
        self.loaded = self.model.load()
        _freeze_long_lived()
        info = self.loaded.info.of_stack(options.stack)  # the stack's counts; the model's for None
        self.layers = info.pick_layers(list(r.layers) if r.layers else None)
        per_layer = get(options.measure).per_layer
        self.heads = [0] if per_layer else info.pick_heads(list(r.heads) if r.heads else None)
        if self.others:  # only now: a model that fails to load leaves the earlier export whole
            summary.removed = _remove_export(summary.out, self.others, self.warn)
        loaded_at = time.perf_counter()
        renderer = _Renderer(r.jobs)
        try:
            for raw, inside, measures, tower, cross, record, settings, sides in self.texts():
                if interrupts.asked():  # a Ctrl-C that landed where Python swallowed it
                    raise KeyboardInterrupt
                job = self.job(raw, inside, measures, tower, cross, record, settings, sides)
                self.finished(renderer.submit(job))
            self.finished(renderer.finish())
        except KeyboardInterrupt:
            summary.interrupted = True
            renderer.cancel()  # the drawing processes finish the sentences they started first
            _count_done(summary, self.todo)
        finally:
            summary.seconds = time.perf_counter() - self.started
            summary.render_seconds = time.perf_counter() - loaded_at
            write_manifest(summary, self.sentences, self.width, self.settings_of)
        return summary

    def pending(self) -> Iterator[tuple[Any, Record, dict[str, Any]]]:
        """Encoded sentences still to do; too-long ones are reported here."""
        from attnviz.core.seq2seq import encode_source_target
        from attnviz.core.tokens import encode

        loaded, stack, truncate = self.loaded, self.options.stack, self.request.truncate
        for sentence, folder, settings in self.todo:
            record = Record(sentence.index, sentence.line, sentence.text, folder.name, "written",
                            target=sentence.target, picture=sentence.given)  # fmt: skip
            try:
                if self.options.pictures:
                    encoded = self.picture(sentence, folder)
                    if encoded is None:
                        continue
                elif sentence.picture is not None:
                    encoded = self.question(sentence)
                elif stack is None:
                    encoded = encode(loaded, sentence.text, truncate)
                else:
                    encoded = encode_source_target(loaded, sentence.text, sentence.target,
                                                   truncate=truncate)  # fmt: skip
            except TextTooLongError as error:
                self.too_long(sentence, folder, error)
                continue
            notes = encoded.notes if stack is None else encoded.source.notes
            pictured = self.options.pictures or self.options.questions  # notes: its size
            if notes and not pictured:
                self.summary.truncated += 1
                self.warn(f"{self.sentences.origin}, line {sentence.line}: {notes[0]}")
            yield encoded, record, settings

    def picture(self, sentence: Sentence, folder: Path) -> Any:
        """A picture as the model reads it; None (said, and recorded as skipped) for a file
        that is not a readable picture."""
        from attnviz.core.images import encode_picture

        try:
            return encode_picture(self.loaded, sentence.text)
        except InputError as error:
            self.warn(f"skipped, {error}")
            self.summary.unreadable += 1
            self.report(Record(sentence.index, sentence.line, sentence.text, folder.name,
                               "not a picture (skipped)"))  # fmt: skip
            return None

    def question(self, sentence: Sentence) -> Encoded:
        """A picture and its prompt as the model reads them; a picture the processor
        refuses, said with its line."""
        from attnviz.core import vlm

        try:
            return vlm.encode(self.loaded, sentence.picture, sentence.text)
        except InputError as error:
            raise InputError(f"{self.sentences.origin}, line {sentence.line}: {error}") from None

    def texts(self) -> Iterator[tuple[Any, ...]]:
        """Each sentence left, read in batched passes: (attention, inside view, page measures,
        vision tower's heads, cross-attention over the picture, record, settings, sides), in
        order."""
        queue: deque = deque()
        options, stack = self.options, self.options.stack

        def encoded_only() -> Iterator[Any]:
            for encoded, record, settings in self.pending():
                sides = None
                if stack is not None:
                    sides = {"source_tokens": encoded.source.tokens,
                             "target_tokens": encoded.target.tokens}  # fmt: skip
                queue.append((record, settings, sides))
                yield encoded if r.questions is None else (encoded, record.target)

        r, loaded = self.request, self.loaded
        if r.questions is not None:
            read = _question_attention(loaded, r, encoded_only(), self.layers)
        elif stack is None:
            read = _attention(loaded, r, encoded_only(), self.layers, options.html)
        else:
            read = _stack_attention(loaded, r, encoded_only(), stack)
        for raw, inside, measures, tower, cross in read:
            yield (raw, inside, measures, tower, cross, *queue.popleft())

    def job(self, raw, inside, measures, tower, cross, record, settings, sides) -> tuple:
        """What `render_sentence` takes to write one sentence's files."""
        from attnviz.analysis.query import find_query
        from attnviz.analysis.transforms import transform
        from attnviz.outputs.html import build_page

        options, style = self.options, self.style

        def view(att: Attention) -> Attention:
            return transform(att, options.words, options.hide_special)

        att = view(raw)
        record.tokens = list(att.tokens)
        if att.continuation is not None:
            record.continuation = att.continuation.as_dict()
        if att.keys is not None:
            record.key_tokens = list(att.key_tokens)
        record.notes = list(att.notes)
        query = None
        if options.query is not None:
            try:
                query = find_query(att, options.query)
            except InputError:
                note = f"no query figure: '{options.query}' names no {att.unit} here"
                record.notes.append(note)
                self.warn(f"{self.sentences.origin}, line {record.line}: {note}")
        page = None
        if options.html:
            found = measures(att, view)
            page = build_page(found.weights, inside=inside, scale=options.scale,
                              cmap=style.cmap, segments=att.segments, measures=found.others,
                              lengths=found.lengths, initial=options.measure)  # fmt: skip
        drawn = style
        if options.measure == "norm" and style.scale == "absolute":  # 1 = the text's largest
            drawn = replace(style, top=float(att.weights.max()) or 1.0)
        folder = self.summary.out / record.folder
        return (att, folder, self.layers, self.heads, drawn, options, record, settings, query,
                page, sides, tower, cross)  # fmt: skip

    def finished(self, records: list[Record]) -> None:
        for done in records:
            self.summary.written += 1
            self.summary.figures += _figures(done)
            self.report(done)


def _attention(
    loaded: LoadedModel,
    request: ExportRequest,
    encoded: Iterator[Encoded],
    layers: list[int],
    inside: bool,
) -> Iterator[tuple[Attention, Inside | str | None, Callable[..., PageMeasures] | None, None,
                    None]]:  # fmt: skip
    """Each text's attention (or the request's measure's values); with `inside`, its
    inside-one-head numbers and a function giving its page's every measure
    (`EveryMeasure.page` of its row), all from the same batched forward pass, in order (and
    None twice: a text has no vision tower, nor cross-attention over a picture)."""
    from functools import partial

    from attnviz.analysis.contributions import PageParts
    from attnviz.core.extract import batched
    from attnviz.pipelines.readers import OneStack

    reader = OneStack(loaded, request)
    if request.continues:  # each text continued alone, its weights alone (no inside view)
        from attnviz.analysis.contributions import PageMeasures
        from attnviz.analysis.inside import CONTINUED
        from attnviz.pipelines.readers import continued

        for prompt in encoded:
            whole, reading = continued(loaded, request, prompt, layers)
            att = reader.batch([whole], reading=reading)[0][0]
            yield (att, CONTINUED if inside else None, lambda shown, _: PageMeasures(shown, {}),
                   None, None)  # fmt: skip
        return
    for batch in batched(encoded, request.batch_size, same_size=request.pictures is not None):
        parts = PageParts(loaded, layers, batch, request.measure) if inside else None
        found, kept = reader.batch(batch, parts.recorders() if parts else [])
        for row, att in enumerate(found):
            if parts is None:
                yield att, None, None, None, None
                continue
            pages = partial(parts.every.page, att, kept=kept, row=row)
            yield att, parts.inside.result(row), pages, None, None


def _question_attention(
    loaded: LoadedModel,
    request: ExportRequest,
    questions: Iterator[tuple[Encoded, str | None]],
    layers: list[int],
) -> Iterator[tuple[Attention, None, None, TowerView | None, Attention | None]]:
    """Each picture and prompt's attention, one a pass: answered first by its line's target
    (teacher forcing) or `request.generate` tokens, where given; its vision tower's heads
    from the same pass (`consumers.tower`; None with --no-tower, or where the family's tower
    is not mapped: a note on the attention says why); and, where the model reads the picture
    in cross-attention layers (Mllama's), those layers over the picture's keys, from the
    same passes (`core.cross_picture`; else None)."""
    from dataclasses import replace as changed

    from attnviz.pipelines.consumers.tower import tower_view
    from attnviz.pipelines.readers import (
        OneStack,
        continued,
        cross_in_pass,
        cross_recorder,
        cross_while_writing,
        tower_recorder,
    )

    reader = OneStack(loaded, request)
    for prompt, target in questions:
        tower = None
        if request.tower:  # the tower runs in the prompt's pass: its recorder fed there
            prompt, tower = tower_recorder(loaded, prompt)
        recorders = [tower] if tower is not None else []
        asked = changed(request, target=target, generate=None if target else request.generate)
        cross = cross_recorder(loaded, asked, prompt)
        if target is None and request.generate is None:
            whole = prompt
            att = reader.batch([prompt], recorders + cross_in_pass(cross, None))[0][0]
        else:
            # generation's passes feed the cross recorder where attnviz's function hears
            # them, else the pass over the whole text does (as `OneStack.read`)
            heard = recorders + cross_while_writing(loaded, cross)
            whole, reading = continued(loaded, asked, prompt, layers, heard)
            late = cross_in_pass(cross, reading)
            att = reader.batch([whole], late, reading=reading)[0][0]
        att, view = tower_view(tower, att)
        yield att, None, None, view, cross.attention(whole, loaded, whole.cross) if cross else None


def _stack_attention(
    loaded: LoadedModel, request: ExportRequest, pairs: Iterator[SourceTarget], stack: str
) -> Iterator[tuple[Attention, None, None, None, None]]:
    """Each source-target pair's attention of `stack` (or the request's measure: norm),
    batched, in order (as `_attention` yields them, without the page's numbers)."""
    from dataclasses import replace as changed

    from attnviz.core.extract import batched
    from attnviz.pipelines.readers import Stacks

    reader = Stacks(loaded, changed(request, stack=stack))
    for batch in batched(pairs, request.batch_size):
        for found in reader.batch(batch):
            yield found[stack], None, None, None, None


def _figures(record: Record) -> int:
    return sum(1 for name in record.files if not name.endswith((".npz", ".html", ".json")))


class _Renderer:
    """Renders in this process (jobs=1) or in the drawing processes of `render`, keeping at
    most 2×jobs sentences in flight.

    The bound keeps memory flat however many sentences there are.
    """

    def __init__(self, jobs: int) -> None:
        from attnviz.outputs.render import start_workers

        self.jobs = jobs
        self.pool = start_workers(jobs) if jobs > 1 else None
        self.flight: deque = deque()

    def submit(self, job: tuple) -> list[Record]:
        if self.pool is None:
            return [render_sentence(*job)]
        self.flight.append(self.pool.submit(render_sentence, *job))
        finished = []
        while len(self.flight) >= 2 * self.jobs or (self.flight and self.flight[0].done()):
            finished.append(self.flight.popleft().result())
        return finished

    def finish(self) -> list[Record]:
        finished = [future.result() for future in self.flight]
        self.flight.clear()
        return finished

    def cancel(self) -> None:
        """Stop the drawing processes: each finishes the sentence it is drawing, and the
        queued ones are dropped."""
        if self.pool is not None:
            from attnviz.outputs.render import stop_workers

            stop_workers()


def write_manifest(
    summary: ExportSummary,
    sentences: Sentences,
    width: int,
    settings_of: Callable[[Sentence], dict[str, Any]],
) -> None:
    """`manifest.json` (sentences, tokens, files, counts); `manifest.csv`, a row a sentence.

    Streamed from each folder's `done.json`, so nothing per sentence is held in memory.
    A sentence an interrupted run did not reach is listed as `pending`, also when its folder
    holds a `done.json` of other settings (`settings_of` gives each sentence's). Source-target
    pairs get a `target` column after `text`.
    """
    counts = {key: getattr(summary, key) for key in COUNTS}
    head = {
        "counts": counts,
        "interrupted": summary.interrupted,
        "seconds": round(summary.seconds, 3),
    }

    def records() -> Iterator[Record]:
        for sentence in sentences.items:
            folder = summary.out / _folder_name(sentence, width)
            if sentence.index in summary.skipped:
                yield summary.skipped[sentence.index]
                continue
            if (record := _done_record(folder, settings_of(sentence))) is not None:
                yield record
            else:
                yield Record(sentence.index, sentence.line, sentence.text, folder.name,
                             "pending", target=sentence.target, picture=sentence.given)  # fmt: skip

    def write_json(handle) -> None:
        opening = json.dumps(head, ensure_ascii=False)[:-1] + ', "sentences": [\n'
        handle.write(opening.encode("utf-8"))
        for n, record in enumerate(records()):
            line = ("" if n == 0 else ",\n") + json.dumps(asdict(record), ensure_ascii=False)
            handle.write(line.encode("utf-8"))
        handle.write(b"\n]}\n")

    def write_csv(handle) -> None:
        text = io.TextIOWrapper(handle, encoding="utf-8", newline="")
        writer = csv.writer(text)
        pairs = any(sentence.target is not None for sentence in sentences.items)
        writer.writerow(
            ["index", "line", "status", "folder", "n_tokens", "tokens", "files", "text"]
            + ["target"] * pairs
        )
        for r in records():
            files = ";".join(Path(f).name for f in r.files)  # names inside `folder`
            writer.writerow(
                [
                    r.index,
                    r.line,
                    r.status,
                    r.folder,
                    len(r.tokens),
                    " ".join(r.tokens),
                    files,
                    r.text,
                ]
                + [r.target] * pairs
            )
        text.flush()
        text.detach()

    write_atomic(summary.out / "manifest.json", write_json)
    write_atomic(summary.out / "manifest.csv", write_csv)
