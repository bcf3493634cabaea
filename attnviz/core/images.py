"""Pictures in: a vision transformer's image, prepared by the model's own image processor, as
tokens (`Encoded` with a `Picture`): the CLS token, DeiT's distillation token, registers,
then the patches row by row, labelled `CLS`, `dist`, `reg0`…, `(row, col)`.

Which models read pictures is said from config.json alone (`reads_pictures`): a patch size,
an image size and a number of channels (ViT, DeiT, DINOv2, BEiT, the vision towers of CLIP
and SigLIP); a checkpoint of both towers (CLIP, SigLIP) is read through its vision tower.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.core.attention import Encoded, Picture
from attnviz.errors import InputError

SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
# Checkpoints of a text and a vision tower: the class that loads the vision tower alone.
VISION_TOWERS = {"clip": "CLIPVisionModel", "siglip": "SiglipVisionModel"}


def looks_like_picture(given: Any) -> bool:
    """Whether `given` is a picture to read: a PIL image, or a file named as an image is
    (one line where no such file is: `picture_argument`)."""
    if hasattr(given, "convert") and hasattr(given, "size"):  # a PIL image
        return True
    return isinstance(given, (str, Path)) and picture_argument(str(given)) is not None


def picture_argument(argument: str) -> Path | None:
    """The picture a command-line argument names (an existing file named as an image is),
    or None for a text; one line for an image's name where no file is."""
    path = Path(argument)
    if "\n" in argument or path.suffix.lower() not in SUFFIXES or " " in path.name:
        return None
    if not path.is_file():
        raise InputError(f"no picture at {argument}: no such file")
    return path


@dataclass(frozen=True)
class Pictures:
    """The pictures a command reads (`pictures_in`): their files in order, and the files of
    the folders given that are not named as pictures (skipped, and said)."""

    paths: tuple[Path, ...]
    skipped: tuple[Path, ...] = ()
    folders: tuple[Path, ...] = ()  # sub-folders of the folders given: not entered

    def note(self) -> str | None:
        """The one line that says what was skipped, or None."""
        said = []
        if self.skipped:
            ends = ", ".join(SUFFIXES)
            said.append(f"{len(self.skipped)} file(s) not named as pictures "
                        f"({_some(self.skipped)}; pictures end in {ends})")  # fmt: skip
        if self.folders:
            said.append(f"{len(self.folders)} sub-folder(s), not entered ({_some(self.folders)})")
        return f"skipped {' and '.join(said)}" if said else None


def _some(paths: tuple[Path, ...]) -> str:
    names = ", ".join(path.name for path in paths[:3])
    return names + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def pictures_in(arguments: list[str]) -> Pictures | None:
    """The pictures that command-line `arguments` name: picture files, and folders (their
    files named as pictures, by name; sub-folders are not entered). None where no argument
    names a picture or a folder (they are texts); one line where some do and others do not,
    or a folder holds no picture."""
    found: list[Path] = []
    skipped: list[Path] = []
    folders: list[Path] = []
    named = [_picture_or_folder(argument) for argument in arguments]
    if not any(named):
        return None
    if not all(named):
        text = next(a for a, n in zip(arguments, named) if not n)
        raise InputError(
            f"give pictures (files or folders) or texts, not both: {text[:40]!r} is neither a "
            "picture nor a folder"
        )
    for path in named:
        if not path.is_dir():
            found.append(path)
            continue
        entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
        files = [p for p in entries if p.is_file()]
        folders += [p for p in entries if p.is_dir()]
        inside = [p for p in files if p.suffix.lower() in SUFFIXES]
        if not inside:
            raise InputError(f"{path} holds no picture (no file ending in {', '.join(SUFFIXES)})")
        found += inside
        skipped += [p for p in files if p.suffix.lower() not in SUFFIXES]
    return Pictures(tuple(found), tuple(skipped), tuple(folders))


def _picture_or_folder(argument: str) -> Path | None:
    if "\n" in argument or len(argument) > 4096 or not argument.strip():
        return None
    path = Path(argument).expanduser()
    try:
        if path.is_dir():
            return path
    except OSError:
        return None
    return picture_argument(argument)


