"""How a model is loaded (`Load`: device, attention, dtype, placement, quantisation) and the
checks of those settings before anything loads (`Load.refuse`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attnviz.errors import InputError

if TYPE_CHECKING:
    from attnviz.core.model_info import ModelSpec


def resolve_device(device: str) -> str:
    """Turn auto|cpu|cuda into a torch device name, checking that CUDA exists when asked for."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available here; use --device cpu")
    return device


DEVICES = ("auto", "cpu", "cuda")
IMPLEMENTATIONS = ("sdpa", "flash_attention_2", "eager")
DTYPES = ("auto", "float32", "bfloat16", "float16")
HALF = ("bfloat16", "float16")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEVICE_MAPS = ("auto", "balanced", "sequential")
QUANTIZATIONS = ("4bit", "8bit")
FLASH = "flash_attention_2"
# --max-memory sizes as accelerate writes them: 20GiB (2^30 bytes), 150MB (10^6), 4096 (bytes)
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMGT]i?B|B)?", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip


@dataclass(frozen=True)
class Load:
    """How a model is loaded: its name (None: the bundled one), device and attention
    implementation (--attention), the dtype of its weights, and where accelerate puts its
    layers.

    `dtype` "auto" is the checkpoint's own on a GPU and float32 on a CPU. `device_map` (auto,
    balanced or sequential) lets accelerate spread the layers over the GPUs, the CPU and the
    disk, within `max_memory` ("DEVICE=SIZE" each: "0=20GiB", "cpu=60GiB"); what fits nowhere
    is read from `offload_folder` (or from the checkpoint's own safetensors files) as each
    layer runs. `quantize` loads the weights in 4 or 8 bits with bitsandbytes (CUDA only).
    `refuse()` says, before anything loads, what cannot work on this machine.
    """

    model: str | None = None
    device: str = "auto"
    implementation: str = "sdpa"  # --attention: sdpa, flash_attention_2 or eager
    dtype: str = "auto"
    device_map: str | None = None
    max_memory: tuple[str, ...] = ()
    offload_folder: str | None = None
    quantize: str | None = None

    def memory(self) -> dict[int | str, int]:
        """`max_memory` as accelerate takes it: {GPU index or "cpu": bytes}; one line for a
        value that is not DEVICE=SIZE."""
        found: dict[int | str, int] = {}
        for given in self.max_memory:
            device, _, size = given.partition("=")
            device = device.strip().lower()
            key: int | str = int(device) if device.isdigit() else device
            sized = _SIZE.fullmatch(size.strip())
            if sized is None or key != "cpu" and not isinstance(key, int):
                raise InputError(
                    f"--max-memory {given}: give DEVICE=SIZE, DEVICE a GPU's index (0, 1, …) "
                    "or cpu, SIZE as 20GiB, 150MB or a number of bytes"
                )
            if key in found:
                raise InputError(f"--max-memory gives {device} twice")
            found[key] = int(float(sized[1]) * _UNITS[(sized[2] or "B").upper()])
        return found

    def weights_held(self, spec: ModelSpec, gpu: bool | None = None) -> int:
        """The bytes of the model's weights this process's memory will hold (`spec`, its
        files). None where they go to a GPU (`gpu`: whether the device is one, which "auto"
        cannot say without torch; None: "cuda" is): the model loads straight onto it, and
        bitsandbytes packs them there. Else their size in the dtype they load in (auto: the
        checkpoint's own on a GPU, float32 on a CPU), and with a device map at most
        --max-memory cpu=… (the rest on the disk or a GPU)."""
        gpu = self.device.startswith("cuda") if gpu is None else gpu
        if self.quantize is not None or gpu and self.device_map is None:
            return 0
        own = spec.weights_dtype if spec.weights_dtype in DTYPE_BYTES else "float32"
        saved = DTYPE_BYTES[own]  # unknown: float32, as guessed
        loaded = DTYPE_BYTES[self.dtype if self.dtype != "auto" else own if gpu else "float32"]
        held = spec.weights_bytes * loaded // saved
        cpu = self.memory().get("cpu") if self.device_map is not None else None
        return held if cpu is None else min(held, cpu)

    def refuse(self) -> None:
        """One InputError for the first setting that cannot work here, before anything loads:
        a value that is not a choice, a malformed --max-memory, placement options without
        --device-map, and what this machine cannot run (a half-precision dtype its device
        cannot compute in, bitsandbytes or flash-attention without CUDA or not installed).
        Torch is imported only for the settings that need to ask it."""
        device = "cuda" if re.fullmatch(r"cuda:\d+", self.device) else self.device  # cuda:1
        for option, value, choices in (
            ("--device", device, DEVICES),
            ("--attention", self.implementation, IMPLEMENTATIONS),
            ("--dtype", self.dtype, DTYPES),
            ("--device-map", self.device_map, (None, *DEVICE_MAPS)),
            ("--quantize", self.quantize, (None, *QUANTIZATIONS)),
        ):
            if value not in choices:
                known = ", ".join(c for c in choices if c is not None)
                raise InputError(f"{option} '{value}' is not one of: {known}")
        memory = self.memory()
        if self.device_map is None and (memory or self.offload_folder is not None):
            raise InputError(
                "--max-memory and --offload-folder say where --device-map puts the layers: "
                "add --device-map auto"
            )
        if self.offload_folder is not None and Path(self.offload_folder).is_file():
            raise InputError(f"--offload-folder {self.offload_folder} is a file, not a folder")
        if self.implementation == FLASH and self.dtype == "float32":
            raise InputError(
                f"--attention {FLASH} computes in float16 or bfloat16: add --dtype bfloat16"
            )
        gpus = [key for key in memory if isinstance(key, int)]
        asks_torch = self.dtype in HALF or self.quantize or self.implementation == FLASH or gpus
        if asks_torch or self.device == "cuda":
            self._refuse_here(gpus)

    def _refuse_here(self, gpus: list[int]) -> None:
        """What `refuse` needs torch for: what this machine's devices can run."""
        import importlib.util

        import torch

        device = resolve_device(self.device)  # --device cuda without CUDA: refused here
        cuda = device.startswith("cuda")
        for gpu in gpus:
            if self.device == "cpu":
                raise InputError(f"--max-memory {gpu}=…: --device cpu puts no layer on a GPU")
            if not cuda or gpu >= torch.cuda.device_count():
                there = f"0–{torch.cuda.device_count() - 1}" if cuda else "none"
                raise InputError(
                    f"--max-memory {gpu}=…: there is no GPU {gpu} here (GPUs: {there})"
                )
        if self.quantize is not None:
            if not cuda:
                raise InputError(
                    f"--quantize {self.quantize}: bitsandbytes quantises on CUDA GPUs only, "
                    "and this run has none; --dtype bfloat16 halves the memory instead"
                )
            if importlib.util.find_spec("bitsandbytes") is None:
                raise InputError(
                    f"--quantize {self.quantize} needs bitsandbytes: pip install bitsandbytes"
                )
        if self.implementation == FLASH:
            if importlib.util.find_spec("flash_attn") is None:
                raise InputError(
                    f"--attention {FLASH}: flash-attn is not installed (pip install flash-attn, "
                    "on a CUDA machine); --attention sdpa is the fast attention without it"
                )
            if not cuda:
                raise InputError(f"--attention {FLASH} runs on CUDA GPUs only; use sdpa")
        if self.dtype in HALF and not computes_in(self.dtype, device):
            other = "float16" if self.dtype == "bfloat16" else "float32"
            raise InputError(
                f"--dtype {self.dtype}: this {'GPU' if cuda else 'CPU'} cannot compute in "
                f"{self.dtype}{' (it needs an Ampere GPU or later)' if cuda else ''}; "
                f"use --dtype {other}"
            )


def computes_in(dtype: str, device: str) -> bool:
    """Whether `device` runs matrix products and softmax in `dtype` (a GPU older than Ampere
    has no bfloat16; an old torch has no float16 on the CPU)."""
    import torch

    kind = getattr(torch, dtype)
    if device.startswith("cuda") and kind is torch.bfloat16:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    try:
        square = torch.ones(2, 2, dtype=kind, device=device)
        (square @ square).softmax(dim=-1)
    except (RuntimeError, TypeError):
        return False
    return True
