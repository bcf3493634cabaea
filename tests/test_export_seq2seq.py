"""`attnviz export` on an encoder-decoder model: source<TAB>target lines, one --stack per
pair, batched and resumable."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app

runner = CliRunner()
PAIRS = [
    ("The cat sat on the mat.", "Die Katze saß auf der Matte."),
    ("A quick brown fox!", "Ein schneller Fuchs!"),
    ("The cat sat.", "Die Katze."),
    ("The cat sat.", "Die Katze saß."),  # the same source with another target: its own folder
    ("A fox!", "Ein Fuchs!"),
]


def _pairs_file(tmp_path, pairs=PAIRS, name="pairs.tsv"):
    path = tmp_path / name
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


def _export(model_dir, pairs, out, *args):
    return runner.invoke(
        app, ["export", "-m", str(model_dir), "-f", str(pairs), "-o", str(out), *map(str, args)]
    )


def _folders(out):
    return sorted(p for p in out.iterdir() if p.is_dir())


@pytest.mark.parametrize("arch", ["bart", "marian"])
def test_batched_export_equals_unbatched_attend_stacks(seq2seq_dirs, loaded_seq2seq, tmp_path,
                                                       arch):  # fmt: skip
    from attnviz.core.extract import attend_stacks
    from attnviz.core.seq2seq import encode_source_target

    loaded = loaded_seq2seq[arch]
    pairs = _pairs_file(tmp_path)
    for stack in ("cross", "encoder", "decoder"):
        out = tmp_path / stack
        figures = ("--figures", "overview")
        result = _export(seq2seq_dirs[arch], pairs, out, "--stack", stack, "--save-raw",
                         "--batch-size", 3, *figures)  # fmt: skip
        assert result.exit_code == 0, result.output
        folders = _folders(out)
        assert len(folders) == len(PAIRS)
        for folder, (source, target) in zip(folders, PAIRS):
            item = encode_source_target(loaded, source, target)
            alone = attend_stacks(loaded, [item], (stack,))[0][stack]
            raw = np.load(folder / "attention.npz")
            assert raw["attention"].shape == alone.weights.shape
            np.testing.assert_allclose(raw["attention"], alone.weights, atol=1e-6)
            assert str(raw["stack"]) == stack
            assert tuple(raw["source_tokens"]) == item.source.tokens
            assert tuple(raw["target_tokens"]) == item.target.tokens
            assert tuple(raw["tokens"]) == alone.tokens
            assert tuple(raw["key_tokens"]) == alone.key_tokens
            images = sorted(p.name for p in folder.glob("*.png"))
            assert images == ["overview.png"]
    with open(tmp_path / "cross" / "manifest.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["text"], r["target"]) for r in rows] == PAIRS
    manifest = json.loads((tmp_path / "cross" / "manifest.json").read_text())
    first = manifest["sentences"][0]
    assert first["target"] == PAIRS[0][1] and first["key_tokens"][-1] in ("</s>", "[SEP]")


def test_rerun_skips_complete_pairs_and_another_stack_redoes_them(seq2seq_dirs, tmp_path):
    pairs, out = _pairs_file(tmp_path, PAIRS[:2]), tmp_path / "out"
    first = _export(seq2seq_dirs["t5"], pairs, out, "--save-raw")
    assert first.exit_code == 0, first.output
    again = _export(seq2seq_dirs["t5"], pairs, out, "--save-raw")
    assert "nothing to do: 2 sentences already complete" in " ".join(again.output.split())
    other = _export(seq2seq_dirs["t5"], pairs, out, "--save-raw", "--stack", "encoder",
                    "--figures", "overview")  # fmt: skip
    assert other.exit_code == 0 and "2 written" in " ".join(other.output.split())
    # more pairs at the end resume the export of the first ones
    longer = _pairs_file(tmp_path, PAIRS[:3], "longer.tsv")
    more = _export(seq2seq_dirs["t5"], longer, out, "--save-raw", "--stack", "encoder",
                   "--figures", "overview")  # fmt: skip
    assert "1 written · 2 already complete" in " ".join(more.output.split())


def test_too_long_target_is_skipped_and_counted(seq2seq_dirs, tmp_path):
    long_target = " ".join(["Katze"] * 80)
    pairs = _pairs_file(tmp_path, [PAIRS[0], ("The cat.", long_target)])
    result = _export(seq2seq_dirs["t5"], pairs, tmp_path / "out", "--save-raw", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["written"] == 1 and summary["too_long"] == 1


@pytest.mark.parametrize(
    "lines, args, message",
    [
        (["The cat sat.\tDie Katze.", "no tab"], ["--save-raw"], "line 2: no TAB between two"),
        (["The cat sat.\tDie Katze."], ["--save-raw", "--measure", "alti"],
         "--measure alti in attnviz export works with encoders and decoders"),
        (["The cat sat.\tDie Katze."], ["--html", "--save-raw"],
         "--html in attnviz export works with encoders and decoders"),
        (["The cat sat.\tDie Katze."], ["--stack", "encoder", "--layer", "2"],
         "layer 2 out of range: this model has layers 0–1"),
        (["The cat sat.\tDie Katze."], ["--stack", "decoder", "--head", "3"],
         "head 3 out of range: this model has heads 0–1"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_before_anything_is_written(seq2seq_dirs, tmp_path, lines, args,
                                                         message):  # fmt: skip
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    result = _export(seq2seq_dirs["bart"], pairs, out, *args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output and not out.exists()


def test_stack_on_a_one_stack_model_is_refused(tiny_model_dirs, tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["export", "A cat.", "-m", str(tiny_model_dirs["bert"]), "-o", str(out), "--stack",
              "cross"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--stack cross in attnviz export works with encoder-decoder models" in result.output
    assert not out.exists()


def test_export_norm_of_cross_attention_equals_attend_stacks(seq2seq_dirs, loaded_seq2seq,
                                                             tmp_path):  # fmt: skip
    from attnviz.analysis.contributions import stack_values
    from attnviz.core.extract import attend_stacks
    from attnviz.core.seq2seq import encode_source_target

    loaded = loaded_seq2seq["t5"]
    out = tmp_path / "norm"
    result = _export(seq2seq_dirs["t5"], _pairs_file(tmp_path), out, "--measure", "norm",
                     "--save-raw", "--batch-size", 2, "--figures", "overview")  # fmt: skip
    assert result.exit_code == 0, result.output
    values = stack_values(loaded, "norm")
    for folder, (source, target) in zip(_folders(out), PAIRS):
        item = encode_source_target(loaded, source, target)
        alone = attend_stacks(loaded, [item], ("cross",), values=values)[0]["cross"]
        raw = np.load(folder / "attention.npz")
        assert str(raw["measure"]) == "norm" and str(raw["stack"]) == "cross"
        np.testing.assert_allclose(raw["norm"], alone.weights, rtol=1e-5, atol=1e-6)  # float32
