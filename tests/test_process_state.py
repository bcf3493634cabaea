"""attnviz leaves the process as it found it (issue 59 item 7): loading a model quietens
transformers and accelerate for the load alone; file writes read the umask once, not once a
file; a Ctrl-C stops the run it came in, not the next one; the model types transformers knows
are its own table, read without importing it."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from tests import any_models
from tests.conftest import _sentencepiece_tokenizer

runner = CliRunner()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A folder with a tiny Llama and its tokenizer."""
    from transformers import AutoModelForCausalLM

    tokenizer = _sentencepiece_tokenizer()
    folder = tmp_path_factory.mktemp("llama") / "llama"
    return any_models.save("llama", AutoModelForCausalLM, tokenizer, folder,
                           vocab_size=len(tokenizer))  # fmt: skip


def test_loading_leaves_the_processs_logging_as_it_was(llama, monkeypatch):
    """transformers at INFO, accelerate at DEBUG (a notebook's choice): errors only while the
    model loads, and INFO and DEBUG again after (it was errors only for good)."""
    from transformers.utils import logging as hf_logging

    from attnviz.core import models

    heard, config = [], models._config

    def configured(*args):
        heard.append(hf_logging.get_verbosity())
        return config(*args)

    accelerate = logging.getLogger("accelerate")
    verbosity, level = hf_logging.get_verbosity(), accelerate.level
    monkeypatch.setattr(models, "_config", configured)
    hf_logging.set_verbosity_info()
    accelerate.setLevel(logging.DEBUG)
    try:
        models.load_tokenizer(llama)
        models.load_model(llama, "cpu")
        after = (hf_logging.get_verbosity(), accelerate.level, hf_logging.is_progress_bar_enabled())
        with models._quiet():  # two threads' loads overlapping: put back after the last
            second = models._quiet()
            second.__enter__()
        assert hf_logging.get_verbosity() == logging.ERROR
        second.__exit__(None, None, None)
        assert hf_logging.get_verbosity() == logging.INFO
    finally:
        hf_logging.set_verbosity(verbosity)
        accelerate.setLevel(level)
    assert heard == [logging.ERROR, logging.ERROR]
    assert after == (logging.INFO, logging.DEBUG, True)


def test_file_writes_read_the_umask_once(tmp_path, monkeypatch):
    """Reading the umask means setting it and back, which another thread making a file at
    that moment would feel: once a process, not twice a file."""
    import os

    from attnviz.outputs import files

    calls, umask = [], os.umask
    mask = umask(0o022)
    umask(mask)

    def counted(mask):
        calls.append(mask)
        return umask(mask)

    monkeypatch.setattr(os, "umask", counted)
    for n in range(5):
        written = files.write_text_atomic(tmp_path / f"file-{n}.txt", "x")
        assert written.stat().st_mode & 0o777 == 0o666 & ~mask
    assert len(calls) <= 2  # set, and straight back, if no file was written before


def test_a_ctrl_c_of_an_earlier_run_does_not_stop_the_next(llama, tmp_path, monkeypatch):
    """A Ctrl-C stopped an export (the flag `interrupts.asked` was set): the next export in the
    same process (a notebook's) runs whole, it no longer stops before its first text."""
    from attnviz.core import interrupts

    monkeypatch.setattr(interrupts, "_asked", True)
    out = tmp_path / "out"
    result = runner.invoke(app, ["export", "The cat sat.", "A dog barked.", "-m", llama,
                                 "-o", str(out), "--figures", "overview"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(list(out.glob("*/overview.png"))) == 2
    assert not interrupts.asked()


def test_the_known_model_types_are_transformers_own_table():
    """Every type of transformers' CONFIG_MAPPING_NAMES passes the refusal from the files,
    'kosmos-2.5' too (a regex over transformers' source missed its dot), and a type it does
    not hold is refused; the table is read without importing transformers or torch."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from attnviz.core.models import _refuse_unknown_type
    from attnviz.errors import ModelLoadError

    for kind in CONFIG_MAPPING_NAMES:
        if kind != "EvollaModel":  # an alias Evolla's config does not name ('evolla')
            _refuse_unknown_type("m", kind)
    with pytest.raises(ModelLoadError, match="a 'nosuchthing' model, a type transformers"):
        _refuse_unknown_type("m", "nosuchthing")
    code = (
        "import sys; from attnviz.core.models import _known_types\n"
        "assert 'kosmos-2.5' in _known_types()\n"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stderr
