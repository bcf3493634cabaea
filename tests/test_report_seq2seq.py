"""`attnviz report` on an encoder-decoder model: source<TAB>target lines, roles for the
encoder and decoder self-attention, alignment metrics for cross-attention."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.analysis.alignment import alignment_sums, eos_sums, monotone_sums
from attnviz.cli import app

runner = CliRunner()
PAIRS = [
    ("The cat sat on the mat.", "Die Katze saß auf der Matte."),
    ("A quick brown fox!", "Ein schneller Fuchs!"),
    ("The cat sat.", "Die Katze."),
]


def _one_hot(aligned: list[int], n_keys: int) -> np.ndarray:
    """A (1, 1, T, S) cross-attention where target token t attends only to `aligned[t]`."""
    weights = np.zeros((1, 1, len(aligned), n_keys))
    weights[0, 0, np.arange(len(aligned)), aligned] = 1.0
    return weights


def test_monotone_alignment_scores_one_and_reversed_scores_zero():
    # target: [start] t1 t2 t3 t4; source: s0 s1 s2 s3 </s>
    target_special = np.array([True, False, False, False, False])
    source_special = np.array([False, False, False, False, True])
    forward = _one_hot([4, 0, 1, 2, 3], 5)  # the start token's row rests on </s>: left out
    backward = _one_hot([0, 3, 2, 1, 0], 5)
    staying = _one_hot([4, 2, 2, 2, 2], 5)  # the same source token: "at or after" counts it
    for weights, expected in ((forward, 1.0), (backward, 0.0), (staying, 1.0)):
        hits, compared = monotone_sums(weights, target_special, source_special)
        assert compared == 3 and hits[0, 0] / compared == expected
    # the most-attended *non-special* source token: weight on </s> does not decide it
    resting = _one_hot([4, 0, 1, 2, 3], 5) * 0.4
    resting[0, 0, 1:, 4] += 0.6
    assert monotone_sums(resting, target_special, source_special)[0][0, 0] == 3


def test_source_eos_is_the_mean_weight_on_the_last_special_source_token():
    target_special = np.array([True, False, False])
    source_special = np.array([True, False, False, True])  # <s> a b </s>
    weights = np.zeros((1, 2, 3, 4))
    weights[0, 0, :, 3] = [1.0, 0.5, 0.25]  # head 0: the start token's 1.0 is left out
    weights[0, 1, :, 0] = 1.0  # head 1 rests on <s>, the first special token, not on </s>
    total, count = eos_sums(weights, target_special, source_special)
    assert count == 2 and np.allclose(total[0] / count, [0.375, 0.0])
    assert eos_sums(weights, target_special, np.zeros(4, bool))[1] == 0  # no EOS: no score


def _plain_loop(found: list[dict]) -> dict[str, np.ndarray]:
    """The cross-attention metrics and the encoder's `previous`, by plain loops."""
    cross = found[0]["cross"]
    n_layers, n_heads = cross.weights.shape[:2]
    hits, compared = np.zeros((n_layers, n_heads)), 0
    eos, queried = np.zeros((n_layers, n_heads)), 0
    previous, counted = np.zeros(found[0]["encoder"].weights.shape[:2]), 0
    for stacks in found:
        att = stacks["cross"]
        targets = [t for t in range(len(att.tokens)) if not att.special[t]]
        sources = [s for s in range(len(att.key_tokens)) if not att.key_special[s]]
        last = max(s for s in range(len(att.key_tokens)) if att.key_special[s])
        compared += len(targets) - 1
        queried += len(targets)
        for layer in range(n_layers):
            for head in range(n_heads):
                rows = att.weights[layer, head]
                aligned = [max(sources, key=lambda s: rows[t, s]) for t in targets]
                hits[layer, head] += sum(b >= a for a, b in zip(aligned, aligned[1:]))
                eos[layer, head] += sum(rows[t, last] for t in targets)
        encoder = stacks["encoder"]
        queries = [i for i in range(1, len(encoder.tokens)) if not encoder.special[i]]
        counted += len(queries)
        for i in queries:
            previous += encoder.weights[:, :, i, i - 1]
    return {"monotone": hits / compared, "source_eos": eos / queried,
            "previous": previous / counted}  # fmt: skip


