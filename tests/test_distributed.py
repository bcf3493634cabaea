"""`report` split over processes: ranks of a launched run (torch.distributed, gloo on
127.0.0.1: each rank a real `python -m attnviz report` with the environment torchrun gives
it), and shards merged by `attnviz merge`, give the files of one process's report, byte for
byte (heads.json apart from `texts_per_rank`); what cannot make a whole report is refused in
one line; a rank killed mid-run leaves no report, and --resume finishes it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnviz.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
CORPUS = [line for line in (ROOT / "attnviz/data/sentences.txt").read_text().splitlines() if line]
LIMIT = 120  # seconds a launched rank may take before the test gives up on it

# A treebank with syntax and coreference in the same sentences, and one sentence longer than
# the tiny models take (skipped, and noted).
_SENTENCE = [("Mary", 2, "nsubj", "(e1-person-1)"), ("thanked", 0, "root", ""),
             ("John", 2, "obj", "(e2-person-1)"), ("because", 7, "mark", ""),
             ("he", 7, "nsubj", "(e2-person-1)"), ("had", 7, "aux", ""),
             ("helped", 2, "advcl", ""), ("her", 7, "obj", "(e1-person-1)"),
             (".", 2, "punct", "")]  # fmt: skip
NAMES = [("Mary", "John"), ("Ann", "Tom"), ("Sue", "Bob"), ("Eve", "Sam"), ("Kim", "Joe"),
         ("Amy", "Ben"), ("Liz", "Dan")]  # fmt: skip


def _treebank(path: Path) -> Path:
    lines = ["# global.Entity = eid-etype-head-other"]
    for k, (first, second) in enumerate(NAMES):
        words = [(second if w == "John" else first if w == "Mary" else w, h, r, e)
                 for w, h, r, e in _SENTENCE]  # fmt: skip
        lines += [f"# sent_id = s{k}", f"# text = {' '.join(w for w, *_ in words)}"]
        for i, (word, head, rel, entity) in enumerate(words, start=1):
            misc = f"Entity={entity.replace('e1', f'e{2 * k + 1}').replace('e2', f'e{2 * k + 2}')}"
            lines.append(f"{i}\t{word}\t_\t_\t_\t_\t{head}\t{rel}\t_\t{misc if entity else '_'}")
        lines.append("")
    long = ["word"] * 70  # past the tiny models' 64 tokens
    lines += ["# sent_id = long", f"# text = {' '.join(long)}"]
    lines += [f"{i}\tword\t_\t_\t_\t_\t{0 if i == 1 else 1}\t{'root' if i == 1 else 'dep'}\t_\t_"
              for i in range(1, len(long) + 1)]  # fmt: skip
    path.write_text("\n".join(lines) + "\n\n")
    return path


def _port() -> int:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


def _rank_env(rank: int, size: int, port: int, **more: str) -> dict[str, str]:
    """What torchrun gives each rank; the threads of this process, whose single run is the
    reference (a float32 kernel may split its sums by thread)."""
    import torch

    return {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": str(torch.get_num_threads()), **more}  # fmt: skip


@contextmanager
def _ranks(args: list[str], size: int, cwd: Path, **more: str):
    """`size` ranks of `attnviz report ARGS`, each killed (by its pid) if still running after."""
    port = int(more.pop("MASTER_PORT", _port()))
    command = [sys.executable, "-m", "attnviz", "report", *args]
    started = [
        subprocess.Popen(command, cwd=cwd, env=_rank_env(r, size, port, **more),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(size)
    ]  # fmt: skip
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
            process.communicate()


def _finish(started) -> list[tuple[int, str, str]]:
    """Each rank's exit code, stdout and stderr, once it has ended."""
    found = [process.communicate(timeout=LIMIT) for process in started]
    return [(process.returncode, *said) for process, said in zip(started, found)]


