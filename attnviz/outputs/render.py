"""Writing one text's figures: which files it gets, drawn in this process or on every core.

A text gets an overview, one grid per layer, one figure per head and, with a query, where
that token looks (`figures` says what each looks like). `render_text` reads the text's
labels from its Attention once (`figures.Labels`) and cuts the figures into tasks: the query,
the overview, each layer's grid and each layer's heads. A task carries the labels and only
the arrays it draws (the query's rows); the text's weights are written once to a file in
shared memory (`Shared`), from which a worker maps a layer, or each layer in turn for the
overview's averaged mosaic (where that file cannot be written, a layer's weights are sent
with its task and the mosaic is computed here). The figures take those arrays and labels:
they ask the Attention nothing.

Workers are started early on purpose: `show` starts them before it imports torch, so that
while this process imports torch and transformers and loads the model (one core), they import
matplotlib, draw a first figure, then lay out the text's head and layer figures from its
tokens alone (`prepare`). A worker keeps the figures it laid out, by `figure_key` (what they
are drawn from, all but the weights), across a text's tasks (blitting, see `figures`). Where
every worker holds every figure, the tasks are all handed out at once; else a worker is
handed a task only when it is free: one whose figure it already holds where one is left, so
that with 2 workers one draws the heads and the other the grids, each laid out once.
Pools belong to this process (a spawned worker cannot share one with another process); they
live as long as it does and are reused by later calls, and starting or stopping them is safe
from several threads. Texts so long that one
layer's weights pass `MAX_LAYER_BYTES` are drawn in this process, to keep memory flat.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.core import interrupts, memory
from attnviz.errors import OutputError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from concurrent.futures import Future, ProcessPoolExecutor

    from attnviz.core.attention import Attention
    from attnviz.outputs.figures import Labels, Style

# The figure kinds a text gets, with what each shows: `export --figures`'s choices and help.
FIGURES = {
    "overview": "every layer × head as small multiples",
    "layers": "one grid of heads per layer",
    "heads": "one figure per head",
}
KINDS = tuple(FIGURES)
MAX_DEFAULT_JOBS = 4
# A task sends one layer's weights to a worker, which then holds a copy (and matplotlib its
# own while drawing). Above this, as with SmolLM2's 9 heads at 2,048 tokens (151 MB a layer),
# the figures are drawn in this process instead: the copies would cost more memory than the
# drawing costs time next to such a forward pass. (`core.memory`'s estimate counts on it.)
MAX_LAYER_BYTES = memory.MAX_LAYER_BYTES


def default_jobs() -> int:
    """Drawing processes `show` uses unless told: one per core it may run on, at most 4;
    1 (draw in this process) on a single core."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return min(cores, MAX_DEFAULT_JOBS)


@dataclass(frozen=True)
class Task:
    """Some figures of one text, drawn together."""

    rank: int  # where its files come in the text's list of files
    kind: str  # "query", "overview", "layer" (the grid of one layer) or "heads" (of one layer)
    labels: Labels
    folder: Path
    layers: list[int]
    heads: list[int]
    style: Style
    text_key: str  # the same for all tasks of one text: a worker keeps its figures meanwhile
    # the overview's mosaic, the query's (position, rows), or the slots of the overview's
    # layers in the shared weights
    data: Any = None
    shared: Shared | None = None  # where a worker maps the weights of `layers` from
    weights: Any = None  # (1, H, T, S): the weights of a "layer" or "heads" task's layer


SHARED_PREFIX = "attnviz-weights-"  # the name of each text's weights file in /dev/shm


