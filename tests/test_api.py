"""The Python API: attention in three lines, the same numbers as transformers, models cached."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import attnviz
from attnviz.errors import InputError

ANIMAL = "The animal didn't cross the street because it was too tired."


def test_weights_equal_transformers_own_output_attentions():
    import torch
    from transformers import AutoModel, AutoTokenizer

    from attnviz.core.models import bundled_model_path

    a = attnviz.attention(ANIMAL, device="cpu")
    path = bundled_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    with torch.inference_mode():
        out = model(**tokenizer(ANIMAL, return_tensors="pt"), output_attentions=True)
    theirs = torch.stack(out.attentions)[:, 0].numpy()  # (L, H, T, T)
    assert a.weights.shape == theirs.shape == (6, 12, 16, 16)
    assert np.abs(a.weights - theirs).max() <= 1e-5
    assert a.tokens == tuple(tokenizer.convert_ids_to_tokens(tokenizer(ANIMAL)["input_ids"]))
    assert np.allclose(a.weights.sum(-1), 1.0, atol=1e-5)
    assert a.special.tolist() == [True] + [False] * 14 + [True]
    assert a.info.n_layers == 6 and a.info.n_heads == 12


def test_views_and_the_model_is_loaded_once(monkeypatch):
    import attnviz.core.models as models

    attnviz.attention("Warm the cache.", device="cpu")
    calls = []
    original = models.load_model
    monkeypatch.setattr(models, "load_model", lambda *a, **k: calls.append(a) or original(*a))
    words = attnviz.attention("Unbelievably, it worked.", words=True, device="cpu")
    hidden = attnviz.attention("Unbelievably, it worked.", hide_special=True, device="cpu")
    assert calls == []  # both served by the cached model
    assert words.unit == "word" and "unbelievably" in [t.lower() for t in words.tokens]
    assert "[CLS]" not in hidden.tokens and np.allclose(hidden.weights.sum(-1), 1, atol=1e-5)


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_methods_return_figures_and_write_nothing(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    monkeypatch.chdir(tmp_path)
    a = attnviz.attention(ANIMAL, device="cpu")
    figures = [a.heatmap(3, 1), a.layer(3), a.layer(0, heads=[2, 5]), a.overview(), a.query("it")]
    assert all(isinstance(f, Figure) for f in figures)
    assert list(tmp_path.iterdir()) == []
    heatmap = figures[0].axes[0].images[0].get_array()
    assert np.allclose(heatmap, a.weights[3, 1])  # the head's own numbers, as in the CLI
    with pytest.raises(InputError, match="layer 6 out of range"):
        a.heatmap(6, 0)


def _shown_page(bundle: dict) -> dict:
    """The page data a notebook's view of an Attention carries (in its frame's srcdoc)."""
    import html
    import json
    import re

    frame = re.fullmatch(
        r'<iframe srcdoc="(.*)" sandbox="allow-scripts" .*', bundle["text/html"], re.S
    )
    page = html.unescape(frame.group(1))
    opening = '<script type="application/json" id="attnviz-data">'
    return json.loads(re.search(re.escape(opening) + r"(.*?)</script>", page, re.S).group(1))


def test_a_notebook_shows_the_recorded_page_once_and_runs_nothing(bundled, monkeypatch):
    """IPython asks a shown object for its mimebundle each time, then for every other
    `_repr_*_` it has: the page is made once, from the recorded weights, no pass runs, and
    nothing else is drawn."""
    import base64
    import zlib

    from attnviz.outputs import html as pages
    from attnviz.pipelines.views import NOTEBOOK_INSIDE

    a = attnviz.attention(ANIMAL, device="cpu")
    passes, built = [], []
    embeddings = bundled.model.base_model.get_input_embeddings()
    handle = embeddings.register_forward_hook(lambda *_: passes.append(1))
    build_page = pages.build_page
    monkeypatch.setattr(pages, "build_page", lambda *x, **k: built.append(1) or build_page(*x, **k))
    try:
        shown = [a._repr_mimebundle_() for _ in range(3)]
    finally:
        handle.remove()
    assert passes == [] and built == [1]
    assert shown[0] == shown[2] and set(shown[0]) == {"text/html", "text/plain"}
    assert [name for name in dir(a) if name.startswith("_repr_")] == ["_repr_mimebundle_"]
    line = "Attention: 6 layers × 12 heads over 16 tokens (all-MiniLM-L6-v2 (bundled))"
    assert shown[0]["text/plain"] == line
    data = _shown_page(shown[0])
    assert data["tokens"] == list(a.tokens) and data["encoding"] == "float32"
    assert data["inside"] is None and data["inside_note"] == NOTEBOOK_INSIDE
    head = np.frombuffer(zlib.decompress(base64.b64decode(data["weights"][3][1])), "float32")
    assert np.array_equal(head, a.weights[3, 1].ravel())  # the recorded numbers themselves


def test_a_long_results_notebook_page_is_pooled_as_shows(bundled, monkeypatch):
    """Past the page's cells, the notebook's page is pooled as `show --html` pools it."""
    import base64
    import zlib

    from attnviz.pipelines import views

    a = attnviz.attention(ANIMAL, device="cpu")
    monkeypatch.setattr(views, "PAGE_CELLS", 6 * 12 * 8 * 8)  # 16 tokens: pooled 2 × 2
    data = _shown_page(a._repr_mimebundle_())
    expected = views.pooled(a, 2, "max")
    assert expected.weights.shape == (6, 12, 8, 8) and data["tokens"] == list(expected.tokens)
    head = np.frombuffer(zlib.decompress(base64.b64decode(data["weights"][5][0])), "float32")
    assert np.array_equal(head, expected.weights[5, 0].ravel())


def test_check_and_report_return_result_objects():
    result = attnviz.check("Birds sing.", layers=[0], device="cpu")
    assert result.passed and result.max_error < 1e-5 and len(result.layers) == 1
    report = attnviz.report(["The cat sat on the mat.", "Birds sing."], device="cpu")
    assert report.sentences == 2 and len(report.roles) == 72
    assert {"layer", "head", "role", "previous"} <= set(report.rows()[0])


def test_import_attnviz_is_light():
    probe = (
        "import sys, attnviz; "
        "print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stderr


# ---------- the models a process keeps ----------


@pytest.fixture
def fresh(monkeypatch):
    """No model kept from an earlier test; each load_model call counted, by model name."""
    import attnviz.core.models as models

    monkeypatch.setattr(models, "_MODELS", {})
    monkeypatch.setattr(models, "_KEPT", models._Kept())
    calls = []
    original = models.load_model
    monkeypatch.setattr(models, "load_model",
                        lambda *a, **k: calls.append(k["name"]) or original(*a, **k))  # fmt: skip
    return calls


def test_settings_that_load_alike_are_one_model(tiny_model_dirs, fresh):
    """On a CPU, device "auto" is "cpu" and dtype "auto" float32: one model, loaded once."""
    folder = str(tiny_model_dirs["bert"])
    first = attnviz.attention("One text.", model=folder)
    second = attnviz.attention("One text.", model=folder, device="cpu", dtype="float32")
    assert fresh == [folder]
    assert first.reader is not second.reader  # two settings as written…
    assert first.reader.load() is second.reader.load()  # …one model in memory
    assert fresh == [folder]


def test_the_models_kept_are_the_last_used_within_the_bound(tiny_model_dirs, fresh, monkeypatch):
    """Past KEEP_BYTES the models used longest ago are let go (freed when nothing holds
    them); one something still holds is found again, not loaded a second time."""
    import gc
    import weakref

    import attnviz.core.models as models

    monkeypatch.setattr(models, "KEEP_BYTES", 0)  # the newest alone
    bert, gpt2 = (str(tiny_model_dirs[arch]) for arch in ("bert", "gpt2"))
    held = models.model(bert, "cpu").load()
    gone = weakref.ref(models.model(gpt2, "cpu").load().model)
    assert list(key.model for key in models._KEPT.recent) == [gpt2]  # bert let go, but held
    assert models.model(bert, "cpu").load() is held  # found again: not loaded twice
    gc.collect()
    assert gone() is None  # gpt2, held by nothing, was freed
    assert fresh == [bert, gpt2]


def test_unload_lets_the_models_go(tiny_model_dirs, fresh):
    import gc
    import weakref

    import attnviz.core.models as models

    folder = str(tiny_model_dirs["gpt2"])
    a = attnviz.attention("Free me.", model=folder, device="cpu")
    attnviz.attention("Free me.", device="cpu")  # the bundled one
    weights = weakref.ref(models.model(folder, "cpu").load().model)
    assert attnviz.unload("not loaded") == 0
    assert attnviz.unload(folder) == 1 and [k.model for k in models._KEPT.recent] == [None]
    gc.collect()
    assert weights() is None  # the result `a` does not hold the model's weights
    assert a.weights.shape[0] == 2 and a.reader is not None
    assert attnviz.unload() == 1 and models._KEPT.recent == {}
    attnviz.attention("Free me.", model=folder, device="cpu")  # loaded again on demand
    assert fresh == [folder, None, folder]
