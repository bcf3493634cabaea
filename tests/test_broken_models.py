"""A broken checkpoint is one line (issue 59 item 1): a config.json that is not JSON, one with
a field of the wrong type or numbers transformers refuses, weights that do not fit the config
or are cut off, a tokenizer missing or unreadable. Every command says it in one line that
names the file and what is wrong in it, exits 2 and writes nothing; the API raises an
exception of attnviz's own with the same line.

Each checkpoint is a tiny Llama saved by the test and then broken, as a user's would be.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app
from attnviz.errors import AttnvizError
from tests import any_models
from tests.conftest import _sentencepiece_tokenizer

runner = CliRunner()
TEXT = "The cat sat on the mat."


def _config(folder, **fields):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))


def _cut(folder):
    weights = folder / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])  # a download that stopped half-way


def _no_tokenizer(folder):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()


# name: (what breaks the folder, the file the line names, what it says is wrong there)
BROKEN = {
    "config-not-json": (lambda f: (f / "config.json").write_text('{"model_type": "llama", '),
                        "config.json", " is not valid JSON: expecting property name enclosed in "
                        "double quotes at line 1, column 25"),
    "field-of-wrong-type": (lambda f: _config(f, hidden_size="abc"), "config.json",
                            ": field 'hidden_size' expected int, got str (value: 'abc')"),
    "numbers-refused": (lambda f: _config(f, layer_types=["full_attention"]), "config.json",
                        ": `num_hidden_layers` (2) must be equal to the number of `layer_types` "
                        "(1)"),
    "rope-refused": (lambda f: _config(f, rope_parameters={"rope_type": "linear"}),
                     "config.json", ": missing required keys in `rope_parameters` for "
                     "'rope_type'='linear': {'factor'}"),
    "weights-of-other-shapes": (lambda f: _config(f, hidden_size=64, head_dim=16),
                                "model.safetensors", re.compile(
                                    r" does not fit \S+/config\.json: \S+ is \d+ × 32 in the "
                                    r"weights, \d+ × 64 by the config \(\d+ more weights differ\)"
                                )),
    "weights-of-fewer-layers": (lambda f: _config(f, num_hidden_layers=3), "model.safetensors",
                                re.compile(r" does not fit \S+/config\.json: it has no "
                                           r"model\.layers\.2\.\S+ and \d+ more")),
    "weights-cut-off": (_cut, "model.safetensors", " is cut off or damaged: Error while "
                        "deserializing header: incomplete metadata, file not fully covered"),
    "no-tokenizer": (_no_tokenizer, "", " has no tokenizer: none of tokenizer.json, "
                     "tokenizer.model, spiece.model, sentencepiece.bpe.model, vocab.txt, "
                     "vocab.json is in "),
    "tokenizer-not-json": (lambda f: (f / "tokenizer.json").write_text("{not json"),
                           "tokenizer.json", " is not valid JSON: expecting property name "
                           "enclosed in double quotes at line 1, column 2"),
}  # fmt: skip


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """{name: a folder with a tiny Llama broken that way}."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("broken")
    tokenizer = _sentencepiece_tokenizer()
    whole = any_models.save("llama", AutoModelForCausalLM, tokenizer, root / "whole",
                            vocab_size=len(tokenizer))  # fmt: skip
    folders = {}
    for name, (breaking, _, _) in BROKEN.items():
        folders[name] = shutil.copytree(whole, root / name)
        breaking(folders[name])
    return folders


def _said(name, folder, line):
    """Assert that `line` names the file of `BROKEN[name]` and says what is wrong there."""
    _, file, wrong = BROKEN[name]
    start = f"{folder / file}" if file else f"{folder}"
    assert line.startswith(start), line
    said = line[len(start) :]
    if isinstance(wrong, re.Pattern):
        assert wrong.match(said), said
    else:
        assert said.startswith(wrong), said


COMMANDS = {
    "show": ["show", TEXT],
    "export": ["export", TEXT, "A dog barked."],
    "report": ["report", TEXT, "A dog barked."],
    "check": ["check", TEXT],
    "compare": ["compare", TEXT, "A dog barked."],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", BROKEN)
def test_every_command_says_a_broken_checkpoint_in_one_line(name, command, broken, tmp_path):
    out = tmp_path / "out"
    written = [] if command == "check" else ["-o", str(out)]
    result = runner.invoke(app, [*COMMANDS[command], "-m", str(broken[name]), *written])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    _said(name, broken[name], lines[0].removeprefix("error: "))
    assert not out.exists()  # nothing written


API = {
    "attention": lambda model: attnviz.attention(TEXT, model=model, device="cpu"),
    "check": lambda model: attnviz.check(TEXT, model=model, device="cpu"),
    "report": lambda model: attnviz.report([TEXT, "A dog barked."], model=model, device="cpu"),
    "compare": lambda model: attnviz.compare(TEXT, "A dog barked.", model=model, device="cpu"),
}


@pytest.mark.parametrize("function", API)
@pytest.mark.parametrize("name", BROKEN)
def test_the_api_raises_its_own_error_with_the_same_line(name, function, broken):
    with pytest.raises(AttnvizError) as raised:
        API[function](str(broken[name]))
    _said(name, broken[name], str(raised.value))