@dataclass(frozen=True)
class Shared:
    """A text's weights in a file in shared memory (/dev/shm where there is one), written once
    by `share` for the drawing processes, which map the part of a task's layer from it rather
    than each receive a pickled copy (at 512 tokens 13 MB a layer, sent once for its heads and
    once for its grid, and copied three times on the way). The file goes with `remove`."""

    path: Path
    shape: tuple[int, ...]  # (L, H, T, S), C order
    dtype: str
    slot: int | None = 0  # the layer a task maps, `att.slot(layer)`; None: each in turn

    @classmethod
    def share(cls, weights: Any) -> Shared | None:
        """`weights` written to a new file, or None where it cannot be written (a container's
        /dev/shm is 64 MB unless told otherwise): the tasks then carry copies."""
        import tempfile

        import numpy as np

        where = "/dev/shm" if os.path.isdir("/dev/shm") else None
        name = None
        interrupts.hold()  # drawing begins: the file is removed once the figures are drawn
        try:
            handle, name = tempfile.mkstemp(prefix=SHARED_PREFIX, suffix=".bin", dir=where)
            with os.fdopen(handle, "wb") as file:
                np.ascontiguousarray(weights).tofile(file)
        except OSError:
            if name is not None:
                Path(name).unlink(missing_ok=True)
            return None
        return cls(Path(name), tuple(weights.shape), str(weights.dtype))

    def mapped(self) -> Any:
        """Slot `slot`'s weights (1, H, T, S), mapped read-only from the file."""
        import numpy as np

        assert self.slot is not None, "the overview maps one slot at a time"
        size = math.prod(self.shape[1:]) * np.dtype(self.dtype).itemsize
        return np.memmap(self.path, self.dtype, "r", self.slot * size, (1, *self.shape[1:]))

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def query_file(labels: Labels, index: int, ext: str) -> str:
    from attnviz.outputs.files import slug

    return f"query-{slug(labels.tokens[index], 20)}-{labels.first + index}.{ext}"


def layer_file(layer: int, ext: str) -> str:
    return f"layer-{layer:02d}.{ext}"


def head_file(layer: int, head: int, ext: str) -> str:
    return f"layer-{layer:02d}-head-{head:02d}.{ext}"


def figure_key(labels: Labels, heads: list[int], style: Style) -> str:
    """What a text's head and layer figures are laid out from, as a key: its labels (tokens,
    view, window, pooling, removed heads, the model's name, whether it is causal…), the heads
    and the style; not the weights, which each frame sets. A worker keeps the figures of one
    key across tasks, so figures laid out ahead (`prepare`) serve the text whose weights come
    later."""
    import hashlib
    import pickle

    return hashlib.sha1(pickle.dumps((labels, tuple(heads), style), protocol=5)).hexdigest()


def prepare(att: Attention, heads: list[int], style: Style, jobs: int,
            kinds: tuple[str, ...] = KINDS) -> None:  # fmt: skip
    """Have each of the `jobs` drawing processes lay out `att`'s head, layer and overview
    figures now (those of `kinds`), before its weights exist (`att` holds its labels; its
    weights may be a stand-in of their shape): `show` calls it while the model loads, so that
    drawing starts with the frames. A later `render_text` of a text with the same
    `figure_key` finds them laid out (the overview where its layers are the same too); of
    another, lays out its own. Nothing to do with 1 job, where no figure is kept, or where a
    layer's weights are over `MAX_LAYER_BYTES` (drawn in this process)."""
    from attnviz.outputs.figures import Labels

    if _drawn_here(att, jobs) or not kinds:
        return
    labels = Labels.of(att)
    key = figure_key(labels, heads, style)
    pool = start_workers(jobs)
    task = Task(-1, "prepare", labels, Path(), att.held_layers(), heads, style, key, kinds)
    # one each, as a rule (a free process takes the next task); `_hand_out` learns from
    # them which process holds which figure
    _ahead[jobs] = (key, [pool.submit(_lay_out, task) for _ in range(jobs)])


def _drawn_here(att: Attention, jobs: int) -> bool:
    """Whether `att`'s figures are drawn in this process: with 1 job, or where one layer's
    weights are over `MAX_LAYER_BYTES` (each worker would hold them)."""
    return jobs <= 1 or att.weights[0].nbytes > MAX_LAYER_BYTES


# The figures being laid out ahead in each pool, by its size: their key and the futures.
_ahead: dict[int, tuple[str, list[Future]]] = {}


