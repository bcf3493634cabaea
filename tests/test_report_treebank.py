"""`attnviz report --treebank` end to end on the shipped samples with the bundled model, its
numbers checked against a plain per-arc loop."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnviz.cli import app

runner = CliRunner()
SAMPLES = Path(__file__).resolve().parent.parent / "samples"
EWT = SAMPLES / "en_ewt-dev-excerpt.conllu"
PRONOUNS = SAMPLES / "pronouns.conllu"


@pytest.fixture(scope="module")
def ewt_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("ewt")
    result = runner.invoke(app, ["report", "--treebank", str(EWT), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_files_table_and_roles(ewt_report):
    out, output = ewt_report
    text = " ".join(output.split())
    assert "Syntax: the best head per relation (relations with ≥ 100 arcs)" in text
    assert "has no coreference" in text
    with open(out / "syntax.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["relation", "direction", "layer", "head", "accuracy", "n",
                             "baseline", "baseline_accuracy"]  # fmt: skip
    relations = {r["relation"] for r in rows}
    assert {"det", "case", "nsubj", "punct", "obj"} <= relations and "obl" not in relations  # 96
    assert all(int(r["n"]) >= 100 for r in rows) and len(rows) == 2 * len(relations)
    every = json.loads((out / "syntax.json").read_text())["relations"]
    assert every["obl"]["n"] == 96 and not every["obl"]["in_table"]
    assert (
        len(every["det"]["dependent-to-head"]) == 6
        and len(every["det"]["head-to-dependent"][0]) == 12
    )
    for row in rows:  # the CSV's best head is the best of syntax.json's every head
        grid = every[row["relation"]][row["direction"]]
        assert float(row["accuracy"]) == pytest.approx(max(max(layer) for layer in grid), abs=1e-6)
        assert float(row["accuracy"]) == pytest.approx(
            grid[int(row["layer"])][int(row["head"])], abs=1e-6
        )
    markdown = (out / "report.md").read_text()
    assert "## Syntax" in markdown and "## Coreference" in markdown
    assert "](syntax-heads.png)" in markdown and (out / "syntax-heads.png").is_file()
    examples = sorted(out.glob("syntax-*-layer-*-head-*.png"))
    assert examples and all(f"]({p.name})" in markdown for p in examples)
    with open(out / "heads.csv", newline="") as handle:
        heads = list(csv.DictReader(handle))
    named = {(int(h["layer"]), int(h["head"])): h["linguistic_roles"] for h in heads}
    for row in rows:  # a head named for a relation beats its baseline by the margin, and back
        for (layer, head), roles in named.items():
            accuracy = every[row["relation"]][row["direction"]][layer][head]
            suffix = "" if row["direction"] == "dependent-to-head" else ":h2d"
            beats = accuracy >= float(row["baseline_accuracy"]) + 0.1
            assert beats == (f"syntax:{row['relation']}{suffix}" in roles.split(";"))
    assert any(named.values()) and heads[0]["role"]  # positional roles are still there
    # Without colour, a mark (not a colour) tells the rows whose head beats the baseline.
    beating = [r for r in rows if float(r["accuracy"]) >= float(r["baseline_accuracy"]) + 0.1]
    assert text.count("% *") == len(beating) > 0 and "green" not in text
    assert "* marks such a head's accuracy" in text


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_numbers_match_a_plain_loop(ewt_report, bundled):
    from attnviz.analysis.transforms import word_view
    from attnviz.core.extract import attend, batched
    from attnviz.core.tokens import encode_words
    from attnviz.core.treebank import read_treebank

    out, _ = ewt_report
    every = json.loads((out / "syntax.json").read_text())["relations"]
    correct, arcs, offsets = Counter(), 0, Counter()
    items = read_treebank(str(EWT)).items
    encoded = [encode_words(bundled, s.words, s.space_after) for s in items]
    extracted = (att for batch in batched(encoded, 16) for att in attend(bundled, batch))
    for s, att in zip(items, extracted):
        grid = word_view(att).weights[2, 8]  # (W, W): [CLS] at 0, the sentence's words at 1…n
        for d, (h, rel) in enumerate(zip(s.heads, s.relations)):
            if rel != "det":
                continue
            arcs += 1
            offsets[h - d] += 1
            predicted = max(range(len(s.words)), key=lambda j: grid[d + 1, j + 1])
            correct["down"] += predicted == h
            correct["up"] += max(range(len(s.words)), key=lambda j: grid[h + 1, j + 1]) == d
    det = every["det"]
    assert det["n"] == arcs
    assert det["dependent-to-head"][2][8] == pytest.approx(correct["down"] / arcs, abs=1e-6)
    assert det["head-to-dependent"][2][8] == pytest.approx(correct["up"] / arcs, abs=1e-6)
    offset, count = offsets.most_common(1)[0]
    assert (det["baseline_offset"], det["baseline_accuracy"]) == (
        offset,
        pytest.approx(count / arcs),
    )


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_pronoun_set_coreference(tmp_path):
    result = runner.invoke(
        app, ["report", "--treebank", str(PRONOUNS), "-o", str(tmp_path), "--min-count", "20",
              "--json", "--margin", "0.05"]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    tree = data["treebank"]
    assert tree["syntax"] is None and any("no syntax" in n for n in tree["notes"])
    coref = tree["coreference"]
    assert coref["mentions"] == 60 and 0 < coref["baseline_accuracy"] < 1
    with open(tmp_path / "coreference.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 72 and list(rows[0]) == ["layer", "head", "accuracy", "n"]
    best = max(rows, key=lambda r: float(r["accuracy"]))
    assert float(best["accuracy"]) == pytest.approx(coref["best"]["accuracy"])
    for head in data["heads"]:
        accuracy = coref["accuracy"][head["layer"]][head["head"]]
        named = "coreference" in head["linguistic_roles"]
        assert named == (accuracy >= coref["baseline_accuracy"] + 0.05)
    assert "**60 mentions**" in (tmp_path / "report.md").read_text()
