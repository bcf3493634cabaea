"""Drawing one text's figures in worker processes writes the pictures one process writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from attnviz.errors import OutputError
from attnviz.outputs import render
from attnviz.outputs.figures import Labels, Style
from tests.conftest import same_pictures, synthetic_attention


def _attention(seed=5, n_layers=3, n_heads=4, n=11):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n_layers, n_heads, n, n)) * 2
    weights = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return synthetic_attention(weights, [f"tok{i}" for i in range(n)])


def _same_files(there, written_there, here, written_here):
    """The same files in the same order, each the same picture (`same_pictures`)."""
    assert [p.name for p in written_there] == [p.name for p in written_here]
    assert sorted(p.name for p in there.iterdir()) == sorted(p.name for p in here.iterdir())
    for a, b in zip(written_there, written_here):
        same_pictures(a, b)


@pytest.mark.slow  # seconds of end-to-end model and figure work
@pytest.mark.parametrize("kinds", [render.KINDS, ("heads",), ("overview", "layers")])
def test_workers_write_the_same_files_as_one_process(tmp_path, kinds):
    att = _attention()
    layers, heads = [0, 2], [1, 2, 3]
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    style = Style(scale="head")
    one = render.render_text(att, here, layers, heads, style, kinds, query=4, jobs=1)
    two = render.render_text(att, there, layers, heads, style, kinds, query=4, jobs=2)
    assert [p.parent for p in two] == [there] * len(two)
    _same_files(there, two, here, one)  # same names, order and pictures
    expected = 1 + ("overview" in kinds) + ("layers" in kinds) * 2 + ("heads" in kinds) * 6
    assert len(one) == expected
    assert one[0].name == "query-tok4-4.png"
    if kinds == render.KINDS:  # the order of the files: query, overview, grids, heads
        names = [p.name for p in one]
        assert names[1:4] == ["overview.png", "layer-00.png", "layer-02.png"]
        assert names[4:] == [f"layer-{n:02d}-head-{h:02d}.png" for n in layers for h in heads]


def test_a_worker_draws_a_second_text_with_its_own_labels(tmp_path):
    """Workers keep a text's figures between its tasks: the next text must not reuse them."""
    first, second = _attention(seed=1, n=6), _attention(seed=2, n=13)
    for att, name in ((first, "a"), (second, "b")):
        for jobs in (1, 2):
            folder = tmp_path / f"{name}{jobs}"
            folder.mkdir()
            render.render_text(att, folder, [0, 1], [0, 1, 2, 3], Style(), ("heads",), jobs=jobs)
    for name in "ab":
        for path in (tmp_path / f"{name}1").iterdir():
            same_pictures(path, tmp_path / f"{name}2" / path.name)


def test_tasks_carry_only_the_arrays_they_draw(tmp_path):
    att = _attention(n_layers=3, n_heads=4, n=11)
    tasks = list(render.tasks(att, tmp_path, [0, 2], [1, 3], Style(), query=3))
    kinds = [task.kind for task in tasks]
    assert kinds == ["heads", "heads", "layer", "layer", "overview", "query"]  # most work first
    for task in tasks:
        if task.kind in ("heads", "layer"):
            (layer,) = task.layers
            assert task.weights.shape == (1, 4, 11, 11)
            assert np.array_equal(task.weights[0, 3], att.pattern(layer, 3))
        else:
            assert task.weights is None
    overview, query = tasks[-2:]
    assert overview.data.shape[0] < 3 * 11 * 2 and query.data[1].shape == (2 * 2, 11)
    assert query.data[1][3].tolist() == att.pattern(2, 3)[3].tolist()  # layer 2, head 3


def test_with_shared_weights_the_overview_comes_first_and_maps_each_layer_in_turn(tmp_path):
    """With the weights in shared memory the overview, the largest task, goes first with no
    arrays: its worker maps one layer at a time and computes the mosaic itself, the same one."""
    from dataclasses import replace

    from attnviz.outputs.figures import overview_mosaic

    att = _attention(n_layers=3, n_heads=4, n=11)
    shared = render.Shared.share(att.weights)
    try:
        tasks = list(render.tasks(att, tmp_path, [0, 2], [1, 3], Style(), shared=shared))
        assert [task.kind for task in tasks] == ["overview", "heads", "heads", "layer", "layer"]
        overview = tasks[0]
        assert overview.data == (0, 2) and overview.weights is None  # the layers' slots
        assert overview.rank == 1  # the files keep their order: the query's, then this one
        assert overview.shared.slot is None  # each layer mapped in turn
        assert all(task.weights is None for task in tasks)  # each layer mapped in the worker
        each = [replace(overview.shared, slot=slot).mapped()[0] for slot in overview.data]
        there = overview_mosaic(overview.labels, each, [0, 2], [1, 3], 100)
        labels = Labels.of(att)
        here = overview_mosaic(labels, [att.weights[0], att.weights[2]], [0, 2], [1, 3], 100)
        assert np.array_equal(there, here, equal_nan=True)  # NaN: the gaps between panels
    finally:
        shared.remove()


