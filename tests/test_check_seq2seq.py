"""`check` on encoder-decoder models: the from-scratch attention reproduces every layer of
the encoder, the decoder and cross-attention of tiny T5, BART, mBART and Marian models, and
the check fails when a step (T5's relative position bias, its buckets, its unscaled scores,
cross-attention's source) is left out."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace

import pytest
import torch
from rich.console import Console
from seq2seq_models import SEQ2SEQ
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.core import families, layer_map, mha
from attnviz.core.seq2seq import encode_source_target
from attnviz.outputs import terminal
from attnviz.pipelines.check import check, check_layers, check_stacks
from tests.inside_steps import inside_of

runner = CliRunner()
STACKS = ("encoder", "decoder", "cross")
SOURCE, TARGET = "The cat sat on the mat.", "Die Katze saß auf der Matte."
# Longer than T5's max_distance (20 in the tiny model): the far, shared buckets are used.
LONG_SOURCE = " ".join(["The quick brown fox sat on the mat."] * 4)


def _pairs(loaded):
    """Three sources and targets of different lengths: both sides padded in a batch."""
    return [
        encode_source_target(loaded, SOURCE, TARGET),
        encode_source_target(loaded, "A fox!", "Ein Fuchs!"),
        encode_source_target(loaded, LONG_SOURCE, "Der schnelle braune Fuchs saß auf der Matte."),
    ]


def _every_layer(loaded) -> dict[str, list[int]]:
    return {stack: list(range(layer_map.n_layers(loaded.model, stack))) for stack in STACKS}


def _errors(found) -> dict[str, float]:
    """The largest error of each stack, over heads and block outputs."""
    return {
        stack: max(max(*lc.head_errors, lc.output_error) for lc in checks)
        for stack, checks in found.items()
    }


@pytest.mark.parametrize("arch", SEQ2SEQ)
def test_every_layer_of_every_stack_matches_on_a_padded_batch(loaded_seq2seq, arch):
    loaded = loaded_seq2seq[arch]
    batch = _pairs(loaded)
    found, shapes = check_stacks(loaded, batch, _every_layer(loaded))
    assert [len(found[stack]) for stack in STACKS] == [2, 3, 3]  # encoder 2, decoder 3 layers
    assert max(_errors(found).values()) <= 1e-5, _errors(found)
    assert all(lc.stack == stack for stack in STACKS for lc in found[stack])
    n_source = max(len(item.source) for item in batch)
    n_target = max(len(item.target) for item in batch)
    steps = {stack: {name: shape for name, _, shape in shapes[stack]} for stack in STACKS}
    assert steps["encoder"]["scores"] == (3, n_source, n_source)
    assert steps["decoder"]["scores"] == (3, n_target, n_target)
    assert steps["cross"]["scores"] == (3, n_target, n_source)  # target queries, source keys
    assert steps["cross"]["source"] == (3, n_source, 32)
    assert ("B_h" in steps["encoder"]) == arch.endswith("t5") and "B_h" not in steps["cross"]
    # each text alone gives what it gave in the batch
    alone, _ = check_stacks(loaded, batch[1:2], _every_layer(loaded))
    assert max(_errors(alone).values()) <= 1e-5


def test_t5_bias_is_the_models_own_and_its_buckets_follow_the_formula(loaded_seq2seq):
    from transformers.models.t5.modeling_t5 import T5Attention

    model = loaded_seq2seq["t5"].model
    for stack, first in (("encoder", model.encoder), ("decoder", model.decoder)):
        relative = families.layer_weights(model, 2 if stack == "decoder" else 1, stack).relative
        assert relative.bidirectional == (stack == "encoder")
        own = first.block[0].layer[0].SelfAttention.compute_bias(30, 30)[0]  # (H, T, T)
        torch.testing.assert_close(mha.relative_bias(relative, 30, 30), own, atol=0, rtol=0)
    assert families.layer_weights(model, 0, "cross").relative is None
    # against transformers' own bucket function, over T5's real sizes and the tiny one's
    distance = torch.arange(-300, 301)[None, :]
    for bidirectional in (True, False):
        for n_buckets, max_distance in ((32, 128), (8, 20), (64, 256)):
            ours = mha.relative_bucket(distance, bidirectional, n_buckets, max_distance)
            theirs = T5Attention._relative_position_bucket(
                distance, bidirectional, n_buckets, max_distance
            )
            assert torch.equal(ours, theirs), (bidirectional, n_buckets, max_distance)
    # by hand, T5's sizes: near distances exact, later keys in the upper half, far ones shared
    pick = torch.tensor([0, -1, 1, -7, 8, -200, 200])
    assert mha.relative_bucket(pick, True, 32, 128).tolist() == [0, 1, 17, 7, 24, 15, 31]
    assert mha.relative_bucket(pick, False, 32, 128).tolist() == [0, 1, 0, 7, 0, 31, 0]


def _break(monkeypatch, change):
    """Make every layer's weights go through `change(weights, stack)`."""
    real = families.layer_weights

    def changed(model, layer, stack=None):
        return change(real(model, layer, stack), stack)

    monkeypatch.setattr(families, "layer_weights", changed)


