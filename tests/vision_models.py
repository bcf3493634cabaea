"""Tiny random vision transformers saved with an image processor, for tests: ViT, DeiT (a
distillation token), DINOv2 without and with 4 registers, BEiT, CLIP's vision tower alone and
CLIP and SigLIP checkpoints of both towers (read through their vision towers; SigLIP has no
CLS).
No pretrained vision weights are reachable here; these are random, their weights drawn with
std SPREAD so that rows are far from uniform.

- TYPES: model type → (config overrides, the processor's class and its settings).
- save(model_type, folder): the model and its processor in `folder`.
- PREFIX: the labels of each type's tokens before the patches.
- eager(folder, model_type, path): the model's own probabilities for a picture.
"""

from __future__ import annotations

from pathlib import Path

SPREAD = 0.3
_VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            image_size=32, patch_size=8)  # fmt: skip
_SQUARE = {"size": {"height": 32, "width": 32}}
# A checkpoint of a text and a vision tower (CLIP, SigLIP): attnviz reads the vision tower.
_TWO_TOWERS = {"vision_config": _VIT, "text_config": dict(vocab_size=64, hidden_size=32,
               num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)}  # fmt: skip
_CROP = {"size": {"shortest_edge": 36}, "crop_size": {"height": 32, "width": 32}}
TYPES = {
    "vit": (_VIT, "ViTImageProcessor", _SQUARE),
    "deit": (_VIT, "ViTImageProcessor", _SQUARE),
    "dinov2": (_VIT, "BitImageProcessor", _CROP),
    "dinov2_with_registers": ({**_VIT, "num_register_tokens": 4}, "BitImageProcessor", _CROP),
    "clip_vision_model": (_VIT, "CLIPImageProcessor", _CROP),
    "clip": (_TWO_TOWERS, "CLIPImageProcessor", _CROP),
    "beit": (_VIT, "BeitImageProcessorPil", {**_SQUARE, "do_center_crop": False}),
    "siglip": (_TWO_TOWERS, "SiglipImageProcessor", _SQUARE),  # no CLS: it pools otherwise
}
PREFIX = {
    "vit": ["CLS"],
    "deit": ["CLS", "dist"],
    "dinov2": ["CLS"],
    "dinov2_with_registers": ["CLS", "reg0", "reg1", "reg2", "reg3"],
    "clip_vision_model": ["CLS"],
    "clip": ["CLS"],
    "beit": ["CLS"],
    "siglip": [],
}


def save(model_type: str, folder: Path) -> Path:
    """A tiny random `model_type` and its image processor, saved in `folder`."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModel

    overrides, processor, settings = TYPES[model_type]
    config = AutoConfig.for_model(model_type, **overrides)
    torch.manual_seed(0)
    model = AutoModel.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, SPREAD)
    model.save_pretrained(folder)
    getattr(transformers, processor)(**settings).save_pretrained(folder)
    return folder


def picture(path: Path, size: tuple[int, int] = (64, 48), seed: int = 0) -> Path:
    """A random RGB picture of `size` (width, height), saved as PNG at `path`."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def eager(folder: Path, model_type: str, path: Path):
    """The model's own probabilities (eager `output_attentions`), (L, H, T, T) float32, for
    the picture at `path` as its processor prepares it: what attnviz's numbers are held to."""
    import torch
    import transformers
    from PIL import Image
    from transformers import AutoImageProcessor

    from attnviz.core.images import VISION_TOWERS

    loader = getattr(transformers, VISION_TOWERS.get(model_type, "AutoModel"))
    model = loader.from_pretrained(folder, attn_implementation="eager").eval()
    processor = AutoImageProcessor.from_pretrained(folder)
    with Image.open(path) as image:
        pixels = processor(images=image.convert("RGB"), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        found = model(pixel_values=pixels, output_attentions=True).attentions
    return torch.stack(found)[:, 0].numpy()
