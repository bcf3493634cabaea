"""The API's attention is the model's at every length (issue 60): held whole in memory where it
fits, written to a `.npy` file with `to=`, or refused in one line before the model runs;
never a stand-in array. The bounds are set low so that tiny models cross them."""

from __future__ import annotations

import numpy as np
import pytest

import attnviz
from attnviz.core import memory
from attnviz.errors import InputError, MemoryLimitError

TEXT = "the cat sat on the mat and the dog sat on the log , then the cat ran to the dog"


def _eager(eager_tiny, arch: str) -> np.ndarray:
    """transformers' own `output_attentions` of TEXT, (L, H, T, T)."""
    import torch

    from attnviz.core.tokens import encode, pad

    loaded = eager_tiny[arch]
    with torch.inference_mode():
        out = loaded.model(**pad(loaded, [encode(loaded, TEXT)]), output_attentions=True)
    return torch.stack(out.attentions)[:, 0].float().numpy()


@pytest.mark.parametrize("arch", ["bert", "llama", "gpt2"])
def test_past_the_stream_bound_the_weights_are_the_models(tiny_model_dirs, eager_tiny, arch,
                                                          monkeypatch):  # fmt: skip
    monkeypatch.setattr(memory, "STREAM_ABOVE", 0)  # `show` would stream every text
    a = attnviz.attention(TEXT, model=str(tiny_model_dirs[arch]), device="cpu")
    theirs = _eager(eager_tiny, arch)
    assert a.weights.shape == theirs.shape
    np.testing.assert_allclose(a.weights, theirs, atol=1e-5)
    np.testing.assert_allclose(a.weights.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(a.pattern(1, 2), theirs[1, 2], atol=1e-5)


def test_a_continuation_past_the_bound_equals_one_below_it(tiny_model_dirs, monkeypatch):
    model = str(tiny_model_dirs["llama"])
    below = attnviz.attention(TEXT, model=model, device="cpu", generate=4)
    monkeypatch.setattr(memory, "STREAM_ABOVE", 0)
    past = attnviz.attention(TEXT, model=model, device="cpu", generate=4)
    assert past.tokens == below.tokens
    np.testing.assert_allclose(past.weights, below.weights, atol=1e-6)
    np.testing.assert_allclose(past.weights.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_to_a_file_the_weights_are_its_memory_map(tiny_model_dirs, eager_tiny, arch, tmp_path):
    path = tmp_path / "attention.npy"
    a = attnviz.attention(TEXT, model=str(tiny_model_dirs[arch]), device="cpu", to=path)
    assert isinstance(a.weights, np.memmap) and not a.weights.flags.writeable
    np.testing.assert_allclose(a.weights, _eager(eager_tiny, arch), atol=1e-5)
    np.testing.assert_array_equal(np.load(path), a.weights)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention.npy"]  # no part left


def _sizes(tiny_model_dirs, kept: int) -> tuple[int, int]:
    """The tokens of TEXT on the tiny llama, and the bytes its maps of `kept` layers, with
    the blocks of rows and the constant beside them, take (`memory.check_held`'s sum)."""
    from attnviz.core.recording import BLOCK_ROWS

    n = len(attnviz.attention(TEXT, model=str(tiny_model_dirs["llama"]), device="cpu").tokens)
    heads = 4
    blocks = 6 * BLOCK_ROWS * heads * n * memory.FLOAT
    return n, memory.BLOCKS + blocks + kept * heads * n * n * memory.FLOAT


def test_maps_past_the_memory_are_refused_in_one_line_before_the_model_runs(
    tiny_model_dirs, tmp_path, monkeypatch
):
    from attnviz.core import capture

    model = str(tiny_model_dirs["llama"])
    n, needed = _sizes(tiny_model_dirs, kept=2)
    monkeypatch.setattr(memory, "_own_rss", lambda: 0)
    monkeypatch.setenv(memory.ENV, str(needed - 1))
    ran = []
    monkeypatch.setattr(capture, "run", lambda *args, **kw: ran.append(1))
    with pytest.raises(MemoryLimitError) as refused:
        attnviz.attention(TEXT, model=model, device="cpu")
    said = str(refused.value)
    assert "\n" not in said and not ran
    assert f"over {n:,} tokens" in said and "layers=[…] with at most 1 of the 2 layers" in said
    assert "to='attention.npy'" in said and "a text of at most" in said
    monkeypatch.undo()
    # what it says fits, fits: one layer, or the file
    monkeypatch.setattr(memory, "_own_rss", lambda: 0)
    monkeypatch.setenv(memory.ENV, str(needed - 1))
    assert attnviz.attention(TEXT, model=model, device="cpu", layers=[1]).weights.shape[0] == 1
    a = attnviz.attention(TEXT, model=model, device="cpu", to=tmp_path / "a.npy")
    np.testing.assert_allclose(a.weights.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    "to, said",
    [
        ("missing/attention.npy", "does not exist"),
        ("a-file/attention.npy", "is not a folder"),
        ("attention.txt", "is not a .npy file name"),
        (".", "is a folder"),
    ],
)
def test_a_bad_file_is_one_line_and_nothing_is_written(tiny_model_dirs, tmp_path, to, said):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(InputError, match=said) as refused:
        attnviz.attention(TEXT, model=str(tiny_model_dirs["llama"]), device="cpu",
                          to=tmp_path / to if to != "." else tmp_path)  # fmt: skip
    assert "\n" not in str(refused.value)
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]


def test_a_disk_too_small_is_refused_before_the_model_runs(tiny_model_dirs, tmp_path,
                                                          monkeypatch):  # fmt: skip
    import shutil

    from attnviz.core import capture

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=100))
    monkeypatch.setattr(capture, "run", lambda *args, **kw: pytest.fail("the model ran"))
    with pytest.raises(InputError, match=r"has 0\.0 MB free"):
        attnviz.attention(TEXT, model=str(tiny_model_dirs["llama"]), device="cpu",
                          to=tmp_path / "attention.npy")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_a_pass_that_fails_leaves_no_half_written_file(tiny_model_dirs, tmp_path, monkeypatch):
    from attnviz.core.held import NpyFile

    def broken(self, slot, start, rows):
        raise KeyboardInterrupt

    monkeypatch.setattr(NpyFile, "write", broken)
    with pytest.raises(KeyboardInterrupt):
        attnviz.attention(TEXT, model=str(tiny_model_dirs["llama"]), device="cpu",
                          to=tmp_path / "attention.npy")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_to_takes_the_weights_as_the_model_made_them(tiny_model_dirs, tmp_path):
    with pytest.raises(InputError, match="leave out words"):
        attnviz.attention(TEXT, model=str(tiny_model_dirs["llama"]), device="cpu", words=True,
                          to=tmp_path / "attention.npy")  # fmt: skip
