"""Each command's memory estimate is its peak (issue 61): the estimate a command refuses with
(read from its own one-line refusal under a 1-byte ATTNVIZ_MEMORY_LIMIT, before any model
loads) against the peak resident memory of the same command run for real in a fresh process
(its VmHWM, written as it exits). The peak stays within the estimate + 10 %.

The model: a tiny Llama with 8 heads and a window of 4,096, so that at ~1,500 tokens each
run's maps (144 MiB over its 2 layers) weigh beside the interpreter with torch loaded, which
a model of the suite's usual size does not."""

from __future__ import annotations

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


# The command run in a fresh interpreter that writes its own high-water mark (VmHWM) as it
# exits: wait4's ru_maxrss would not do, as Linux carries the parent's peak (this test
# process's, gigabytes in a whole suite) across the child's exec.
RUN = """
import atexit, sys
def said():
    with open("/proc/self/status") as status:
        found = [line.split()[1] for line in status if line.startswith("VmHWM:")]
    sys.stderr.write(f"\\nVmHWM {found[0]}\\n")
atexit.register(said)
from attnviz.cli import main
sys.argv = ["attnviz", *sys.argv[1:]]
main()
"""


def _peak(args: list[str], cwd) -> int:
    """The peak resident bytes of `attnviz ARGS` run to its end in a fresh process."""
    done = subprocess.run([sys.executable, "-c", RUN, *args], cwd=cwd, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    kib = re.findall(r"^VmHWM (\d+)$", done.stderr, flags=re.MULTILINE)
    assert kib, done.stderr
    return int(kib[-1]) * 1024


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
