"""Atomic writes and output folders."""

from __future__ import annotations

import pytest

from attnviz.errors import OutputError
from attnviz.outputs.files import prepare_dir, slug, write_atomic, write_text_atomic


def test_failed_write_leaves_nothing_behind(tmp_path):
    target = tmp_path / "figure.png"

    def half_then_fail(handle):
        handle.write(b"partial")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        write_atomic(target, half_then_fail)
    assert list(tmp_path.iterdir()) == []


def test_write_replaces_whole_file(tmp_path):
    target = write_text_atomic(tmp_path / "a.txt", "old")
    write_text_atomic(target, "new text")
    assert target.read_text() == "new text"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_prepare_dir_refuses_a_file_in_the_way(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match="it is a file"):
        prepare_dir(tmp_path / "f" / "deeper")
    assert prepare_dir(tmp_path / "new" / "deep").is_dir()


def test_slug():
    assert slug("Héllo, World! 世界") == "hello-world"
    assert slug("🙂") == "text"
    assert len(slug("word " * 50)) <= 40


def test_files_get_the_mode_the_umask_gives(tmp_path):
    """A real umask, in a fresh process: 022 gives 0644, 077 gives 0600 (as `touch` would)."""
    import subprocess
    import sys

    probe = (
        "import os, sys; from pathlib import Path;"
        "from attnviz.outputs.files import write_text_atomic;"
        "os.umask(int(sys.argv[2], 8)); p = write_text_atomic(Path(sys.argv[1]), 'x');"
        "print(oct(p.stat().st_mode & 0o777))"
    )
    for umask, mode in (("022", "0o644"), ("077", "0o600"), ("002", "0o664")):
        target = tmp_path / f"file-{umask}.txt"
        done = subprocess.run(
            [sys.executable, "-c", probe, str(target), umask], capture_output=True, text=True
        )
        assert done.stdout.strip() == mode, (umask, done.stderr)


def test_distinct_texts_get_distinct_folders():
    from attnviz.outputs.files import text_folder_name

    dog = text_folder_name("The quick brown fox jumps over the lazy dog.")
    cat = text_folder_name("The quick brown fox jumps over the lazy cat.")
    assert dog != cat and dog.startswith("the-quick-brown-fox-jumps-over-the-lazy")
    cjk = {text_folder_name(t) for t in ("猫が座った。", "犬が走った。", "🙂")}
    assert len(cjk) == 3 and all(name.startswith("text-") for name in cjk)
    assert text_folder_name("same text") == text_folder_name("same text")


def test_clear_previous_removes_only_the_last_runs_files(tmp_path):
    from attnviz.outputs.files import clear_previous, write_done

    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("a.png", "b.png", "mine.txt"):
        (folder / name).write_text("x")
    (folder / ".a.png.123.part").write_text("half")
    write_done(folder, {"k": 1}, {"files": ["run/a.png", "run/b.png"]})
    clear_previous(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["mine.txt"]


def test_a_text_folder_loses_the_files_of_an_interrupted_run(tmp_path):
    """Killed mid-render, a run leaves figures and no done.json: the next run removes them."""
    from attnviz.outputs.files import clear_previous

    folder = tmp_path / "text-0123abcd"
    folder.mkdir()
    ours = ["overview.png", "layer-03.svg", "layer-11-head-07.png", "layer-120-head-03.pdf",
            "query-it-10.png", "query-2019-5.png", "attention.html", "attention.npz"]  # fmt: skip
    theirs = ["notes.txt", "overview.png.bak", "layer-3-head.png", "my-plot.png"]
    for name in ours + theirs:
        (folder / name).write_text("x")
    clear_previous(folder)  # any folder: only what done.json lists (here nothing)
    assert len(list(folder.iterdir())) == len(ours + theirs)
    clear_previous(folder, text_folder=True)
    assert sorted(p.name for p in folder.iterdir()) == sorted(theirs)


def test_ctrl_c_ends_at_once_only_while_nothing_is_held(tmp_path, monkeypatch):
    """The command line's Ctrl-C ends the process at once (no KeyboardInterrupt that could land
    in Python code torch called from C++) until a file or folder is held: a probe file for
    its moment, a run's folder or a written file for good."""
    from attnviz.core import interrupts
    from attnviz.outputs.files import check_writable

    monkeypatch.setattr(interrupts, "_held_for_good", False)
    seen = []
    real = interrupts.holding

    def watched():
        seen.append(interrupts.at_once())  # asked before the block holds
        return real()

    monkeypatch.setattr(interrupts, "holding", watched)
    assert interrupts.at_once()
    check_writable(tmp_path / "out")  # only probes: held while the probe file exists
    with real():
        assert not interrupts.at_once()
    assert seen == [True] and interrupts.at_once()
    write_text_atomic(tmp_path / "a.txt", "text")
    assert not interrupts.at_once()  # from the first file on, Ctrl-C reaches the code


def test_export_stops_at_the_next_text_after_a_ctrl_c_python_swallowed(
    tiny_model_dirs, tmp_path, monkeypatch
):
    """A KeyboardInterrupt raised inside a finaliser is printed and dropped by Python; the
    handler's word (`interrupts.ask`) still stops export at its next text. Here the Ctrl-C
    came while the model loaded."""
    from attnviz.core import interrupts
    from attnviz.core.inputs import read_sentences
    from attnviz.core.models import Model
    from attnviz.core.settings import Load
    from attnviz.pipelines.export import export
    from attnviz.pipelines.request import ExportRequest

    load = Model.load

    def interrupted(model):
        interrupts.ask()
        return load(model)

    monkeypatch.setattr(interrupts, "_asked", False)  # restored after the test
    monkeypatch.setattr(Model, "load", interrupted)
    texts = [f"Sentence {i} is here." for i in range(4)]
    request = ExportRequest(Load(str(tiny_model_dirs["bert"])), out=tmp_path / "out",
                      sentences=read_sentences(None, texts), figures=("overview",))  # fmt: skip
    summary = export(request)
    assert summary.interrupted and summary.written == 0


def test_a_ctrl_c_in_a_weakref_callback_is_said_not_raised(monkeypatch):
    """Raised inside a weakref callback (the garbage collector's), a KeyboardInterrupt is
    printed with a traceback and dropped: the handler says it instead (`interrupts.ask`),
    and raises anywhere else."""
    import signal
    import sys

    from attnviz.cli import _on_ctrl_c
    from attnviz.core import interrupts

    monkeypatch.setattr(interrupts, "_held_for_good", True)  # files held: it would raise
    monkeypatch.setattr(interrupts, "_asked", False)
    scope = {"sys": sys}
    exec(compile("def remove():\n    return sys._getframe()\n", "/lib/weakref.py", "exec"), scope)
    _on_ctrl_c(signal.SIGINT, scope["remove"]())
    assert interrupts.asked()
    with pytest.raises(KeyboardInterrupt):
        _on_ctrl_c(signal.SIGINT, sys._getframe())
