"""`attnviz --help` must not import torch, transformers or matplotlib (nor the web server's
starlette and uvicorn)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from typer.testing import CliRunner
from attnviz.cli import app
result = CliRunner().invoke(app, {args!r})
assert result.exit_code == 0, result.output
heavy = ("torch", "transformers", "matplotlib", "starlette", "uvicorn")
print(sorted(m for m in heavy if m in sys.modules))
"""


@pytest.mark.parametrize("args", [["--help"], ["show", "--help"], ["serve", "--help"]])
def test_help_imports_no_heavy_module(args):
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_probe_can_fail():
    """The probe itself notices a heavy import (so the test above can fail)."""
    probe = PROBE.format(args=["--help"]).replace(
        "import sys\n", "import sys\nimport matplotlib\n", 1
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['matplotlib']"