def _single(args: list[str], out: Path) -> None:
    result = runner.invoke(app, ["report", *args, "-o", str(out)])
    assert result.exit_code == 0, result.output


def _assert_same_files(one: Path, other: Path, texts_per_rank: list[int] | None = None) -> None:
    """Every table and text of the report the same, byte for byte; heads.json the same
    document but for `texts_per_rank`."""
    names = sorted(p.name for p in one.iterdir() if p.suffix in (".csv", ".md", ".json"))
    assert names == sorted(p.name for p in other.iterdir() if p.suffix in (".csv", ".md", ".json"))
    for name in names:
        if name == "heads.json":
            a, b = (json.loads((folder / name).read_text()) for folder in (one, other))
            assert a.pop("texts_per_rank") == [a["sentences"]]
            found = b.pop("texts_per_rank")
            assert sum(found) == b["sentences"] and found == (texts_per_rank or found)
            assert a == b
        elif name != "done.json":
            assert (one / name).read_bytes() == (other / name).read_bytes(), name


@pytest.mark.slow  # three processes: two ranks, and torch imported in each
def test_two_ranks_on_the_bundled_model_write_the_single_run_files(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS[:7]) + "\n")
    args = ["-f", str(corpus), "-b", "2"]  # 4 batches: 2 to each rank
    _single(args, tmp_path / "one")
    with _ranks([*args, "-o", "two"], 2, tmp_path) as started:
        (code0, out0, err0), (code1, out1, err1) = _finish(started)
    assert code0 == 0 and code1 == 0, err0 + err1
    assert "wrote 20 files to two/" in " ".join(out0.split())
    assert out1 == "" and err1 == ""  # rank 1 says nothing
    _assert_same_files(tmp_path / "one", tmp_path / "two")
    assert len(json.loads((tmp_path / "two/heads.json").read_text())["texts_per_rank"]) == 2
    assert not (tmp_path / "two/.partials").exists()  # the ranks' sums, removed once written


@pytest.mark.slow  # three processes: two ranks, and torch imported in each
def test_two_ranks_of_a_tiny_decoder_with_treebank_and_importance(tiny_model_dirs, tmp_path):
    """Syntax, coreference, both importance methods and mean ablation (whose means every rank
    needs before it ablates) across two ranks; --json is one document, from rank 0."""
    args = ["--treebank", str(_treebank(tmp_path / "tb.conllu")), "-m",
            str(tiny_model_dirs["llama"]), "-b", "2", "--min-count", "1",
            "--importance", "both", "--ablation", "mean"]  # fmt: skip
    _single(args, tmp_path / "one")
    with _ranks([*args, "-o", "two", "--json"], 2, tmp_path) as started:
        (code0, out0, err0), (code1, out1, err1) = _finish(started)
    assert code0 == 0 and code1 == 0, err0 + err1
    texts = json.loads(out0)["texts_per_rank"]
    assert len(texts) == 2 and all(texts) and out1 == ""
    assert "skipped" in err0 and err1 == ""  # the long sentence, noted once
    _assert_same_files(tmp_path / "one", tmp_path / "two", texts)
    found = json.loads((tmp_path / "two/heads.json").read_text())
    assert found["treebank"]["coreference"]["mentions"] == 2 * len(NAMES)  # he, her
    assert set(found["importance"]) == {"importance", "importance_gradient", "spearman"}