def tasks(
    att: Attention,
    folder: Path,
    layers: list[int],
    heads: list[int],
    style: Style,
    kinds: tuple[str, ...] = KINDS,
    query: int | None = None,
    shared: Shared | None = None,
) -> Iterator[Task]:
    """One text's figures as tasks, the most work first: the overview, each layer's heads,
    each layer's grid, the query. `Task.rank` gives the order of the files. With `shared`
    (`att`'s weights in shared memory), the tasks carry no weights: the worker maps a layer's,
    or each layer's in turn for the overview's mosaic, which it computes (the largest task: 0.18 s
    at 512 tokens, first so that it does not end the text alone). Without it, the overview
    comes after the grids, its mosaic computed here (a generator) while workers draw the
    first tasks; the query's rows always are."""
    from attnviz.outputs.figures import Labels, overview_mosaic, query_rows

    labels = Labels.of(att)
    slots = {layer: att.slot(layer) for layer in layers}  # where each layer is in `weights`
    key = figure_key(labels, heads, style)
    rank = itertools.count()
    query_rank, overview_rank = next(rank), next(rank)
    grid_ranks = {layer: next(rank) for layer in layers}
    head_ranks = {layer: next(rank) for layer in layers}

    def task(rank: int, kind: str, layer: int) -> Task:
        if shared is not None:  # the worker maps the layer's weights (`_draw_timed`)
            return Task(rank, kind, labels, folder, [layer], heads, style, key,
                        shared=replace(shared, slot=slots[layer]))  # fmt: skip
        weights = att.weights[slots[layer]][None]  # (1, H, T, S): a view here, a copy there
        return Task(rank, kind, labels, folder, [layer], heads, style, key, weights=weights)

    if "overview" in kinds and shared is not None:  # its mosaic computed by the worker
        yield Task(overview_rank, "overview", labels, folder, layers, heads, style, key,
                   tuple(slots.values()), replace(shared, slot=None))  # fmt: skip
    if "heads" in kinds:
        for layer in layers:
            yield task(head_ranks[layer], "heads", layer)
    if "layers" in kinds and not labels.per_layer:  # one map a layer: the "heads" figures
        for layer in layers:
            yield task(grid_ranks[layer], "layer", layer)
    each = [att.weights[slot] for slot in slots.values()]  # (H, T, S) a layer: views
    if "overview" in kinds and shared is None:
        mosaic = overview_mosaic(labels, each, layers, heads, style.dpi)
        yield Task(overview_rank, "overview", labels, folder, layers, heads, style, key, mosaic)
    if query is not None:
        rows = query_rows(labels, each, query, layers, heads, style)
        yield Task(query_rank, "query", labels, folder, layers, heads, style, key, (query, rows))


def render_text(
    att: Attention,
    folder: Path,
    layers: list[int],
    heads: list[int],
    style: Style,
    kinds: tuple[str, ...] = KINDS,
    query: int | None = None,
    jobs: int = 1,
) -> list[Path]:
    """Write the overview, one grid per layer and one figure per head for one text into
    `folder`; return the files, the query's first, then the overview, the grids, the heads.

    `kinds` chooses which of the three to write; with `query` (a token position), also the
    figure of where that token looks, `query-<token>-<position>`. `jobs` above 1 draws in
    that many worker processes (started now if `start_workers` did not), unless one layer's
    weights are over `MAX_LAYER_BYTES`.
    """
    done: list[tuple[int, list[Path]]] = []
    if _drawn_here(att, jobs):
        todo = tasks(att, folder, layers, heads, style, kinds, query)  # made as they are drawn
        try:
            done = [(task.rank, draw(task)) for task in todo]
        finally:
            _forget()
    else:
        pool = start_workers(jobs)
        futures: dict[Future, Any] = {}
        memory.return_freed_memory()  # not held here while the workers draw (the summary's)
        shared = Shared.share(att.weights)
        try:
            todo = tasks(att, folder, layers, heads, style, kinds, query, shared)
            done = _hand_out(pool, jobs, todo, futures)
        except BaseException as error:
            for future in futures:
                future.cancel()
            from concurrent.futures.process import BrokenProcessPool

            if isinstance(error, BrokenProcessPool):
                _pools.pop(jobs, None)
                raise OutputError(
                    "a drawing process died before finishing (out of memory?); "
                    "try again with --jobs 1"
                ) from None
            raise
        finally:
            if shared is not None:
                shared.remove()  # a process still drawing keeps its mapping
    return [path for _, paths in sorted(done, key=lambda item: item[0]) for path in paths]