@pytest.mark.slow  # a real process, started, signalled or killed
def test_a_dead_worker_is_one_clear_error(tmp_path):
    att = _attention()
    pool = render.start_workers(3)  # a pool of its own, killed here
    pool.submit(int).result()
    for pid in list(pool._processes):
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(OutputError, match="drawing process died"):
        for _ in range(50):  # until the pool has noticed
            render.render_text(att, tmp_path, [0], [0], Style(), jobs=3)
    assert 3 not in render._pools  # the next call starts a fresh pool
    assert render.render_text(att, tmp_path, [0], [0], Style(), ("heads",), jobs=3)
    render._pools.pop(3).shutdown()


@pytest.mark.slow  # a real process, started, signalled or killed
def test_show_with_workers_exits_cleanly(tiny_model_dirs, tmp_path):
    """The console entry point leaves without teardown: output complete, exit codes kept,
    and on stderr only where the files went (no leaked semaphores, no worker tracebacks)."""
    model = str(tiny_model_dirs["bert"])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "attnviz", "show", "The cat sat on the mat.", "-m", model,
               "-o", str(tmp_path), "--jobs", "2", "--json"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    # nothing on stderr but where the files went (no leaked semaphores, no tracebacks)
    assert done.stderr.splitlines() == [f"wrote {len(data['images'])} files to {data['folder']}/"]
    assert len(data["images"]) > 3 and all(os.path.getsize(p) > 1000 for p in data["images"])
    bad = subprocess.run(command + ["--layer", "99"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: layer 99")


def test_long_texts_are_drawn_here_not_copied_to_workers(tmp_path, monkeypatch):
    """A layer over MAX_LAYER_BYTES would be copied into each worker: drawn here instead."""
    att = _attention()

    def no_pool(jobs):
        raise AssertionError("a worker pool was used")

    monkeypatch.setattr(render, "start_workers", no_pool)
    monkeypatch.setattr(render, "MAX_LAYER_BYTES", att.weights[0].nbytes - 1)
    files = render.render_text(att, tmp_path, [0, 1], [0, 1], Style(), jobs=2)
    assert len(files) == 1 + 2 + 4
    monkeypatch.setattr(render, "MAX_LAYER_BYTES", att.weights[0].nbytes)
    with pytest.raises(AssertionError, match="worker pool was used"):
        render.render_text(att, tmp_path, [0, 1], [0, 1], Style(), jobs=2)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                if entry.isdigit() and int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


@pytest.mark.slow  # a real process, started, signalled or killed
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_workers_leave_when_the_main_process_is_killed(tiny_model_dirs, tmp_path):
    """kill -9 (or the OOM killer) on attnviz must not leave its drawing workers behind,
    blocked forever on their task queue."""
    import time

    command = [sys.executable, "-m", "attnviz", "show", "The cat sat on the mat.", "-m",
               str(tiny_model_dirs["bert"]), "-o", str(tmp_path), "--jobs", "2"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(workers := _children(process.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)  # the resource tracker and two workers
    assert len(workers) >= 3, "the workers never started"
    process.kill()
    process.wait()
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = []
    for pid in workers:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] != "Z":  # not a zombie
                    alive.append(pid)
        except OSError:
            pass
    assert not alive


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_every_file_render_writes_is_named_as_a_text_file(tmp_path):
    """clear_previous(text_folder=True) finds an interrupted run's files by their names."""
    from attnviz.outputs.files import TEXT_FILES

    att = _attention()
    for fmt in ("png", "svg"):
        written = render.render_text(att, tmp_path, [0, 2], [1, 3], Style(fmt=fmt), query=4)
        assert written and all(TEXT_FILES.fullmatch(path.name) for path in written)


def test_a_free_worker_gets_a_task_whose_figure_it_holds(tmp_path):
    """Workers keep their kind (each figure laid out once), spread kinds nobody holds, and
    take over another kind only where laying its figure out costs less than waiting."""
    att = _attention(n_layers=3)
    made = list(render.tasks(att, tmp_path, [0, 1, 2], [0, 1], Style()))

    def choose(held, holders, seconds=None, kinds=("heads", "layer")):
        waiting = [task for task in made if task.kind in kinds]
        task = render._choose(waiting, held, holders, seconds or {})
        return task and (task.kind, task.layers[0])

    nobody = {"heads": 0, "layer": 0}
    assert choose(set(), nobody) == ("heads", 0)
    assert choose(set(), {"heads": 1, "layer": 0}) == ("layer", 0)  # the other kind
    assert choose({"layer"}, {"heads": 1, "layer": 1}) == ("layer", 0)
    assert choose({"layer"}, {"heads": 1, "layer": 1}, kinds=("heads", "overview")) == (
        "overview", 0)  # fmt: skip
    # 3 heads tasks wait for 1 holder: 3 × 0.1 s there, 0.5 s to lay the figure out here
    slow = {("heads", False): 0.1, ("heads", True): 0.5}
    assert choose({"layer"}, {"heads": 1, "layer": 1}, slow, kinds=("heads",)) is None
    fast = {("heads", False): 0.1, ("heads", True): 0.2}
    assert choose({"layer"}, {"heads": 1, "layer": 1}, fast, kinds=("heads",)) == ("heads", 0)


@pytest.mark.slow  # seconds of figure work in worker processes
def test_figures_laid_out_ahead_draw_the_same_pictures(tmp_path, monkeypatch):
    """`prepare` lays out a text's figures in the drawing processes before its weights exist;
    the text drawn after writes what one process writes, its weights mapped from a file that
    is gone once the drawing is done."""
    from dataclasses import replace

    shared = []
    share = render.Shared.share
    monkeypatch.setattr(render.Shared, "share", lambda w: shared.append(share(w)) or shared[-1])
    att = _attention(seed=7, n=9)
    layers, heads, style = [0, 1, 2], [0, 1, 2, 3], Style()
    stand_in = np.broadcast_to(np.zeros((), np.float32), att.weights.shape)
    render.prepare(replace(att, weights=stand_in), heads, style, jobs=2)
    key, ahead = render._ahead[2]
    assert key == render.figure_key(Labels.of(att), heads, style)  # weights are not in the key
    assert [future.result()[1] for future in ahead] == [{"heads", "layer"}] * 2
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    one = render.render_text(att, here, layers, heads, style, jobs=1)
    two = render.render_text(att, there, layers, heads, style, jobs=2)
    assert 2 not in render._ahead  # taken by the drawing
    _same_files(there, two, here, one)
    assert len(shared) == 1 and shared[0].path.name.startswith(render.SHARED_PREFIX)
    assert not shared[0].path.exists()


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_show_lays_out_its_figures_while_the_model_loads(tiny_model_dirs, tmp_path, monkeypatch):
    """`show` lays the figures out from the tokens alone, before the weights load, for the
    very text and view it then draws; not for a view it cannot know yet (--words)."""
    from typer.testing import CliRunner

    from attnviz.cli import app

    made: dict[str, list[str]] = {}
    real_prepare, real_tasks = render.prepare, render.tasks

    def prepare(att, heads, style, jobs, kinds=render.KINDS):
        made["ahead"].append(render.figure_key(Labels.of(att), heads, style))
        return real_prepare(att, heads, style, jobs, kinds)

    def tasks(att, folder, layers, heads, style, *rest, **named):
        made["drawn"].append(render.figure_key(Labels.of(att), heads, style))
        return real_tasks(att, folder, layers, heads, style, *rest, **named)

    monkeypatch.setattr(render, "prepare", prepare)
    monkeypatch.setattr(render, "tasks", tasks)
    cases = [
        ("bert", [], True),
        ("bert", ["--pair", "A dog ran.", "-l", "1", "-H", "0"], True),
        ("gpt2", ["--query", "cat"], True),
        ("llama", [], True),
        ("bert", ["--words"], False),
    ]
    for arch, extra, ahead in cases:
        made.update(ahead=[], drawn=[])
        out = tmp_path / f"{arch}-{len(extra)}"
        result = CliRunner().invoke(
            app, ["show", "The cat sat on the mat.", "-m", str(tiny_model_dirs[arch]),
                  "-o", str(out), "-j", "2", *extra],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert made["drawn"], (arch, extra)
        if ahead:
            assert made["ahead"] and made["ahead"][0] == made["drawn"][0], (arch, extra)
        else:
            assert not made["ahead"], (arch, extra)


@pytest.mark.slow  # seconds of figure work in worker processes
def test_without_shared_memory_the_tasks_carry_the_weights(tmp_path, monkeypatch):
    """Where the weights' file cannot be written (a container's small /dev/shm), the tasks
    carry copies as before, and the files are the same."""
    import tempfile

    def no_room(*args, **kwargs):
        raise OSError(28, "No space left on device")

    att = _attention(seed=3, n=8)
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    one = render.render_text(att, here, [0, 1], [0, 1], Style(), jobs=1)
    monkeypatch.setattr(tempfile, "mkstemp", no_room)
    assert render.Shared.share(att.weights) is None
    two = render.render_text(att, there, [0, 1], [0, 1], Style(), jobs=2)
    _same_files(there, two, here, one)
