"""attnviz leaves the process as it found it (issue 59 item 7): loading a model quietens
transformers and accelerate for the load alone."""

from __future__ import annotations

import logging

import pytest

from tests import any_models
from tests.conftest import _sentencepiece_tokenizer


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
    finally:
        hf_logging.set_verbosity(verbosity)
        accelerate.setLevel(level)
    assert heard == [logging.ERROR, logging.ERROR]
    assert after == (logging.INFO, logging.DEBUG, True)