# The figure a worker lays out once per text and keeps, by task kind.
FIGURE_OF = {"heads": "head", "layer": "layer"}
NAP_S = 0.02  # a worker with nothing worth drawing yet waits this long, then is asked again


def _hand_out(
    pool: ProcessPoolExecutor, jobs: int, todo: Iterator[Task], running: dict[Future, Any]
) -> list[tuple[int, list[Path]]]:
    """Draw `todo` in the pool's `jobs` processes. Where each holds every figure already
    (`prepare`), all at once; else handing a process its next task only when
    it has finished one (each holds one task, or a nap, at a time, so what is handed out goes
    to the process that just finished, unless two finish at once), so that each figure of a
    text is laid out in as few processes as keep them all busy: at 512 tokens a head figure
    takes 0.2 s to lay out, a layer grid 0.45 s (as long as 6 of its frames), and two processes
    drawing both kinds, as they did, lay out both twice.
    `running` maps each future to its task (None: a nap) and whether it lays out a figure anew.
    """
    from concurrent.futures import FIRST_COMPLETED, wait

    waiting: list[Task] = []
    for task in todo:  # these tasks cost nothing to make: take them up to the first grid
        waiting.append(task)
        if task.kind not in ("overview", "heads"):
            break
    holds: dict[int, set[str]] = {}  # worker's pid -> the kinds whose figure it holds
    key, ahead = _ahead.pop(jobs, (None, []))
    for future in ahead if waiting and waiting[0].text_key == key else ():
        worker, kinds = future.result()  # laid out ahead: queued before these tasks
        holds.setdefault(worker, set()).update(kinds)
    seconds: dict[tuple[str, bool], float] = {}  # (kind, laid out anew) -> a task's seconds
    done: list[tuple[int, list[Path]]] = []
    if len(holds) == jobs and all(kinds >= set(FIGURE_OF) for kinds in holds.values()):
        # every process holds every figure: any may take any task, so the pool's own queue
        # hands them out, sending the next ones while the first are drawn
        for task in itertools.chain(waiting, todo):
            running[pool.submit(_draw_timed, task)] = (task, False)
        for future in list(running):
            task, _ = running.pop(future)
            done.append((task.rank, future.result()[3]))
        return done

    def hand(held: set[str]) -> None:
        holders = {kind: sum(kind in kinds for kinds in holds.values()) for kind in FIGURE_OF}
        for task, anew in running.values():
            if anew:  # laying it out now
                holders[task.kind] += 1
        task = _choose(waiting, held, holders, seconds)
        anew = task is not None and task.kind in FIGURE_OF and task.kind not in held
        running[pool.submit(_draw_timed, task)] = (task, anew)

    for _ in range(jobs):
        hand(set())
    waiting.extend(todo)  # the overview's mosaic and the query's rows, made while they draw
    while waiting or any(task is not None for task, _ in running.values()):
        finished, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in finished:
            task, _ = running.pop(future)
            worker, laid_out, took, paths = future.result()
            held = holds.setdefault(worker, set())
            if task is not None:
                done.append((task.rank, paths))
                if task.kind in FIGURE_OF:
                    held.add(task.kind)
                    seconds[task.kind, laid_out] = took
            if waiting:
                hand(held)
    wait(running)  # naps
    return done