def reads_pictures(config: dict[str, Any]) -> bool:
    """Whether a model of this config.json reads pictures (see the module's docstring)."""
    return all(key in vision_part(config) for key in ("patch_size", "image_size", "num_channels"))


def vision_part(config: dict[str, Any]) -> dict[str, Any]:
    """The vision tower's config of a checkpoint of two towers; else the config itself."""
    if config.get("model_type") in VISION_TOWERS and isinstance(config.get("vision_config"), dict):
        return config["vision_config"]
    return config


def refuse_unread(model_type: str, label: str) -> None:
    """One line for a vision model whose tokens are not its picture's grid: ViT-MAE drops
    most patches at random before its encoder."""
    from attnviz.errors import UnsupportedModelError

    if model_type == "vit_mae":
        raise UnsupportedModelError(
            f"{label} is a ViT-MAE: its encoder sees a random quarter of the patches, so its "
            "attention is not over the picture's grid; attnviz reads ViT, DeiT, DINOv2, BEiT, "
            "CLIP and SigLIP"
        )


def prefix_labels(config: Any) -> list[str]:
    """The labels of the tokens before the patches, from the loaded model's config."""
    kind = config.model_type
    if kind.startswith("siglip"):
        return []  # SigLIP pools with its own head: no CLS token
    labels = ["CLS"]
    if kind == "deit":
        labels.append("dist")
    labels += [f"reg{i}" for i in range(getattr(config, "num_register_tokens", 0) or 0)]
    return labels


def read_picture(given: Any) -> Any:
    """A PIL image in RGB, from a path or a PIL image; one line for a file that is not one."""
    from PIL import Image, UnidentifiedImageError

    if hasattr(given, "convert"):
        return given.convert("RGB")
    try:
        with Image.open(given) as opened:
            return opened.convert("RGB")
    except Image.DecompressionBombError as exc:  # PIL's guard against a huge picture
        raise InputError(f"{given}: too large to read safely ({exc})") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise InputError(
            f"{given}: not a picture attnviz can read ({exc.__class__.__name__})"
        ) from None


def encode_picture(loaded: Any, given: Any) -> Any:
    """The picture as the model reads it: `Encoded` with its pixel values (a (1, 3, H, W)
    tensor), its tokens' labels and its `Picture`."""
    image = read_picture(given)
    name = Path(given).name if isinstance(given, (str, Path)) else "image"
    processor = loaded.tokenizer  # a vision model's processor stands where a tokenizer would
    pixels = processor(images=image, return_tensors="pt")["pixel_values"]
    config = loaded.model.config
    patch = config.patch_size if isinstance(config.patch_size, int) else config.patch_size[0]
    height, width = pixels.shape[-2:]
    grid = (height // patch, width // patch)
    prefix = prefix_labels(config)
    labels = (*prefix, *(f"({r}, {c})" for r in range(grid[0]) for c in range(grid[1])))
    shown = _undo_normalisation(processor, pixels[0].numpy())
    picture = Picture(shown, grid, len(prefix), patch, name, given)
    n = len(labels)
    return Encoded(
        text=name,
        ids=tuple(range(n)),  # no vocabulary: each token's position
        tokens=labels,
        special=tuple(i < len(prefix) for i in range(n)),
        words=tuple(range(n)),
        word_labels=labels,
        notes=(
            f"{image.width} × {image.height} picture, read as {width} × {height} pixels: "
            f"{grid[0]} × {grid[1]} patches of {patch} × {patch}",
        ),  # fmt: skip
        pixels=pixels,
        picture=picture,
    )


def _undo_normalisation(processor: Any, pixels: Any) -> Any:
    """(3, H, W) normalised pixel values back to a (H, W, 3) uint8 picture."""
    import numpy as np

    values = pixels.transpose(1, 2, 0)
    if getattr(processor, "do_normalize", True):
        mean = np.asarray(getattr(processor, "image_mean", None) or (0.0,) * 3, np.float32)
        std = np.asarray(getattr(processor, "image_std", None) or (1.0,) * 3, np.float32)
        values = values * std + mean
    if getattr(processor, "do_rescale", True):
        values = values * 255.0
    return np.clip(np.round(values), 0, 255).astype(np.uint8)