@pytest.mark.parametrize(
    "arch, change, failing",
    [
        ("t5", lambda w, _: replace(w, relative=None), {"encoder", "decoder"}),
        ("t5", lambda w, _: replace(w, scale=None), {"encoder", "decoder", "cross"}),
        ("bart", lambda w, _: replace(w, scale=1.0), {"encoder", "decoder", "cross"}),
        ("marian", lambda w, s: replace(w, w_k=w.w_k * 1.3) if s == "cross" else w, {"cross"}),
    ],
    ids=["t5-without-bias", "t5-scaled", "bart-unscaled", "marian-cross-keys"],
)
def test_the_check_fails_when_a_step_is_wrong(loaded_seq2seq, monkeypatch, arch, change, failing):
    loaded = loaded_seq2seq[arch]
    _break(monkeypatch, change)
    errors = _errors(check_stacks(loaded, _pairs(loaded), _every_layer(loaded))[0])
    assert {stack for stack, error in errors.items() if error > 1e-3} == failing, errors
    assert all(errors[stack] <= 1e-5 for stack in set(STACKS) - failing), errors


def test_wrong_buckets_fail_the_decoder(loaded_seq2seq, monkeypatch):
    """T5's decoder buckets look back only; bucketing it both ways (the encoder's rule)
    moves its bias, and the check sees it."""
    loaded = loaded_seq2seq["t5"]
    real = mha.relative_bucket
    monkeypatch.setattr(mha, "relative_bucket", lambda d, _, n, m: real(d, True, n, m))
    errors = _errors(check_stacks(loaded, _pairs(loaded), _every_layer(loaded))[0])
    assert errors["decoder"] > 1e-3 and errors["encoder"] <= 1e-5, errors


def test_cross_attention_reads_the_source_not_x(loaded_seq2seq, monkeypatch):
    """Keys and values made of the decoder's X instead of the encoder's last states (on a
    source and target of one length, so that the shapes still fit) fail the check."""
    loaded = loaded_seq2seq["bart"]
    item = encode_source_target(loaded, SOURCE, TARGET)
    assert len(item.source) == len(item.target)
    real = mha.multi_head_attention
    monkeypatch.setattr(
        mha, "multi_head_attention", lambda x, w, mask, causal, source: real(x, w, mask, causal)
    )
    errors = _errors(check_stacks(loaded, [item], _every_layer(loaded))[0])
    assert errors["cross"] > 1e-3 and errors["encoder"] <= 1e-5, errors