def _choose(
    waiting: list[Task],
    held: set[str],
    holders: dict[str, int],
    seconds: dict[tuple[str, bool], float],
) -> Task | None:
    """Take from `waiting` the next task of a free worker that holds the figures of the kinds
    `held`: one of those kinds; else one needing no figure kept (overview, query); else one of
    a kind no worker holds; else one of a kind that `holders` workers hold where laying its
    figure out here takes less time than they need for the waiting ones (or, before any task
    was timed, where more wait than they are). None (a nap) where none is.
    """

    def take(fits: Any) -> Task | None:
        for i, task in enumerate(waiting):
            if fits(task.kind):
                return waiting.pop(i)
        return None

    def worth(kind: str) -> bool:
        count = sum(task.kind == kind for task in waiting)
        frame, laid_out = seconds.get((kind, False)), seconds.get((kind, True))
        if frame is None or laid_out is None:
            return count > holders[kind]
        return count * frame / holders[kind] > laid_out

    return (
        take(lambda kind: kind in held)
        or take(lambda kind: kind not in FIGURE_OF)
        or take(lambda kind: holders[kind] == 0)
        or take(worth)
    )


def _draw_timed(task: Task | None) -> tuple[int, bool, float, list[Path]]:
    """In a worker: draw `task` and return this process's id, whether it laid out the task's
    figure, the seconds it took and the files; for None, nap and return no files."""
    import time

    start = time.perf_counter()
    if task is None:
        time.sleep(NAP_S)
        return os.getpid(), False, 0.0, []
    if task.shared is not None and task.shared.slot is not None:  # the overview maps its own
        task = replace(task, weights=task.shared.mapped(), shared=None)
    figure = FIGURE_OF.get(task.kind)
    laid_out = figure is not None and (_held.get("text") != task.text_key or figure not in _held)
    paths = draw(task)
    return os.getpid(), laid_out, time.perf_counter() - start, paths


# This process's figures of the text it is drawing (in a worker, or here with jobs=1).
_held: dict[str, Any] = {}


def _lay_out(task: Task) -> tuple[int, set[str]]:
    """In a worker: lay out the figures of `task` (kind "prepare", its `data` the kinds of
    figure), kept as a text's figures are kept, unless they already are; return this
    process's id and the task kinds whose figure it now holds."""
    from attnviz.outputs import figures

    if _held.get("text") != task.text_key:
        _forget()
        _held["text"] = task.text_key
    if "heads" in task.data and "head" not in _held:
        _held["head"] = figures.HeadFigure(task.labels, task.style)
        _held["head"].frames.lay_out()
    if "layers" in task.data and not task.labels.per_layer and "layer" not in _held:
        _held["layer"] = figures.LayerFigure(task.labels, task.heads, task.style)
        _held["layer"].frames.lay_out()
    if "overview" in task.data and "overview" not in _held:
        overview = figures.OverviewFigure(task.labels, task.layers, task.heads, task.style)
        overview.frames.lay_out()
        _held["overview"] = (tuple(task.layers), overview)
    return os.getpid(), {kind for kind, figure in FIGURE_OF.items() if figure in _held}


def draw(task: Task) -> list[Path]:
    """Draw one task's figures and write them; return their paths."""
    from attnviz.outputs import figures

    labels, style, ext, folder = task.labels, task.style, task.style.fmt, task.folder
    if task.kind == "query":
        index, rows = task.data
        fig = figures.query_figure(labels, index, rows, task.layers, task.heads, style)
        return [figures.save_figure(fig, folder / query_file(labels, index, ext), style)]
    if task.kind == "overview":
        path = folder / f"overview.{ext}"
        mosaic, shared = task.data, task.shared
        if shared is not None:  # the mosaic made here, from one layer's mapped weights at a time
            each = (replace(shared, slot=slot).mapped()[0] for slot in task.data)  # (H, T, S)
            mosaic = figures.overview_mosaic(labels, each, task.layers, task.heads, style.dpi)
        held = _held.pop("overview", None) if _held.get("text") == task.text_key else None
        if held is not None and held[0] == tuple(task.layers):  # laid out ahead, drawn once
            try:
                return [held[1].save(mosaic, path)]
            finally:
                held[1].close()
        fig = figures.overview_figure(labels, mosaic, task.layers, task.heads, style)
        return [figures.save_figure(fig, path, style)]
    (layer,) = task.layers
    if _held.get("text") != task.text_key:
        _forget()
        _held["text"] = task.text_key
    if task.kind == "layer":
        path = folder / layer_file(layer, ext)
        if "layer" not in _held:
            _held["layer"] = figures.LayerFigure(labels, task.heads, style)
        return [_held["layer"].save(task.weights[0], layer, path)]
    # A per-layer measure (alti, rollout) has one map a layer: layer-LL, no head.
    names = [layer_file(layer, ext) if labels.per_layer else head_file(layer, head, ext)
             for head in task.heads]  # fmt: skip
    if "head" not in _held:
        _held["head"] = figures.HeadFigure(labels, style)
    written = []
    for head, name in zip(task.heads, names):
        grid = task.weights[0, head]  # (T, S); a per-layer measure's one map is head 0
        title = figures.head_title(labels, layer, head, grid)
        removed = (layer, head) in labels.removed
        written.append(_held["head"].save(grid, title, folder / name, removed=removed))
    return written


