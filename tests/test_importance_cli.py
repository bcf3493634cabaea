"""`attnviz report --importance` and `attnviz show --ablate` end to end on tiny models: the
numbers in the files against losses computed by hand, and the refusals."""

from __future__ import annotations

import copy
import csv
import json

import pytest
from typer.testing import CliRunner

from attnviz.cli import app

runner = CliRunner()
TEXTS = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog!"]


def _loss_by_hand(model, ids_list):
    """Mean next-token −log P over tokens 1 … T−1 of every text, by a plain loop."""
    import torch

    total, count = 0.0, 0
    for ids in ids_list:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].double()  # (T, V)
        for p in range(1, len(ids)):
            total -= float(torch.log_softmax(logits[p - 1], dim=-1)[ids[p]])
            count += 1
    return total / count


def _without_head(model, layer, head, d_head):
    """A copy of a Llama-family model whose layer's W_O ignores `head`."""
    import torch

    copied = copy.deepcopy(model)
    with torch.no_grad():
        copied.model.layers[layer].self_attn.o_proj.weight[
            :, head * d_head : (head + 1) * d_head
        ] = 0
    return copied


def _ids(loaded, texts):
    from attnviz.core.tokens import encode

    return [list(encode(loaded, t).ids) for t in texts]


@pytest.mark.slow  # a report with figures, twice over: ~6 s
def test_report_importance_both_writes_columns_map_and_section(
    tiny_model_dirs, loaded_tiny, tmp_path
):
    out = tmp_path / "report"
    model = str(tiny_model_dirs["llama"])
    result = runner.invoke(app, ["report", *TEXTS, "-m", model, "-o", str(out),
                                 "--importance", "both"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Which heads matter" in result.output
    with open(out / "heads.csv", newline="") as handle:
        rows = {(int(r["layer"]), int(r["head"])): r for r in csv.DictReader(handle)}
    loaded = loaded_tiny["llama"]
    ids = _ids(loaded, TEXTS)
    clean = _loss_by_hand(loaded.model, ids)
    without = _without_head(loaded.model, 1, 2, loaded.info.d_head)
    assert float(rows[1, 2]["importance"]) == pytest.approx(_loss_by_hand(without, ids) - clean,
                                                           abs=1e-5)  # fmt: skip
    ranks = sorted(int(r["importance_rank"]) for r in rows.values())
    assert ranks == list(range(1, 9))
    assert all(float(r["importance_gradient"]) >= 0 for r in rows.values())
    data = json.loads((out / "heads.json").read_text())
    assert data["importance"]["importance"]["clean"] == pytest.approx(clean, abs=1e-5)
    assert -1 <= data["importance"]["spearman"] <= 1
    markdown = (out / "report.md").read_text()
    assert "## Which heads matter" in markdown and "Spearman correlation" in markdown
    for name in ("importance.png", "importance-gradient.png"):
        assert f"]({name})" in markdown and (out / name).is_file()


def test_gradient_on_an_encoder_without_its_head_is_refused_in_one_line(tiny_model_dirs, tmp_path):
    out = tmp_path / "report"
    result = runner.invoke(app, ["report", *TEXTS, "-m", str(tiny_model_dirs["bert"]), "-o",
                                 str(out), "--importance", "gradient"])  # fmt: skip
    assert result.exit_code == 2
    assert "use --importance ablation" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (out / "report.md").exists() and not (out / "heads.csv").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["report", "Hi there.", "--importance", "sometimes"], "unknown importance 'sometimes'"),
        (["report", "Hi there.", "--importance", "ablation", "--ablation", "half"],
         "unknown --ablation 'half'"),
        (["show", "Hi there.", "--ablate", "5"], "--ablate '5': give a head as LAYER.HEAD"),
        (["show", "Hi there.", "--ablate", "5.x"], "--ablate '5.x'"),
        (["show", "Hi there.", "--ablate", "2.1"], "layer 2 out of range: this model has layers"),
        (["show", "Hi there.", "--ablate", "1.4"], "head 4 out of range: this model has heads"),
    ],
)  # fmt: skip
def test_bad_importance_input_is_refused_before_the_model_loads(
    tiny_model_dirs, tmp_path, monkeypatch, args, message
):
    from attnviz.core import models

    def no_load(*_args, **_kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", no_load)
    result = runner.invoke(
        app, [*args, "-m", str(tiny_model_dirs["gpt2"]), "-o", str(tmp_path / "o")]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").rglob("*.*"))


def test_importance_with_no_texts_is_refused(tiny_model_dirs, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    model = str(tiny_model_dirs["gpt2"])
    result = runner.invoke(app, ["report", "-f", str(empty), "--importance", "ablation", "-m",
                                 model, "-o", str(tmp_path / "o")])  # fmt: skip
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1


def test_show_ablate_on_a_decoder_gives_losses_and_guesses(tiny_model_dirs, loaded_tiny):
    text = "The cat sat on the mat."
    result = runner.invoke(app, ["show", text, "-m", str(tiny_model_dirs["llama"]), "--ablate",
                                 "1.2", "--no-images", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)["ablation"]
    loaded = loaded_tiny["llama"]
    ids = _ids(loaded, [text])
    assert data["before"] == pytest.approx(_loss_by_hand(loaded.model, ids), abs=1e-5)
    without = _without_head(loaded.model, 1, 2, loaded.info.d_head)
    assert data["after"] == pytest.approx(_loss_by_hand(without, ids), abs=1e-5)
    assert len(data["predictions"]) == len(ids[0])
    assert all(len(p["before"]) == 5 and len(p["after"]) == 5 for p in data["predictions"])
    shown = runner.invoke(app, ["show", text, "-m", str(tiny_model_dirs["llama"]), "--ablate",
                                "1.2", "--no-images", "--query", "cat"])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert "Removed L1 H2" in shown.output and "Top-5 next tokens" in shown.output


def test_show_ablate_on_an_encoder_moves_the_embedding_and_the_maps(tiny_model_dirs, loaded_tiny):
    """1 − cos of the mean-pooled last hidden state, against a copy whose layer-0 W_O ignores
    head 1; layer 1's attention changes, layer 0's does not."""
    import torch

    text = "The cat sat on the mat."
    model = str(tiny_model_dirs["bert"])
    plain = json.loads(runner.invoke(app, ["show", text, "-m", model, "--no-images",
                                           "--json"]).output)  # fmt: skip
    result = runner.invoke(app, ["show", text, "-m", model, "--ablate", "0.1", "--no-images",
                                 "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    loaded = loaded_tiny["bert"]
    ids = torch.tensor(_ids(loaded, [text]))
    copied = copy.deepcopy(loaded.model)
    d_head = loaded.info.d_head
    with torch.no_grad():
        copied.encoder.layer[0].attention.output.dense.weight[:, d_head : 2 * d_head] = 0
        before = loaded.model(input_ids=ids).last_hidden_state[0].double().mean(dim=0)
        after = copied(input_ids=ids).last_hidden_state[0].double().mean(dim=0)
    expected = 1 - float(torch.nn.functional.cosine_similarity(before, after, dim=0))
    assert data["ablation"]["after"] == pytest.approx(expected, abs=1e-6)
    assert expected > 1e-7
    by_head = {(h["layer"], h["head"]): h for h in data["heads"]}
    plain_by_head = {(h["layer"], h["head"]): h for h in plain["heads"]}
    assert by_head[0, 0] == plain_by_head[0, 0]
    assert by_head[1, 0]["scores"] != plain_by_head[1, 0]["scores"]


def test_show_ablate_marks_the_removed_head_in_the_map_and_the_json(tiny_model_dirs):
    """The removed head has no pattern: `"removed": true` and nulls in --json (valid JSON:
    no NaN in the special shares either), a mark in the terminal's map; the other heads keep
    theirs."""
    text = "The cat sat on the mat."
    model = str(tiny_model_dirs["bert"])
    result = runner.invoke(app, ["show", text, "-m", model, "--ablate", "0.1", "--no-images",
                                 "--json", "--query", "cat"])  # fmt: skip
    assert result.exit_code == 0, result.output

    def no_nan(name):
        raise AssertionError(f"{name} in the JSON")

    data = json.loads(result.output, parse_constant=no_nan)
    by_head = {(h["layer"], h["head"]): h for h in data["heads"]}
    removed = by_head[0, 1]
    assert removed["removed"] is True
    for key in ("pattern", "scores", "top", "special_share", "strongest_link", "query_top"):
        assert removed[key] is None, key
    others = [h for key, h in by_head.items() if key != (0, 1)]
    assert all(h["removed"] is False and h["pattern"]["role"] for h in others)
    assert all(h["query_top"] for h in others)
    shares = data["special_share"]
    assert shares["per_head_weights"][0][1] is None and shares["per_head_norm"][0][1] is None
    kept = [v for row in shares["per_head_weights"] for v in row if v is not None]
    assert shares["weights"] == pytest.approx(sum(kept) / len(kept))
    shown = runner.invoke(app, ["show", text, "-m", model, "--ablate", "0.1", "--no-images"])
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if line.startswith("L0"))
    assert row.split()[2] == "✗" and row.count("✗") == 1
    assert "✗=removed" in " ".join(shown.output.split())