def test_one_stack_models_check_as_before(bundled):
    from attnviz.core.tokens import encode

    checks, shapes = check_layers(bundled, [encode(bundled, SOURCE)], [0])
    assert checks[0].stack is None and max(checks[0].head_errors) <= 1e-5
    assert [name for name, _, _ in shapes][:3] == ["X", "W_Q^h", "Q_h"]


def test_the_api_checks_each_stack_and_names_it(seq2seq_dirs):
    result = check(_asked(seq2seq_dirs, "t5", stacks=("decoder", "cross")))
    assert result.passed and [part.stack for part in result.stacks] == ["decoder", "cross"]
    decoder, cross = result.stacks
    assert decoder.info.causal and not cross.info.causal
    assert cross.key_tokens == result.tokens and cross.tokens == result.target_tokens
    assert [(lc.stack, lc.layer) for lc in result.layers] == [
        *(("decoder", layer) for layer in range(3)),
        *(("cross", layer) for layer in range(3)),
    ]


def _asked(dirs, arch, **fields):
    from attnviz.core.settings import Load
    from attnviz.pipelines.request import CheckRequest

    return CheckRequest(Load(str(dirs[arch]), "cpu"), text=SOURCE, target=TARGET, **fields)


def test_cli_checks_every_stack_by_default(seq2seq_dirs):
    result = runner.invoke(app, ["check", SOURCE, "-m", str(seq2seq_dirs["t5"]), "--target",
                                 TARGET])  # fmt: skip
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for title in ("Encoder self-attention (source × source)", "Cross-attention (target"):
        assert title in text
    assert "Q_h K_hᵀ + B_h + mask" in text and "table[bucket(j − i), h]" in text
    assert "PASS: 8 layer(s) in 3 stack(s)" in text


def test_cli_json_names_the_stack(seq2seq_dirs):
    args = ["check", SOURCE, "-m", str(seq2seq_dirs["marian"]), "--generate", "4", "--stack",
            "cross", "-l", "1", "-l", "2", "--json"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] and data["max_error"] <= 1e-5
    assert 2 <= len(data["target_tokens"]) <= 5  # start token and at most 4 written
    (cross,) = data["stacks"]
    assert cross["stack"] == "cross" and cross["key_tokens"] == data["tokens"]
    assert [(lc["stack"], lc["layer"]) for lc in cross["layers"]] == [("cross", 1), ("cross", 2)]
    n_target, n_source = len(data["target_tokens"]), len(data["tokens"])
    assert cross["shapes"]["scores"] == [1, n_target, n_source]
    assert cross["shapes"]["K_h, V_h"] == [1, n_source, 16]