@pytest.mark.slow  # end-to-end model and figure work, four times
def test_three_shards_merged_equal_one_run(tiny_model_dirs, tmp_path):
    args = ["--treebank", str(_treebank(tmp_path / "tb.conllu")), "-m",
            str(tiny_model_dirs["bert"]), "-b", "2", "--min-count", "1",
            "--importance", "ablation"]  # fmt: skip
    _single(args, tmp_path / "one")
    for index in range(3):
        result = runner.invoke(app, ["report", *args, "--shard", f"{index}/3", "--partial",
                                     str(tmp_path / f"p{index % 2}")])  # fmt: skip
        assert result.exit_code == 0, result.output
        assert f"wrote shard {index} of 3" in " ".join(result.output.split())
    merged = runner.invoke(app, ["merge", str(tmp_path / "p0"), str(tmp_path / "p1"), "-o",
                                 str(tmp_path / "merged")])  # fmt: skip
    assert merged.exit_code == 0, merged.output
    _assert_same_files(tmp_path / "one", tmp_path / "merged")
    texts = json.loads((tmp_path / "merged/heads.json").read_text())["texts_per_rank"]
    assert len(texts) == 3 and all(texts)


def _one_line_refusal(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) <= 3


def test_what_does_not_make_one_report_is_refused(tiny_model_dirs, tmp_path, monkeypatch):
    bert, gpt2 = str(tiny_model_dirs["bert"]), str(tiny_model_dirs["gpt2"])
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS[:4]) + "\n")
    other = tmp_path / "other.txt"
    other.write_text("\n".join(CORPUS[4:8]) + "\n")

    def shard(index: int, folder: str, *more: str) -> None:
        args = ["report", "-f", str(corpus), "-m", bert, "-b", "1", "--shard", f"{index}/3",
                "--partial", str(tmp_path / folder), *more]  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output

    for index in range(3):
        shard(index, "run")
    shard(2, "gpt2", "-m", gpt2)  # -m given twice: the last wins
    shard(2, "batch", "-b", "2")
    runner.invoke(app, ["report", "-f", str(other), "-m", bert, "-b", "1", "--shard", "2/3",
                        "--partial", str(tmp_path / "corpus")])  # fmt: skip
    shutil.copytree(tmp_path / "run", tmp_path / "again")
    (tmp_path / "run-0-1").mkdir()
    for index in range(2):
        name = f"report-shard-{index}-of-3.npz"
        shutil.copy(tmp_path / "run" / name, tmp_path / "run-0-1" / name)

    def merge(*folders: str) -> list[str]:
        return ["merge", *(str(tmp_path / f) for f in folders), "-o", str(tmp_path / "out")]

    _one_line_refusal(merge("run-0-1"), "shard(s) 2 of 3 missing")
    _one_line_refusal(merge("run", "again"), "shard 0 of 3 is given twice")
    _one_line_refusal(merge("run-0-1", "gpt2"), "is of another model")
    _one_line_refusal(merge("run-0-1", "batch"), "another option set (--batch-size 2, not 1)")
    _one_line_refusal(merge("run-0-1", "corpus"), "is of another corpus")
    _one_line_refusal(merge("nowhere"), "no such folder")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    _one_line_refusal(
        ["report", "-f", str(corpus), "-m", bert, "--shard", "0/2", "--partial",
         str(tmp_path / "m"), "--importance", "ablation", "--ablation", "mean"],
        "give either --shard or --ablation mean, not both: each shard needs every other",
    )  # fmt: skip
    _one_line_refusal(["report", "-f", str(corpus), "-m", bert, "--shard", "3/3", "--partial",
                       str(tmp_path / "m")], "give I/N with 0 ≤ I < N")  # fmt: skip
    _one_line_refusal(["report", "-f", str(corpus), "-m", bert, "--shard", "0/3"],
                      "--shard needs --partial DIR")  # fmt: skip
    _one_line_refusal(["report", "-f", str(corpus), "-m", bert, "--resume"],
                      "--partial/--resume needs --shard or a launched run")  # fmt: skip
    monkeypatch.setenv("RANK", "0")  # as a launcher sets them: no rendezvous is reached
    monkeypatch.setenv("WORLD_SIZE", "2")
    _one_line_refusal(["report", "-f", str(corpus), "-m", bert, "--shard", "0/2", "--partial",
                       str(tmp_path / "m")], "each rank takes its share already")  # fmt: skip


