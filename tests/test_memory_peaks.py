"""Each command's memory estimate is its peak (issue 61): the estimate a command refuses with
(read from its own one-line refusal under a 1-byte ATTNVIZ_MEMORY_LIMIT, before any model
loads) against the peak resident memory of the same command run for real in a fresh process
(its VmHWM, written as it exits). The peak stays within the estimate + 10 %.

The model: a tiny Llama with 8 heads and a window of 4,096, so that at ~1,500 tokens each
run's maps (144 MiB over its 2 layers) weigh beside the interpreter with torch loaded, which
a model of the suite's usual size does not."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.core import memory

pytestmark = pytest.mark.slow  # a fresh process a command, each running at ~1,500 tokens

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


# Each command runs in a fresh process forked from a server that has imported what every
# command imports (torch, transformers, attnviz's CLI: 5 s of a process's start, paid once).
# The child sets its high-water mark (VmHWM) back to what it holds as it starts, and writes
# the mark as it exits, after every clean-up the command registered. wait4's ru_maxrss would
# not do, as Linux carries the parent's peak (this test process's, gigabytes in a whole
# suite) across the child's exec.
#
# A forked child holds less than a process that imported the same modules itself: the
# libraries' pages the imports touched (75 MiB here) are mapped in the server, and in the
# child only once it touches them again. The child adds what the server held beyond its own
# start to its peak: more than a process of its own would reach (by the pages the command
# touches again, 20 MiB here, so the test is the stricter), never less.
SERVER = """
import atexit, json, os, sys, threading
start = []
def vm(name, pid="self"):
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(name + ":"))
def said():
    if start:
        sys.stderr.write(f"\\nVmHWM {vm('VmHWM') + start[0]}\\n")
atexit.register(said)  # first, so that it runs last
import torch, transformers
from attnviz.cli import main
for line in sys.stdin:
    args, cwd = json.loads(line)
    assert threading.active_count() == 1  # a fork copies only the thread that forks
    held = vm("VmRSS")
    child = os.fork()
    if child == 0:
        os.chdir(cwd)
        for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
            os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # the peak from here on: this command's, not the server's
        start.append(held - vm("VmRSS"))
        sys.argv = ["attnviz", *args]
        main()
        sys.exit(0)
    _, status = os.waitpid(child, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The process the commands are forked from (its own errors go to server.txt)."""
    log = tmp_path_factory.mktemp("server") / "server.txt"
    with open(log, "w") as errors:
        process = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=errors, text=True)  # fmt: skip
    yield process, log
    process.stdin.close()
    process.wait(timeout=60)


def _peak(args: list[str], cwd, server) -> int:
    """The peak resident bytes of `attnviz ARGS` run to its end in a fresh process."""
    process, log = server
    process.stdin.write(json.dumps([args, str(cwd)]) + "\n")
    process.stdin.flush()
    code = process.stdout.readline()
    assert code, log.read_text()  # the server itself stopped
    err = (cwd / "stderr.txt").read_text()
    assert int(code) == 0, err
    kib = re.findall(r"^VmHWM (\d+)$", err, flags=re.MULTILINE)
    assert kib, err
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
def test_the_peak_is_within_the_estimate(command, wide_llama, server, tmp_path, monkeypatch):
    folder, text = wide_llama
    args = [part.format(text=text) for part in command] + ["-m", folder, "--device", "cpu"]
    monkeypatch.chdir(tmp_path)
    needs = _estimate(args, monkeypatch)
    peak = _peak(args, tmp_path, server)
    assert peak <= 1.1 * needs, f"peak {memory.shown(peak)}, estimate {memory.shown(needs)}"