@pytest.mark.parametrize("arch", ["bart", "t5"])
def test_report_numbers_equal_a_plain_loop_over_attend_stacks(loaded_seq2seq, arch):
    from attnviz.core.extract import attend_stacks
    from attnviz.core.inputs import Sentence, Sentences
    from attnviz.core.seq2seq import encode_source_target
    from attnviz.pipelines.report import build_seq2seq_report

    loaded = loaded_seq2seq[arch]
    pairs = Sentences(
        tuple(Sentence(i + 1, i + 1, s, t) for i, (s, t) in enumerate(PAIRS)), 0, "pairs"
    )
    result = build_seq2seq_report(loaded, pairs, batch_size=2)
    found = [
        attend_stacks(loaded, [encode_source_target(loaded, s, t)], ("encoder", "cross"))[0]
        for s, t in PAIRS
    ]
    expected = _plain_loop(found)
    np.testing.assert_allclose(result.cross.means[0], expected["monotone"], atol=1e-9)
    np.testing.assert_allclose(result.cross.means[1], expected["source_eos"], atol=1e-6)
    np.testing.assert_allclose(result.stacks["encoder"].means[0], expected["previous"], atol=1e-6)
    assert result.sentences == 3 and set(result.stacks) == {"encoder", "decoder"}
    assert alignment_sums(found[0]["cross"])[0].shape == (2, *found[0]["cross"].weights.shape[:2])
    # by norm: the same loops over ‖α f(x)‖, each row as shares (norm itself is tested
    # against the model's parameters in test_seq2seq.py)
    from dataclasses import replace

    from attnviz.analysis.contributions import stack_values

    values = stack_values(loaded, "norm")
    normed = []
    for (s, t), stacks in zip(PAIRS, found):
        norm = attend_stacks(loaded, [encode_source_target(loaded, s, t)], ("cross",),
                             values=values)[0]["cross"]  # fmt: skip
        rows = norm.weights / norm.weights.sum(axis=-1, keepdims=True)
        normed.append({**stacks, "cross": replace(stacks["cross"], weights=rows)})
    by_norm = _plain_loop(normed)
    np.testing.assert_allclose(result.cross.norm_means[0], by_norm["monotone"], atol=1e-9)
    np.testing.assert_allclose(result.cross.norm_means[1], by_norm["source_eos"], atol=1e-6)
    row = result.cross.rows()[0]
    assert {"monotone", "source_eos", "monotone_norm", "source_eos_norm"} <= set(row)


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_report_cli_writes_every_stack(seq2seq_dirs, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("\n".join(f"{s}\t{t}" for s, t in PAIRS) + "\n\n", encoding="utf-8")
    out = tmp_path / "report"
    result = runner.invoke(app, ["report", "-m", str(seq2seq_dirs["bart"]), "-f", str(pairs),
                                 "-o", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Cross-attention (target × source)" in result.output and "monotone" in result.output
    with open(out / "heads.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    by_stack = {stack: [r for r in rows if r["stack"] == stack] for stack in STACKS}
    # bart: encoder 2 layers × 4 heads, decoder and cross 3 × 2
    assert [len(by_stack[s]) for s in STACKS] == [8, 6, 6]
    assert by_stack["encoder"][0]["role"] and by_stack["encoder"][0]["monotone"] == ""
    assert by_stack["cross"][0]["role"] == "" and 0 <= float(by_stack["cross"][0]["monotone"]) <= 1
    data = json.loads((out / "heads.json").read_text())
    assert data["sentences"] == 3 and len(data["heads"]) == 20
    markdown = (out / "report.md").read_text()
    for stack in STACKS:
        assert f"## {stack.capitalize()}" in markdown
    for name in ("roles-encoder.png", "roles-decoder.png", "metric-decoder-previous.png",
                 "metric-cross-monotone.png", "metric-cross-source_eos.png"):  # fmt: skip
        assert f"]({name})" in markdown and (out / name).is_file()


STACKS = ("encoder", "decoder", "cross")


@pytest.mark.parametrize(
    "lines, message",
    [
        (["The cat sat.\tDie Katze.", "no tab here"], "line 2: no TAB between two texts"),
        (["a\tb\tc"], "line 1: 2 TABs"),
        (["The cat sat.\t   "], "line 1: no TAB"),  # the line's end is stripped, TAB and all
        (["   \tDie Katze."], "line 1: no TAB"),
        (["The cat sat. \t , "], None),  # a side of punctuation alone is a side
    ],
)
def test_bad_lines_are_refused_before_anything_is_written(seq2seq_dirs, tmp_path, lines, message):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "report"
    result = runner.invoke(
        app, ["report", "-m", str(seq2seq_dirs["t5"]), "-f", str(pairs), "-o", str(out)]
    )
    if message is None:
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output and not out.exists()


def test_empty_side_inside_a_line_and_refused_options(seq2seq_dirs, tmp_path):
    from attnviz.core.inputs import Sentence, Sentences, split_pairs
    from attnviz.errors import InputError

    with pytest.raises(InputError, match="pairs, line 4: the source is empty"):
        split_pairs(Sentences((Sentence(1, 4, " \t cible"),), 0, "pairs"))
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("The cat sat.\tDie Katze.\n", encoding="utf-8")
    for option in (["--layer", "0"], ["--words"], ["--importance", "ablation"]):
        result = runner.invoke(app, ["report", "-m", str(seq2seq_dirs["bart"]), "-f", str(pairs),
                                     "-o", str(tmp_path / "r"), *option])  # fmt: skip
        assert result.exit_code == 2, result.output
        said = f"{option[0]} in attnviz report works with encoders and decoders"
        assert said in result.output and "is an encoder-decoder model" in result.output
        assert not (tmp_path / "r").exists()


def test_too_long_target_is_skipped_and_counted_as_report_skips_sentences(seq2seq_dirs, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    long_target = " ".join(["Katze"] * 80)
    pairs.write_text(f"The cat sat.\tDie Katze.\nThe cat.\t{long_target}\n", encoding="utf-8")
    out = tmp_path / "report"
    result = runner.invoke(app, ["report", "-m", str(seq2seq_dirs["t5"]), "-f", str(pairs),
                                 "-o", str(out), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["sentences"] == 1 and len(data["skipped"]) == 1
    assert "line 2: skipped, target is" in data["skipped"][0]
    assert "Skipped: 1 pair(s)" in (out / "report.md").read_text()