@contextmanager
def _agent():
    """A store on a free port, held by this test as torchrun's agent holds it for its ranks:
    the environment that tells them so, and the store as the ranks see it."""
    import torch.distributed as dist

    port = _port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
           "MASTER_PORT": str(port)}  # fmt: skip
    yield env, store


@pytest.mark.slow  # five processes: ranks killed, and run again
def test_a_killed_rank_leaves_no_report_and_resume_finishes_it(tiny_model_dirs, tmp_path):
    """Rank 1 is stopped once it has done a batch, and killed once rank 0 has finished its
    share: rank 0 says in one line that rank 1 stopped, and writes nothing; the same command
    with --resume runs rank 1's share alone (rank 0's sums are kept) and writes the report of
    one process."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS[:24]) + "\n")
    args = ["-f", str(corpus), "-m", str(tiny_model_dirs["bert"]), "-b", "1"]
    partials = tmp_path / "out/.partials"
    with _agent() as (env, store), _ranks([*args, "-o", "out"], 2, tmp_path, **env) as started:
        rank0, rank1 = started
        deadline = time.monotonic() + LIMIT
        while not store.add("attnviz/0/progress/1", 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(rank1.pid, signal.SIGSTOP)
        while not (partials / "report-shard-0-of-2.npz").exists():
            assert rank0.poll() is None and time.monotonic() < deadline, rank0.communicate()
            time.sleep(0.05)
        assert not (partials / "report-shard-1-of-2.npz").exists()  # stopped mid-share
        os.kill(rank1.pid, signal.SIGKILL)
        out0, err0 = rank0.communicate(timeout=LIMIT)
    assert rank0.returncode == 1 and out0 == ""
    assert err0.count("\n") == 1 and "rank 1 of 2 stopped before it sent its sums" in err0
    assert "run the same command with --resume" in err0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".partials"]  # no report

    resumed = [*args, "-o", "out", "--resume"]
    with _agent() as (env, _), _ranks(resumed, 2, tmp_path, **env) as started:
        (code0, _, err0), (code1, _, err1) = _finish(started)
    assert code0 == 0 and code1 == 0, err0 + err1
    _single(args, tmp_path / "one")
    _assert_same_files(tmp_path / "one", tmp_path / "out")
    assert not partials.exists()


@pytest.mark.slow  # two processes, and torch imported in each
def test_a_rank_that_fails_is_named_with_its_reason_by_rank_0(tiny_model_dirs, tmp_path):
    """Only rank 1 has a partial of another run to resume from: it stops, and rank 0 says
    which rank stopped and why, in one line; rank 1 says nothing."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS[:4]) + "\n")
    args = ["-f", str(corpus), "-m", str(tiny_model_dirs["bert"])]
    stale = runner.invoke(app, ["report", *args, "-b", "2", "--shard", "1/2", "--partial",
                                str(tmp_path / "out/.partials")])  # fmt: skip
    assert stale.exit_code == 0, stale.output
    with _ranks([*args, "-b", "1", "-o", "out", "--resume"], 2, tmp_path) as started:
        (code0, out0, err0), (code1, out1, err1) = _finish(started)
    assert code0 == 1 and code1 == 2 and out0 == out1 == err1 == ""
    assert err0.count("\n") == 1, err0
    assert "rank 1 of 2 stopped: --resume:" in err0 and "(--batch-size 2, not 1)" in err0
    assert not (tmp_path / "out/heads.csv").exists()


def test_an_encoder_decoder_model_runs_in_one_process(seq2seq_dirs, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("The cat sat.\tDie Katze saß.\n")
    _one_line_refusal(["report", "-f", str(pairs), "-m", str(seq2seq_dirs["t5"]), "--shard",
                       "0/2", "--partial", str(tmp_path / "p")],
                      "--shard in attnviz report works with encoders and decoders")  # fmt: skip
    assert not (tmp_path / "p").exists()