def _forget() -> None:
    """Free the figures held for the last text."""
    for name in ("layer", "head"):
        if (fig := _held.pop(name, None)) is not None:
            fig.close()
    if (held := _held.pop("overview", None)) is not None:
        held[1].close()
    _held.pop("text", None)


# Pools of drawing processes, by size; each lives until this process exits.
_pools: dict[int, ProcessPoolExecutor] = {}
_pools_lock = threading.Lock()


def start_workers(jobs: int) -> ProcessPoolExecutor:
    """The pool of `jobs` drawing processes, started now if it is not running yet.

    Call it before importing torch: the workers import matplotlib meanwhile.
    """
    with _pools_lock:
        return _pools.get(jobs) or _start(jobs)


def _start(jobs: int) -> ProcessPoolExecutor:
    import atexit
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn: a worker must not inherit torch's threads or a model from this process.
    pool = ProcessPoolExecutor(
        jobs,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_warm_up,
        initargs=(os.getpid(),),
    )
    for _ in range(jobs):  # a spawn pool starts one process per submission while none is idle
        pool.submit(int)
    if not _pools:  # stopped before the interpreter's teardown, which would find them half-gone
        atexit.register(stop_workers)
    _pools[jobs] = pool
    return pool


def stop_workers() -> None:
    """Stop every pool now (queued tasks are dropped)."""
    with _pools_lock:
        while _pools:
            _, pool = _pools.popitem()
            pool.shutdown(wait=True, cancel_futures=True)


def _warm_up(parent: int) -> None:
    """A worker's first step: ignore Ctrl-C (the parent handles it and stops the pool),
    leave if the `parent` process dies (even before this runs), import matplotlib, load its
    fonts and draw a small figure, so the first real one is fast; then freeze what is alive,
    so a collection per text costs little."""
    import atexit
    import gc
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    if hasattr(os, "nice"):
        os.nice(19)  # the process that loads and runs the model comes first: the workers
        # lay out figures on the core it leaves idle (at nice 5 they delayed it 0.1–0.15 s)
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from attnviz.outputs.figures import configure_matplotlib, fixed_axes

    configure_matplotlib()
    fig, ax = fixed_axes((1.0, 1.0), (0.5, 0.5, 0.5, 0.5), 100)
    image = ax.imshow(np.eye(4), interpolation="nearest")
    ax.set_xticks(range(4), ["warm", "up", "the", "fonts"], rotation=90)
    fig.colorbar(image, ax=ax)
    fig.text(0.5, 0.95, "attnviz", ha="center")
    FigureCanvasAgg(fig).draw()
    gc.collect()
    gc.freeze()
    # Leaving, skip the interpreter's teardown (freeing matplotlib's objects one by one, most
    # of the time `stop_workers` waits for): multiprocessing has run its own clean-ups by then.
    atexit.register(os._exit, 0)


def _exit_with(parent: int) -> None:
    """Exit when the parent is gone (killed, say): a worker blocked on its task queue would
    otherwise wait forever, since every worker holds that queue's other end too."""
    import time

    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)
