"""What a new user hit (issue 57): text that is not UTF-8 on the command line is one line
wherever text is read, and the API's input error; a checkpoint read as another class than it
declares says both; a decoder's continuation table marks a line break as one (↵, not a
space's ␣) and says what its columns hold; a command's --help fits a screen, its options in
the reference's panels, and docs/reference.md keeps each help whole."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import COMMANDS, app
from attnviz.errors import InputError
from tests.test_docs import generate

runner = CliRunner()

# What Python makes of the argument b"The cat \xff\xfe sat": the bytes that are not UTF-8
# become the lone surrogates U+DCFF and U+DCFE (surrogateescape), which no tokenizer reads.
NOT_UTF8 = b"The cat \xff\xfe sat".decode("utf-8", "surrogateescape")


@pytest.mark.parametrize(
    "args, what",
    [
        (["show", NOT_UTF8, "--no-images"], "text"),
        (["show", "The cat sat.", "--pair", NOT_UTF8, "--no-images"], "the --pair sentence"),
        (["check", NOT_UTF8], "text"),
        (["compare", "The dog sat.", NOT_UTF8, "--no-images"], "text B"),
        (["export", "The dog sat.", NOT_UTF8], "sentence 2 of the arguments"),
        (["report", NOT_UTF8], "sentence 1 of the arguments"),
    ],
)
def test_text_that_is_not_utf8_is_one_line_naming_its_first_bad_byte(args, what, tmp_path):
    result = runner.invoke(app, [*args, "-o", str(tmp_path)] if args[0] != "check" else args)
    assert result.exit_code == 2, result.output
    said = f"error: {what}: not valid UTF-8 (byte 9, 0xff); give the text in UTF-8\n"
    assert result.stderr == said


def test_the_same_bytes_as_an_argument_and_in_a_file_are_said_at_the_same_byte(tmp_path):
    """A process given the bytes themselves, as a shell gives them, and `export -f` of a file
    that holds them: one line each, exit 2, byte 9."""
    bad = b"The cat \xff\xfe sat"
    (tmp_path / "bad.txt").write_bytes(bad + b"\n")
    for args in ([b"show", bad, b"--no-images"], [b"export", b"-f", b"bad.txt"]):
        done = subprocess.run([sys.executable, "-m", "attnviz", *args], cwd=tmp_path,
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert "not valid UTF-8 (byte 9" in done.stderr


@pytest.mark.parametrize(
    "call",
    [
        lambda: attnviz.attention(NOT_UTF8, device="cpu"),
        lambda: attnviz.attention("The cat sat.", target="x \ud800", device="cpu"),
        lambda: attnviz.check("x \ud800", device="cpu"),
        lambda: attnviz.report(["The cat sat.", "x \ud800"], device="cpu"),
        lambda: attnviz.compare("x \ud800", "The dog sat.", device="cpu"),
    ],
    ids=["attention", "target", "check", "report", "compare"],
)
def test_the_api_raises_its_input_error_for_text_that_is_not_unicode(call):
    said = r"not valid (UTF-8 \(byte 9, 0xff|Unicode \(character 3 is a lone surrogate, U\+D800)"
    with pytest.raises(InputError, match=said):
        call()


def test_a_checkpoint_read_as_another_class_says_both(tmp_path):
    """A saved ViTForImageClassification is read as its ViTModel (attnviz reads no classifier
    head): the header, the JSON and the API say the class the checkpoint declares and the one
    read."""
    import torch
    import transformers
    from vision_models import _SQUARE, _VIT, picture

    folder = tmp_path / "vit-classifier"
    torch.manual_seed(0)
    config = transformers.ViTConfig(**_VIT, num_labels=3)
    transformers.ViTForImageClassification(config).save_pretrained(folder)
    transformers.ViTImageProcessor(**_SQUARE).save_pretrained(folder)
    path = picture(tmp_path / "cat.png")
    result = runner.invoke(app, ["show", str(path), "-m", str(folder), "--no-images"])
    assert result.exit_code == 0, result.output
    said = "".join(result.stdout.split())  # the header, wherever the terminal wrapped it (a
    # long folder's name mid-word): compared without its spaces
    assert "vit-classifier·ViTForImageClassificationreadasViTModel·2×4heads" in said
    info = attnviz.attention(path, model=str(folder), device="cpu").info
    assert (info.declared, info.architecture) == ("ViTForImageClassification", "ViTModel")
    assert info.as_dict()["declared"] == "ViTForImageClassification"


def test_a_token_of_whitespace_alone_is_marked_as_what_it_is():
    from attnviz.core.tokens import label_of

    assert [label_of(piece) for piece in ("\n", "\n\n", " \n", " ", "\t", " Paris ", ".\n")] == [
        "↵", "↵↵", "↵", "␣", "␣", "Paris", ".",
    ]  # fmt: skip


def test_the_continuation_table_marks_line_breaks_and_says_what_its_columns_hold(tmp_path):
    from transformers import AutoModelForCausalLM

    from tests import any_models
    from tests.conftest import _byte_level_tokenizer

    tokenizer = _byte_level_tokenizer()
    ids = dict(vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=0, pad_token_id=0)
    folder = any_models.save("gpt2", AutoModelForCausalLM, tokenizer, tmp_path / "gpt2", **ids)
    result = runner.invoke(app, ["show", "The cat sat.", "-m", folder, "--target",
                                 "\n\nThe dog sat.", "--no-images"])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [line.split("│") for line in result.stdout.splitlines() if line.startswith("│")]
    assert [row[2].strip() for row in rows] == ["↵", "↵", "The", "dog", "sat", "."]
    said = " ".join(result.stdout.split())
    assert "p: the probability the model gave it" in said and "↵ is a line break" in said
    assert "␣" not in said


def _help(command: str) -> str:
    """`attnviz COMMAND --help` as a terminal 100 columns wide shows it."""
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_s_help_fits_a_screen(command):
    """At 100 columns (show's was 173 lines, 245 at 80)."""
    assert len(_help(command).splitlines()) <= 80


def test_show_s_help_groups_its_options_as_the_reference_does_which_keeps_each_help_whole():
    shown = _help("show")
    reference = generate.reference().split("\n## `attnviz show`\n")[1].split("\n## ")[0]
    panels = re.findall(r"^\*\*(.+)\*\*$", reference, re.M)
    assert re.findall(r"╭─ (.+?) ─", shown) == panels
    assert panels[:4] == ["Arguments", "Options", "Reading the text", "Measures"]
    assert panels[-1] == "Loading the model"
    # --help gives an option's first line, the reference the whole text after it
    row = next(line for line in reference.splitlines() if line.startswith("| `--attention`"))
    assert row.endswith("| How attention runs. sdpa (fast; attnviz records the probabilities "
                        "inside the model's attention call, from its own q and k, in blocks of "
                        "rows; layers nobody asks for run SDPA), flash_attention_2 (the same, "
                        "those layers on flash-attn's kernels: CUDA, half precision) or eager "
                        "(the model's own probabilities, held layer by layer; for comparison). "
                        "docs/models.md says more. |")  # fmt: skip
    line = next(line for line in shown.splitlines() if "--attention" in line)
    assert "How attention runs. [default: sdpa]" in line and "records" not in shown
    # and a command's opening paragraphs, the reference the rest as well
    assert "A text's folder holds only its last run's files." in reference
    assert "last run's files" not in shown and "docs/reference.md" in shown