def test_cli_reports_a_mismatch_in_its_stack(seq2seq_dirs, monkeypatch):
    _break(monkeypatch, lambda w, _: replace(w, relative=None))
    result = runner.invoke(app, ["check", SOURCE, "-m", str(seq2seq_dirs["t5"]), "--target",
                                 TARGET, "--stack", "decoder"])  # fmt: skip
    assert result.exit_code == 1
    assert "MISMATCH in decoder layer 0: heads [0, 1, 2, 3]" in " ".join(result.output.split())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "x"], "--target in attnviz check works with encoder-decoder models"),
        (["--generate", "3"], "--generate in attnviz check works with encoder-decoder models"),
        (
            ["--stack", "cross"],
            "--stack cross in attnviz check works with encoder-decoder models "
            "(T5, BART, Marian); all-MiniLM-L6-v2 (bundled) is an encoder",
        ),
        (["--stack", "all"], "--stack all in attnviz check works with encoder-decoder"),
        (
            ["-m", "bart", "--stack", "encoder", "-l", "2"],
            "layer 2 out of range: this model has layers 0–1 in its encoder stack",
        ),
        (["-m", "t5", "--target", "x", "--generate", "2"], "either --target or --generate"),
    ],  # fmt: skip
)
def test_bad_options_are_one_line_with_exit_2(seq2seq_dirs, args, message):
    args = [str(seq2seq_dirs[a]) if a in seq2seq_dirs else a for a in args]
    result = runner.invoke(app, ["check", SOURCE, *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert len(result.output.strip().splitlines()) == 1


def test_a_layer_only_the_decoder_has_is_checked_there(seq2seq_dirs):
    args = ["check", SOURCE, "-m", str(seq2seq_dirs["bart"]), "--target", TARGET, "-l", "2",
            "--stack", "decoder"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "PASS: 1 layer(s) in 1 stack(s)" in " ".join(result.output.split())


def test_terminal_names_the_stack_of_a_failing_layer(seq2seq_dirs, monkeypatch):
    _break(monkeypatch, lambda w, s: replace(w, w_k=w.w_k * 1.3) if s == "cross" else w)
    result = check(_asked(seq2seq_dirs, "mbart"))
    console = Console(width=100, file=io.StringIO(), color_system=None)
    terminal.print_check(console, result)
    text = " ".join(console.file.getvalue().split())
    assert "MISMATCH in cross layer 0: heads [0, 1]" in text
    assert "MISMATCH in encoder" not in text and "MISMATCH in decoder" not in text
    assert "source 9 tokens · target 9 tokens" in text


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_inside_one_cross_attention_head(loaded_seq2seq, arch):
    loaded = loaded_seq2seq[arch]
    item = encode_source_target(loaded, LONG_SOURCE, TARGET)
    n_source, n_target = len(item.source), len(item.target)
    inside = inside_of(loaded, item, "cross")
    n_heads = loaded.info.of_stack("cross").n_heads
    assert inside.stack == "cross" and inside.key_tokens == item.source.tokens
    assert inside.tokens == item.target.tokens
    assert inside.q.shape[:3] == (3, n_heads, n_target)
    assert inside.k.shape[:3] == inside.v.shape[:3] == (3, n_heads, n_source)
    assert inside.errors.shape == (3, n_heads, n_target) and inside.errors.max() <= 1e-5
    assert inside.bias is None
    encoder = inside_of(loaded, item, "encoder")
    assert encoder.errors.max() <= 1e-5 and encoder.q.shape[2] == n_source
    assert (encoder.bias is not None) == (arch == "t5")


def test_the_output_in_the_docs_is_what_check_prints(seq2seq_dirs):
    """docs/commands.md shows check's output on the tiny T5 by hand (the docs' generator has
    no encoder-decoder model to run): its tables and verdict are what the command prints."""
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "commands.md").read_text(encoding="utf-8")
    command = '$ attnviz check "The cat sat on the mat." -m t5-tiny'
    shown = doc[doc.index(command) :].split("```")[0].splitlines()
    args = ["check", SOURCE, "-m", str(seq2seq_dirs["t5"]), "--target", TARGET, "--stack",
            "cross", "-l", "0", "-l", "1"]  # fmt: skip
    printed = runner.invoke(app, args).output

    # The errors' digits are float32 rounding noise that differs between CPUs and BLAS
    # builds: each is compared as "within tolerance", every other character as printed.
    error = re.compile(r"\d\.\de-\d\d")

    def rows(lines):
        return [
            error.sub("<error>", line.rstrip()) for line in lines if line.startswith(("│", "┃"))
        ]

    assert rows(shown) and rows(shown) == rows(printed.splitlines())
    assert all(float(found) <= 1e-5 for found in error.findall(printed))
    verdict = error.sub("<error>", next(line for line in shown if line.startswith("PASS")))
    assert verdict in error.sub("<error>", " ".join(printed.split()))  # the runner wraps it


def test_attnviz_check_passes_the_target_and_stacks_through(seq2seq_dirs):
    import attnviz

    result = attnviz.check(SOURCE, model=str(seq2seq_dirs["bart"]), device="cpu",
                           target=TARGET, stacks=["cross"])  # fmt: skip
    assert result.passed and [part.stack for part in result.stacks] == ["cross"]
