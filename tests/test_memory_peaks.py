"""Each command's memory estimate is its peak (issue 61): the estimate a command refuses with
(read from its own one-line refusal under a 1-byte ATTNVIZ_MEMORY_LIMIT, before any model
loads) against the peak resident memory of the same command run for real in a fresh process
(`wait4`'s ru_maxrss). The peak stays within the estimate + 10 %.

The model: a tiny Llama with 8 heads and a window of 4,096, so that at ~1,500 tokens each
run's maps (144 MiB over its 2 layers) weigh beside the interpreter with torch loaded, which
a model of the suite's usual size does not."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.core import memory

pytestmark = pytest.mark.slow  # a fresh process a command, each loading torch

WORDS = "the cat sat on the mat because it was tired and the dog ran to the door "


@pytest.fixture(scope="module")
def wide_llama(tiny_model_dirs, tmp_path_factory):
    """A 2-layer, 8-head Llama of hidden size 64 and 4,096 positions, with the tiny llama's
    tokenizer; and a text of about 1,500 of its tokens."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("wide") / "llama"
    shutil.copytree(tiny_model_dirs["llama"], folder)
    tokenizer = tf.AutoTokenizer.from_pretrained(folder)
    config = tf.LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2,
                            num_attention_heads=8, num_key_value_heads=8, intermediate_size=64,
                            max_position_embeddings=4096)  # fmt: skip
    tf.LlamaModel(config).save_pretrained(folder)
    tokenizer.model_max_length = 4096
    tokenizer.save_pretrained(folder)
    text = WORDS * (1500 // len(tokenizer(WORDS)["input_ids"]))
    return str(folder), text


def _estimate(args: list[str], monkeypatch) -> int:
    """The bytes the command says it needs, refused under a limit of 1 byte."""
    monkeypatch.setenv(memory.ENV, "1")
    done = CliRunner().invoke(app, args)
    monkeypatch.delenv(memory.ENV)
    assert done.exit_code == 2, done.output
    found = re.search(r"needs (?:about )?([\d,.]+) (GiB|MiB)", done.output)
    assert found, done.output
    return int(float(found.group(1).replace(",", "")) * {"GiB": memory.GiB, "MiB": memory.MiB}[
        found.group(2)])  # fmt: skip


def _peak(args: list[str], cwd) -> int:
    """The peak resident bytes of `attnviz ARGS` run to its end in a fresh process."""
    exe = shutil.which("attnviz", path=os.path.dirname(sys.executable))
    process = subprocess.Popen([exe, *args], cwd=cwd, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)  # fmt: skip
    _, status, usage = os.wait4(process.pid, 0)
    err = process.stderr.read().decode()
    process.stderr.close()
    assert os.waitstatus_to_exitcode(status) == 0, err
    return usage.ru_maxrss * 1024


@pytest.mark.parametrize(
    "command",
    [
        ["show", "{text}", "--no-images"],
        ["export", "{text}", "--out", "exported"],
        ["report", "{text}", "--out", "report"],
        ["check", "{text}"],
        ["compare", "{text}", "{text} again", "--no-images"],
    ],
    ids=["show", "export", "report", "check", "compare"],
)
def test_the_peak_is_within_the_estimate(command, wide_llama, tmp_path, monkeypatch):
    folder, text = wide_llama
    args = [part.format(text=text) for part in command] + ["-m", folder, "--device", "cpu"]
    monkeypatch.chdir(tmp_path)
    needs = _estimate(args, monkeypatch)
    peak = _peak(args, tmp_path)
    assert peak <= 1.1 * needs, f"peak {memory.shown(peak)}, estimate {memory.shown(needs)}"
