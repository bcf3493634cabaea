"""The structure the code promises (docs/architecture.md): one module registers hooks, one
forward pass per text, and layers whose imports point one way (with a check that can fail)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "attnviz"


def test_hooks_are_registered_in_one_module():
    hooking = re.compile(r"register_forward(_pre)?_hook|register_full_backward_hook")
    modules = sorted(
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*.py")
        if hooking.search(path.read_text(encoding="utf-8"))
    )
    assert modules == ["attnviz/core/capture.py"]


def _count_passes(model):
    """Count forward passes of `model`'s base model (its embeddings run once a pass)."""
    calls = []
    embeddings = model.base_model.get_input_embeddings()
    handle = embeddings.register_forward_hook(lambda *_: calls.append(1))
    return calls, handle


@pytest.mark.parametrize("query", [None, "fox"])
def test_show_with_the_page_runs_the_model_once(bundled, tmp_path, query):
    from attnviz.core import models
    from attnviz.core.settings import Load
    from attnviz.pipelines.request import ShowRequest
    from attnviz.pipelines.show import show

    assert models.model(None, "cpu").load() is bundled
    calls, handle = _count_passes(bundled.model)
    try:
        text = "The quick brown fox jumps."
        result = show(ShowRequest(Load(None, "cpu"), text=text, out=tmp_path, html=True,
                              query=query))  # fmt: skip
    finally:
        handle.remove()
    assert result.page is not None and result.page.exists()
    assert '"inside": {' in result.page.read_text(encoding="utf-8")  # the inside view is there
    assert len(calls) == 1


def test_export_with_pages_runs_one_pass_per_batch(bundled, tmp_path):
    from attnviz.core.inputs import read_sentences
    from attnviz.core.settings import Load
    from attnviz.outputs.figures import Style
    from attnviz.pipelines.export import export
    from attnviz.pipelines.request import ExportRequest

    sentences = read_sentences(None, ["One cat.", "Two dogs ran.", "Three birds sang loudly."])
    calls, handle = _count_passes(bundled.model)
    try:
        asked = ExportRequest(Load(None, "cpu"), sentences=sentences, html=True,
                        figures=("overview",), out=tmp_path, style=Style(),
                        batch_size=2)  # fmt: skip
        export(asked)
    finally:
        handle.remove()
    assert len(calls) == 2  # batches of 2 and 1, the inside views from the same passes
    pages = sorted(tmp_path.glob("*/attention.html"))
    assert len(pages) == 3 and all('"inside": {' in p.read_text(encoding="utf-8") for p in pages)


def _lint_imports(tree: Path) -> subprocess.CompletedProcess:
    config = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    contracts = config[config.index("[tool.importlinter]") :]
    (tree / ".importlinter.toml").write_text(contracts, encoding="utf-8")
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(lint), "--config", ".importlinter.toml", "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    "module, line, broken",
    [
        (None, None, None),
        # an upward import hidden inside a function: core must not reach pipelines
        ("core/extract.py", "    from attnviz.pipelines import show", "Layers point one way"),
        # a cycle between two modules of one layer
        ("core/mha.py", "    from attnviz.core import families", "No import cycle"),
    ],
)
def test_the_import_check_keeps_the_layers(tmp_path, module, line, broken):
    if shutil.which("lint-imports", path=str(Path(sys.executable).parent)) is None:
        pytest.fail("lint-imports is not installed: make test installs the dev extras")
    shutil.copytree(PACKAGE, tmp_path / "attnviz", ignore=shutil.ignore_patterns("__pycache__"))
    if module is not None:
        path = tmp_path / "attnviz" / module
        path.write_text(
            path.read_text(encoding="utf-8") + f"\n\ndef _sneak():\n{line}\n", encoding="utf-8"
        )
    result = _lint_imports(tmp_path)
    if broken is None:
        assert result.returncode == 0, result.stdout
    else:
        assert result.returncode != 0
        assert re.search(re.escape(broken) + r".* BROKEN", result.stdout), result.stdout


def test_no_function_of_the_pipelines_or_the_command_line_is_over_80_lines():
    """A command's run reads as a short composition (docs/architecture.md): its steps live in
    the consumers, sources and analysis, not in one long function."""
    import ast

    long = []
    for folder in ("pipelines", "cli"):
        for path in sorted((ROOT / "attnviz" / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > 80:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {lines}")
    assert not long, long
