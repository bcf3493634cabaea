"""Any size: half precision, accelerate's device map and disk offload, and the load settings
refused before anything loads.

Half precision: a bfloat16 or float16 model of every family computes in its dtype, and the
probabilities attnviz shows are made in float32 from the q and k the model hands its attention
(upcast): they equal a float64 softmax of the same q and k within float32's rounding, and their
rows sum to 1. `check` holds the model's own probabilities, rounded in its
dtype, to that dtype's tolerance, which float32's would not be.

Offload: a tiny Llama and a tiny BERT with a layer on the disk (its weights on "meta" outside
its forward) give the attention, --measure norm, head ablation and the inside view of the same
model in memory.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.analysis.check import DEFAULT_TOLERANCE, TOLERANCES
from attnviz.cli import app
from attnviz.core import capture, families, layer_map
from attnviz.core.models import load_model
from attnviz.core.seq2seq import encode_source_target, pad_pairs
from attnviz.core.tokens import encode, pad
from tests.conftest import ARCHITECTURES

HALF = ("bfloat16", "float16")
TEXTS = ("The cat sat on the mat because it was tired of standing.", "A dog.")
PAIRS = [("The cat sat on the mat.", "Die Katze sass auf der Matte."), ("Hi.", "Hallo du da.")]
# float32 against float64 from the same q and k: what is left is float32's own rounding.
# (Probabilities in the model's dtype would be off by 1e-3 and more.)
RECORDED = 1e-5


def _sharpened(loaded):
    """`loaded` with its attention modules' weights times 4 (exact in any dtype): scores 16
    times larger. A tiny random model's scores (about 0.01) are so small that probabilities
    made in half precision would pass for float32; these would not (every case fails so)."""

    import torch

    modules = {id(m.attention): m.attention
               for stack in layer_map.stacks_of(loaded.model)
               for layer in range(layer_map.n_layers(loaded.model, stack))
               for m in [layer_map.layer_modules(loaded.model, layer, stack)]}  # fmt: skip
    with torch.no_grad():
        for module in modules.values():
            for parameter in module.parameters():
                parameter.mul_(4)
    return loaded


def _spied(monkeypatch):
    """Each wanted layer's call of attnviz's attention function, in order: the model's own
    q, k and mask as it handed them over, and the probabilities the function gave out."""
    from attnviz.core import recording

    calls: list = []
    real = recording.in_blocks

    def spy(scores, value, block_rows=recording.BLOCK_ROWS, take=None, entropy=False,
            asked=None):  # fmt: skip
        given: list = []

        def keep(start, rows, entropies, *found):
            given.append((start, rows))
            take(start, rows, entropies, *found)

        if take is not None:
            calls.append((scores.query, scores.key, scores.mask, scores.scaling, scores.causal,
                          scores.position_bias, given))  # fmt: skip
        return real(scores, value, block_rows, keep if take is not None else None, entropy,
                    asked)  # fmt: skip

    monkeypatch.setattr(recording, "in_blocks", spy)
    return calls


def _float64(query, key, mask, scaling, causal, bias):
    """softmax(q·kᵀ × scale + bias, masked) in float64 from the model's own q and k: a
    key head serves its query heads; a row that sees no key is 0."""
    import torch

    q, k = query.double(), key.double()
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scaling is None else scaling)
    if bias is not None:
        scores = scores + bias.double()
    sees = torch.ones(scores.shape[-2:], dtype=torch.bool).tril_() if causal else None
    if mask is not None:
        sees = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    if sees is not None:
        scores = scores.masked_fill(~sees, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return probs, sees


def _recorded_error(calls) -> float:
    """The largest |recorded − float64| over every call's real rows, and a check that each
    real row sums to 1."""
    import torch

    worst = 0.0
    for query, key, mask, scaling, causal, bias, given in calls:
        exact, sees = _float64(query, key, mask, scaling, causal, bias)
        for start, rows in given:
            part = exact[:, :, start : start + rows.shape[2], : rows.shape[3]]
            worst = max(worst, float((rows.double() - part).abs().max()))
            real = sees.any(dim=-1) if sees is not None else torch.ones(1, 1, 1, dtype=bool)
            sums = rows.sum(dim=-1)
            seen = real[:, :, start : start + rows.shape[2]].expand_as(sums)
            assert torch.allclose(sums[seen], torch.ones(()), atol=1e-5)
    return worst


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_half_precision_probabilities_are_float32_from_the_models_q_and_k(
    arch, dtype, tiny_model_dirs, monkeypatch
):
    """A half-precision model hands its attention its own q and k in its dtype; attnviz
    records the probabilities in float32 from them, rows summing to 1."""
    import torch

    loaded = _sharpened(load_model(str(tiny_model_dirs[arch]), "cpu", dtype=dtype))
    assert loaded.info.dtype == dtype
    assert next(loaded.model.parameters()).dtype == getattr(torch, dtype)
    inputs = pad(loaded, [encode(loaded, text) for text in TEXTS])
    layers = range(loaded.info.n_layers)
    seen: dict = {}
    calls = _spied(monkeypatch)
    capture.run(loaded, inputs, [capture.Each(layers, ("probs",), seen.__setitem__)])
    assert len(calls) == loaded.info.n_layers
    assert all(query.dtype == getattr(torch, dtype) for query, *_ in calls)
    assert all(seen[layer]["probs"].dtype == torch.float32 for layer in layers)
    if arch != "gemma2":  # soft-capped: the float64 formula here has no cap
        assert _recorded_error(calls) <= RECORDED


@pytest.mark.parametrize("dtype", HALF)
def test_eager_half_precision_probabilities_come_as_float32(dtype, tiny_model_dirs):
    """Eager attention (`--attention eager`): the probabilities are the model's own, rounded
    in its dtype, and come to recorders (whole, and in blocks of rows) as float32."""
    import torch

    from attnviz.core.capture import ROWS

    loaded = load_model(str(tiny_model_dirs["gemma2"]), "cpu", "eager", dtype=dtype)
    assert not capture.records(loaded.model)
    inputs = pad(loaded, [encode(loaded, text) for text in TEXTS])
    seen: dict = {}
    blocks: list = []

    class Rows:
        wants = {0: (ROWS,)}

        def receive(self, layer, tensors):
            pass

        def receive_rows(self, layer, start, rows):
            blocks.append(rows)

    capture.run(loaded, inputs, [capture.Each([0], ("probs",), seen.__setitem__), Rows()])
    assert seen[0]["probs"].dtype == torch.float32
    assert blocks and all(rows.dtype == torch.float32 for rows in blocks)
    real = inputs["attention_mask"].bool()[:, None, :].expand(-1, loaded.info.n_heads, -1)
    sums = seen[0]["probs"].sum(dim=-1)[real]
    assert torch.allclose(sums, torch.ones(()), atol=TOLERANCES[dtype][0])


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_half_precision_stacks_are_float32_from_the_models_q_and_k(
    arch, dtype, seq2seq_dirs, monkeypatch
):
    """Encoder, decoder (causal) and cross-attention (keys from the encoder's states)."""
    import torch

    loaded = _sharpened(load_model(str(seq2seq_dirs[arch]), "cpu", dtype=dtype))
    inputs = pad_pairs(loaded, [encode_source_target(loaded, s, t) for s, t in PAIRS])
    stacks = ("encoder", "decoder", "cross")
    seen: dict = {stack: {} for stack in stacks}
    recorders = [
        capture.Each(range(loaded.info.of_stack(stack).n_layers), ("probs",),
                     seen[stack].__setitem__, stack=stack)
        for stack in stacks
    ]  # fmt: skip
    calls = _spied(monkeypatch)
    capture.run(loaded, inputs, recorders)
    assert len(calls) == sum(loaded.info.of_stack(stack).n_layers for stack in stacks)
    assert all(got["probs"].dtype == torch.float32 for s in stacks for got in seen[s].values())
    assert _recorded_error(calls) <= RECORDED


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama", "t5"])
def test_check_holds_a_half_precision_model_to_its_dtypes_tolerance(
    arch, dtype, tiny_model_dirs, seq2seq_dirs
):
    """The model's own probabilities are rounded in its dtype: check passes at the dtype's
    tolerance, and the errors are past float32's (which it would fail)."""
    from attnviz import check

    folder = {**tiny_model_dirs, **seq2seq_dirs}[arch]
    target = {"target": PAIRS[0][1]} if arch == "t5" else {}
    result = check(TEXTS[0], model=str(folder), device="cpu", dtype=dtype, **target)
    assert result.info.dtype == dtype
    assert result.tolerance == TOLERANCES[dtype][0]
    assert result.passed, result.max_error
    assert result.max_error > DEFAULT_TOLERANCE


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_check_still_fails_a_wrong_head_at_a_half_precision_tolerance(
    arch, dtype, tiny_model_dirs, monkeypatch
):
    """The dtype's looser tolerance still catches a head the from-scratch attention gets
    wrong (head 2's W_Q of layer 1 off), on that head alone."""
    from dataclasses import replace

    import torch

    from attnviz import check

    layer_weights = families.layer_weights

    def wrong_head(model, layer, stack=None):
        weights = layer_weights(model, layer, stack)
        d_k = weights.w_q.shape[1] // weights.n_heads
        w_q = weights.w_q.clone()
        generator = torch.Generator().manual_seed(0)
        w_q[:, 2 * d_k : 3 * d_k] += 4 * torch.randn(w_q.shape[0], d_k, generator=generator)
        return replace(weights, w_q=w_q)

    monkeypatch.setattr(families, "layer_weights", wrong_head)
    folder = str(tiny_model_dirs[arch])
    result = check(TEXTS[0], model=folder, device="cpu", dtype=dtype, layers=[1])
    assert result.tolerance == TOLERANCES[dtype][0] and not result.passed
    (found,) = result.layers
    assert found.failing_heads(result.tolerance) == [2], found.head_errors
    assert max(found.head_errors) > 4 * result.tolerance  # well past it, not at its edge


def test_check_says_its_tolerance_and_why(tiny_model_dirs):
    folder = str(tiny_model_dirs["bert"])
    half = CliRunner().invoke(app, ["check", TEXTS[0], "-m", folder, "--dtype", "bfloat16"])
    assert half.exit_code == 0, half.output
    said = " ".join(half.output.split())
    assert f"tolerance 5e-02 in bfloat16: {TOLERANCES['bfloat16'][1]}" in said
    assert "the model in bfloat16, ours in float64" in said
    given = CliRunner().invoke(app, ["check", TEXTS[0], "-m", folder, "--tolerance", "1e-3"])
    assert given.exit_code == 0 and "in float32:" not in given.output  # not the dtype's own


# ---------- accelerate's device map, part of the model on the disk ----------

# Per model, a CPU budget that keeps the embeddings and layer 0 in memory and sends layer 1 to
# the disk (the tiny models of conftest; the test checks that it does).
BUDGETS = {"llama": "125KB", "bert": "3975KB"}
TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def offloaded(tiny_model_dirs, tmp_path_factory):
    """Per architecture: the load settings that put part of it on the disk."""
    folder = tmp_path_factory.mktemp("offload")
    return {
        arch: dict(device_map="auto", max_memory={"cpu": budget}, offload_folder=folder / arch)
        for arch, budget in BUDGETS.items()
    }


def _on_disk(loaded) -> None:
    """The premise: some of the model in memory, a layer with its weights on the disk."""
    placed = dict(loaded.info.device_map)
    assert "cpu" in placed.values() and "disk" in placed.values(), placed
    on_disk = [part for part, device in placed.items() if device == "disk" and ".1" in part]
    assert on_disk, placed  # layer 1
    first = layer_map.layer_modules(loaded.model, 1).q
    assert first.weight.device.type == "meta"  # outside its forward, accelerate keeps none


@pytest.mark.parametrize("arch", list(BUDGETS))
@pytest.mark.parametrize("measure", ["weights", "norm"])
def test_offloaded_attention_equals_in_memory(arch, measure, tiny_model_dirs, offloaded):
    import attnviz

    folder = str(tiny_model_dirs[arch])
    memory = attnviz.attention(TEXT, model=folder, device="cpu", measure=measure)
    disk = attnviz.attention(TEXT, model=folder, device="cpu", measure=measure,
                             **offloaded[arch])  # fmt: skip
    _on_disk(disk.reader.load())
    assert disk.info.device_map and not memory.info.device_map
    assert np.abs(disk.weights - memory.weights).max() <= 1e-6
    assert np.allclose(memory.weights.sum(axis=-1), 1.0, atol=1e-5) or measure == "norm"


@pytest.mark.parametrize("arch", list(BUDGETS))
def test_offloaded_ablation_and_inside_view_equal_in_memory(arch, tiny_model_dirs, offloaded):
    """Head importance by ablation (the ablated copies start at their layer, above stubbed
    blocks), show --ablate's pass with one head removed, and the page's inside view."""
    import attnviz
    from attnviz.analysis.ablation import ablated_pass
    from attnviz.core import models
    from attnviz.core.settings import Load
    from tests.inside_steps import inside_of

    folder = str(tiny_model_dirs[arch])
    settings = {**offloaded[arch], "max_memory": (f"cpu={BUDGETS[arch]}",)}
    memory = models.get(Load(folder, "cpu")).load()
    disk = models.get(Load(folder, "cpu", **settings)).load()
    _on_disk(disk)
    texts = [TEXT, "A dog slept."]
    scores = [attnviz.importance(texts, model=folder, device="cpu", **s).scores
              for s in ({}, offloaded[arch])]  # fmt: skip
    assert np.isfinite(scores[0]).all() and np.abs(scores[1] - scores[0]).max() <= 1e-6
    removed = [
        ablated_pass(loaded, encode(loaded, TEXT), [(1, 0), (0, 2)]) for loaded in (memory, disk)
    ]
    assert removed[0].as_dict() == removed[1].as_dict()
    inside = [inside_of(loaded, encode(loaded, TEXT)) for loaded in (memory, disk)]
    for name in ("q", "k", "v", "errors"):
        assert np.abs(getattr(inside[1], name) - getattr(inside[0], name)).max() <= 1e-6, name
    assert inside[1].errors.max() <= 1e-5  # the from-scratch heads equal the model's own


def test_the_header_and_json_say_what_ran(tiny_model_dirs, offloaded, tmp_path):
    import json

    folder = str(tiny_model_dirs["llama"])
    placed = ["--device-map", "auto", "--max-memory", f"cpu={BUDGETS['llama']}",
              "--offload-folder", str(tmp_path / "offload")]  # fmt: skip
    runs = {
        "plain": ["--dtype", "float32"],
        "half": ["--dtype", "bfloat16", "--attention", "eager"],
        "placed": placed,
    }
    said = {}
    for name, options in runs.items():
        args = ["show", TEXT, "-m", folder, "--no-images", *options]
        printed = CliRunner().invoke(app, args)
        given = CliRunner().invoke(app, [*args, "--json"])
        assert printed.exit_code == 0 and given.exit_code == 0, printed.output + given.output
        said[name] = (" ".join(printed.output.split()), json.loads(given.output))  # unwrapped
    header, found = said["plain"]
    assert re.search(r"d_head 8 · float32 · sdpa \d+ tokens", header)  # the line's end
    assert (found["dtype"], found["attention"], found["device_map"]) == ("float32", "sdpa", None)
    assert not {"dtype", "attention", "device_map"} & set(found["model"])  # at the top only
    header, found = said["half"]
    assert re.search(r"d_head 8 · bfloat16 · eager \d+ tokens", header)
    assert found["dtype"] == "bfloat16"
    header, found = said["placed"]
    devices = list(found["device_map"].values())
    assert "disk" in devices
    counts = f"{devices.count('cpu')} cpu, {devices.count('disk')} disk"
    assert re.search(rf"d_head 8 · float32 · sdpa · device map: {counts} \d+ tokens", header)


def test_the_memory_estimate_counts_the_weights_as_they_load():
    """What `core.memory` counts of the weights before they load: their files in the dtype
    they load in (a CPU's auto is float32), at most --max-memory cpu=… with a device map."""
    from attnviz.core.model_info import ModelSpec
    from attnviz.core.settings import Load

    saved = {dtype: ModelSpec("m", 2, 4, None, None, weights_bytes=6000, weights_dtype=dtype)
             for dtype in ("float32", "bfloat16")}  # fmt: skip
    assert Load().weights_held(saved["float32"]) == 6000
    assert Load(dtype="bfloat16").weights_held(saved["float32"]) == 3000
    assert Load().weights_held(saved["bfloat16"]) == 12000  # upcast on a CPU
    assert Load(dtype="float16").weights_held(saved["bfloat16"]) == 6000
    placed = Load(device_map="auto", max_memory=("cpu=2KB",))
    assert placed.weights_held(saved["float32"]) == 2000  # the rest on the disk
    assert Load(device_map="auto").weights_held(saved["float32"]) == 6000


def test_weights_bound_for_a_gpu_are_not_counted_in_this_machines_memory(monkeypatch):
    """A 16 GiB bfloat16 checkpoint with --device cuda (a GPU faked) is not refused as 32 GiB
    of this machine's memory: its weights load straight onto the GPU. Device auto finds the
    GPU too (torch asked only when the count without it would refuse); on a CPU the same
    checkpoint is refused, upcast to float32."""
    from dataclasses import replace

    import torch

    from attnviz.core import memory, models
    from attnviz.core.settings import Load
    from attnviz.errors import MemoryLimitError

    gib = 2**30
    spec = replace(models.describe(None), weights_bytes=16 * gib, weights_dtype="bfloat16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(memory.ENV, "20GiB")
    asked, text = memory.Asked(), ["The cat sat on the mat."]
    for device in ("cuda", "auto"):
        memory.refuse(spec, Load(device=device), text, asked)  # fits: nothing raised
    with pytest.raises(MemoryLimitError, match=r"needs about 32\.\d\d GiB of memory"):
        memory.refuse(spec, Load(device="cpu"), text, asked)
    assert Load(device="cuda").weights_held(spec) == Load().weights_held(spec, gpu=True) == 0
    assert Load(quantize="4bit").weights_held(spec) == 0  # packed on the GPU
    placed = Load(device="cuda", device_map="auto", max_memory=("cpu=20GiB",))
    assert placed.weights_held(spec) == 16 * gib  # on the host as far as it may: in bfloat16


def test_weights_bound_for_a_gpu_load_straight_onto_it(tiny_model_dirs, monkeypatch):
    """from_pretrained runs under a `torch.device` context naming the GPU (transformers then
    puts each weight there as it reads it), and under none for a CPU or a device map."""
    import torch
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext

    from attnviz.core import models

    class Loaded(Exception):
        """Stops load_model once from_pretrained is reached: no GPU here to go on with."""

    found = []
    tokenizer = models._from_pretrained

    def loading(loader, source, **kwargs):
        if "attn_implementation" not in kwargs:  # the tokenizer
            return tokenizer(loader, source, **kwargs)
        stack = _get_current_function_mode_stack()
        found.append([str(m.device) for m in stack if isinstance(m, DeviceContext)])
        raise Loaded

    monkeypatch.setattr(models, "_from_pretrained", loading)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    folder = str(tiny_model_dirs["llama"])
    for device, placed in (("cuda", {}), ("cpu", {}), ("cuda", {"device_map": "auto"})):
        with pytest.raises(Loaded):
            load_model(folder, device, **placed)
    assert found == [["cuda"], [], []]


# ---------- bad load settings: one line, exit 2, before anything loads ----------


@pytest.fixture
def no_load(monkeypatch):
    from attnviz.core import models

    def refuse(*_args, **_kwargs):
        raise AssertionError("the model must not load with a setting that cannot work")

    monkeypatch.setattr(models, "load_model", refuse)


@pytest.fixture
def old_gpu(monkeypatch):
    """A CUDA machine with one GPU older than Ampere (no bfloat16), as torch sees it."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)


def _refused(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    return result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["show", "hi", "--dtype", "float8"], "'float8' is not one of 'auto', 'float32'"),
        (["check", "hi", "--dtype", "half"], "'half' is not one of 'auto', 'float32'"),
        (["show", "hi", "--device-map", "auto", "--max-memory", "cpu150MB"], "give DEVICE=SIZE"),
        (["export", "hi", "--device-map", "auto", "--max-memory", "cpu=lots"], "give DEVICE=SIZE"),
        (
            [
                "show",
                "hi",
                "--device-map",
                "auto",
                "--max-memory",
                "cpu=1GB",
                "--max-memory",
                "cpu=2GB",
            ],
            "--max-memory gives cpu twice",
        ),  # fmt: skip
        (["show", "hi", "--max-memory", "cpu=1GB"], "add --device-map auto"),
        (["check", "hi", "--offload-folder", "/tmp"], "add --device-map auto"),
        (["show", "hi", "--device-map", "auto", "--max-memory", "0=20GiB"], "no GPU 0 here"),
        (["show", "hi", "--quantize", "4bit"], "bitsandbytes quantises on CUDA GPUs only"),
        (["check", "hi", "--quantize", "8bit"], "bitsandbytes quantises on CUDA GPUs only"),
        (["show", "hi", "--attention", "flash_attention_2"], "flash-attn is not installed"),
        (
            ["show", "hi", "--attention", "flash_attention_2", "--dtype", "float32"],
            "computes in float16 or bfloat16: add --dtype bfloat16",
        ),  # fmt: skip
    ],
)
def test_bad_load_settings_are_refused_before_loading(args, message, no_load):
    output = " ".join(_refused(*args).split())
    assert message in output


def test_a_half_precision_dtype_the_device_cannot_run_is_refused(no_load, old_gpu):
    output = " ".join(_refused("show", "hi", "--dtype", "bfloat16").split())
    assert "this GPU cannot compute in bfloat16" in output and "use --dtype float16" in output
    said = " ".join(_refused("show", "hi", "--device", "cpu", "--dtype", "float8").split())
    assert "'float8' is not one of" in said


def test_quantize_without_bitsandbytes_is_refused_on_a_gpu(no_load, old_gpu):
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is not None:
        pytest.skip("bitsandbytes is installed here")
    output = " ".join(_refused("show", "hi", "--quantize", "4bit").split())
    assert "--quantize 4bit needs bitsandbytes: pip install bitsandbytes" in output


def test_the_api_refuses_alike():
    import attnviz
    from attnviz.errors import InputError

    with pytest.raises(InputError, match="--dtype 'float8' is not one of"):
        attnviz.attention("hi", dtype="float8")
    with pytest.raises(InputError, match="give DEVICE=SIZE"):
        attnviz.check("hi", device_map="auto", max_memory={"cpu": "a lot"})
    with pytest.raises(InputError, match="not one of: auto, balanced, sequential"):
        attnviz.importance("hi", device_map="everywhere")
