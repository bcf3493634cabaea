"""What a run will hold, estimated before it starts, and the one-line refusal when it does not
fit: `attnviz.core.memory`, and `show`, `export` and the arrays' last check through it.
ATTNVIZ_MEMORY_LIMIT makes the memory available the same on every machine. How close the
estimate comes to a measured peak is a benchmark's to say (bench/bench_memory.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.core import memory
from attnviz.core.memory import Asked, estimate
from attnviz.errors import InputError, MemoryLimitError

runner = CliRunner()
# The bundled model's facts, as its files give them.
LAYERS, HEADS = 6, 12
TEXT = "The quick brown fox jumps over the lazy dog because it was bored."


def invoke(*args, limit=None, monkeypatch=None):
    if limit is not None:
        monkeypatch.setenv(memory.ENV, limit)
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def unloaded(monkeypatch):
    """Loading a model fails the test: a refusal must come first."""
    from attnviz.core.models import Model

    def no_load(self):
        raise AssertionError("the model must not be loaded: the run does not fit")

    monkeypatch.setattr(Model, "load", no_load)


def _spec():
    from attnviz.core.models import describe

    return describe(None)


def _tokens(text=TEXT):
    return _spec().count_tokens(text)


def _needs(tokens, asked=None):
    return estimate(LAYERS, HEADS, _spec().weights_bytes, tokens, asked or Asked()).total


# ---------- the estimate ----------


def test_the_attention_grows_with_the_square_of_the_text_and_the_layers_kept():
    weights = 10**8
    small, large = (estimate(LAYERS, HEADS, weights, n, Asked()) for n in (100, 200))
    assert large.attention == 4 * small.attention > 0
    assert large.total - small.total >= large.attention - small.attention
    one = estimate(LAYERS, HEADS, weights, 200, Asked(layers=[3]))
    assert one.attention * LAYERS == large.attention
    two = estimate(LAYERS, HEADS, weights, 200, Asked(layers=[3, 3, 4]))  # repeats count once
    assert two.attention == 2 * one.attention


def test_more_asked_holds_more():
    base = Asked()
    needs = {
        name: _needs(300, replace(base, **change))
        for name, change in {
            "plain": {},
            "page": {"html": True},
            "alti": {"measure": "alti"},
            "norm": {"measure": "norm"},
            "words": {"transformed": True},
            "ablate": {"ablate": True},
            "images": {"images": True},
            "batch": {"batch": 4},
        }.items()
    }
    assert all(needs[name] > needs["plain"] for name in needs if name != "plain")
    # a per-layer measure keeps one map a layer, not one a head
    rollout = estimate(LAYERS, HEADS, 0, 300, Asked(measure="rollout")).attention
    assert rollout * HEADS == estimate(LAYERS, HEADS, 0, 300, Asked()).attention
    # drawing processes each hold a copy of a layer while they draw it
    assert _needs(300, Asked(images=True, jobs=4)) > _needs(300, Asked(images=True, jobs=2))


@pytest.mark.parametrize(
    "text, size",
    [("2GiB", 2 * 2**30), ("1.5 GB", 1_500_000_000), ("512MiB", 512 * 2**20), ("4096", 4096),
     ("800M", 800_000_000), ("3kib", 3072)],
)  # fmt: skip
def test_sizes_are_read_with_their_units(text, size):
    assert memory.parse_size(text) == size


@pytest.mark.parametrize("text", ["two gigs", "2 GiBs", "-1GiB", "", "1e9"])
def test_a_limit_that_is_not_a_size_is_one_line(text):
    with pytest.raises(InputError, match=f"^{memory.ENV}=.* is not a size: .* e.g. 2GiB$"):
        memory.parse_size(text)


def test_the_budget_is_the_limit_when_given_else_what_the_system_has(monkeypatch):
    monkeypatch.setenv(memory.ENV, "3GiB")
    assert memory.budget() == 3 * 2**30
    monkeypatch.delenv(memory.ENV)
    found = memory.budget()
    assert found is None or found > memory._own_rss() > 0


# ---------- show and export refuse before the weights load, and write nothing ----------


def test_show_over_the_limit_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, unloaded):
    needs = _needs(_tokens(), Asked(images=True, jobs=2))
    result = invoke("show", TEXT, "-o", tmp_path / "out", "-j", "2",
                    limit=str(needs // 2), monkeypatch=monkeypatch)  # fmt: skip
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: this text ({_tokens()} tokens, 6 layers × 12 heads) needs ")
    assert f"{memory.ENV} is " in line and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_the_refusal_names_what_fits(monkeypatch, unloaded):
    """Between what one layer needs and what six need, --layer N fits, and so does a shorter
    text; below what the model itself needs, nothing does."""
    tokens, asked = _tokens(), Asked()
    one = _needs(tokens, replace(asked, layers=[0]))
    every = _needs(tokens, asked)
    limit = (one + every) // 2
    result = invoke("show", TEXT, "--no-images", limit=str(limit), monkeypatch=monkeypatch)
    assert result.exit_code == 2
    line = " ".join(result.output.split())
    found = memory.shown(one)
    assert f"it fits with --layer N ({found}); or a text of at most " in line
    fitting = int(line.rsplit("at most ", 1)[1].split()[0].replace(",", ""))
    assert 0 < fitting < tokens
    assert _needs(fitting, asked) <= limit < _needs(fitting + 1, asked)
    result = invoke("show", TEXT, "--no-images", limit="1MiB", monkeypatch=monkeypatch)
    assert result.exit_code == 2
    assert "nothing fits: the model alone needs about" in result.output


def test_show_with_enough_memory_runs(monkeypatch):
    result = invoke("show", TEXT, "--no-images", "--json", limit="64GiB", monkeypatch=monkeypatch)
    assert result.exit_code == 0, result.output
    assert '"heads"' in result.stdout


def test_export_over_the_limit_is_one_line_exit_2_and_writes_nothing(
    tmp_path, monkeypatch, unloaded
):
    texts = tmp_path / "texts.txt"
    texts.write_text(f"{TEXT}\nIt rained.\n{TEXT} {TEXT}\n")
    out = tmp_path / "out"
    result = invoke("export", "-f", texts, "-o", out, limit="100MiB", monkeypatch=monkeypatch)
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: a batch of 3 texts (") and "--batch-size 1" not in line
    assert not out.exists()


def test_a_bad_limit_is_one_line(monkeypatch):
    result = invoke("show", TEXT, "--no-images", limit="lots", monkeypatch=monkeypatch)
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line == f"error: {memory.ENV}='lots' is not a size: give bytes or a number with a " \
        "unit, e.g. 2GiB"  # fmt: skip


# ---------- the last check, before the attention's array is made ----------


def test_an_array_that_cannot_be_held_is_refused_before_it_is_made(loaded_tiny, monkeypatch):
    """Wherever the early estimate cannot be made (report, compare, the API, a model not on
    this machine yet), the array of the attention is checked before it is allocated."""
    from attnviz.core.extract import attend
    from attnviz.core.tokens import encode

    loaded = loaded_tiny["bert"]
    encoded = [encode(loaded, TEXT)]
    monkeypatch.setenv(memory.ENV, str(memory._own_rss() + 1024))
    with pytest.raises(MemoryLimitError, match=r"^the attention of \d+ layers × \d+ heads over "):
        attend(loaded, encoded)
    monkeypatch.setenv(memory.ENV, "64GiB")
    assert attend(loaded, encoded)[0].weights.shape[-1] == len(encoded[0])


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama", "qwen2"])
def test_a_text_is_counted_from_the_files_as_the_loaded_model_reads_it(arch, tiny_model_dirs,
                                                                      loaded_tiny):  # fmt: skip
    """The count taken before loading (the memory estimate, the early length check) is the
    number of tokens the run reads: a decoder's BOS that attnviz puts first included."""
    from attnviz.core.models import describe
    from attnviz.core.tokens import encode

    spec = describe(str(tiny_model_dirs[arch]))
    assert spec.count_tokens(TEXT) == len(encode(loaded_tiny[arch], TEXT))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim, /proc")
def test_freed_memory_goes_back_to_the_system():
    """After a pass its freed arrays stay in the process's heap (small blocks, with live ones
    among them) until `return_freed_memory`: then the RSS falls by most of them. In a fresh
    process, so that what this one has allocated does not blur it."""
    script = textwrap.dedent(
        """
        import numpy as np
        from attnviz.core import memory

        def rss():
            for line in open("/proc/self/status"):
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) // 1024

        blocks = [np.ones(10_000) for _ in range(3_000)]  # 80 KB each, from the heap: 229 MiB
        kept = blocks[::100]  # live blocks among the freed: the heap's top is not free
        del blocks
        before = rss()
        memory.return_freed_memory()
        print(before, rss(), len(kept))
        """
    )
    found = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    before, after, _ = map(int, found.stdout.split())
    assert before - after > 150, (before, after)  # of the 222 MiB freed
