"""Atomic writes and output folders."""

from __future__ import annotations

import pytest

from attnviz.errors import OutputError
from attnviz.files import prepare_dir, slug, write_atomic, write_text_atomic


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
