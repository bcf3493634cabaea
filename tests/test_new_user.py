"""What a new user hit (issue 45): a refused run leaves no folder, a model the files show
cannot be read is refused before torch is imported, printing an API result shows what the
command prints, `show --json` says on stderr where its files went, and the terminal never
splits a "token weight" pair."""

from __future__ import annotations

import io
import json
import subprocess
import sys

from rich.console import Console
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app

runner = CliRunner()


def test_a_refused_show_leaves_no_folder(tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(app, ["show", "x y", "-m", str(tmp_path / "missing"), "-o", str(out)])
    assert result.exit_code == 2 and not out.exists()


def test_an_unreadable_model_folder_is_refused_before_torch_loads(tmp_path):
    unknown, empty = tmp_path / "unknown", tmp_path / "empty"
    unknown.mkdir()
    empty.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "nosuchthing"}))
    for folder, said in ((unknown, "a 'nosuchthing' model, a type transformers"),
                         (empty, "no config.json")):  # fmt: skip
        code = (
            "import sys; from attnviz.cli import app\n"
            f"sys.argv = ['attnviz', 'show', 'x y', '-m', {str(folder)!r}]\n"
            "try:\n    app()\nexcept SystemExit as e:\n"
            "    print(e.code, 'torch' in sys.modules, 'transformers' in sys.modules)\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.stdout.split() == ["2", "False", "False"], done.stdout + done.stderr
        assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_printing_an_api_result_shows_what_the_command_prints(bundled):
    found = attnviz.check("The cat sat.", device="cpu")
    printed = str(found)
    assert printed.splitlines()[-1].startswith("PASS: 6 layer(s)")
    from attnviz.analysis.check import CheckResult

    assert isinstance(found, CheckResult) and found.passed  # the same result, fields and all
    compared = attnviz.compare("The cat sat.", "The dog sat.", device="cpu")
    assert str(compared).startswith("Comparison of 1 pair(s): JS divergence")


def test_show_json_says_on_stderr_where_its_files_went(tmp_path):
    result = runner.invoke(app, ["show", "The cat sat.", "--json", "-o", str(tmp_path),
                                 "--layer", "0", "--head", "0"])  # fmt: skip
    assert result.exit_code == 0
    json.loads(result.stdout)  # stdout is the JSON alone
    assert result.stderr.startswith("wrote 3 files to ")


def test_the_terminal_never_splits_a_token_and_its_weight():
    from attnviz.outputs.terminal.common import _Pairs

    console = Console(width=30, file=io.StringIO(), color_system=None)
    console.print(_Pairs(["cabinets .09", "[CLS] .53", "table .08", "keys .12"]))
    lines = console.file.getvalue().splitlines()
    assert len(lines) > 1
    assert all(
        pair in {p for line in lines for p in line.strip().split("  ")}
        for pair in ["cabinets .09", "[CLS] .53", "table .08", "keys .12"]
    )
