"""What reading a vision-language model's answer costs (issue 54): `show PICTURE PROMPT
--generate 20` against transformers' plain `generate` on the same model and inputs, each side
in a fresh process, side by side in each round (order rotated), timed inside the process once
the model is loaded.

Models (random weights, built here from configs; float32 on the CPU):
- llava: LLaVA-shaped, a CLIP tower over 336 × 336 pixels in 14-pixel patches (576 image
  tokens), a Llama language model of 4 layers × 8 heads (256 wide; `--width 1024`: 16
  heads of 64, where the model's own work weighs more against its attention maps;
  `--head-dim 128`: heads of 128, LLaVA-1.5's, so 32 heads at 4096 wide);
- qwen2_vl: Qwen2-VL-shaped, a 672 × 672 picture in 14-pixel patches merged 2 × 2 (576 image
  tokens), a Qwen2 language model of the same size.

Each reads a 30-token question about one random picture through its chat template and writes
20 tokens, greedy (stopping early only at its end-of-text token, the same on both sides).

Sides:
- generate: the processor, then the model's own `generate` (SDPA, its KV cache) on its
  inputs, what a user runs without attnviz;
- show: `attnviz show picture.png QUESTION -m DIR --generate 20 --no-images` as a pipeline
  (`pipelines.show.show`): the answer written with attnviz's attention function recording
  each layer's q and k of the prompt and each step's rows, then the rows handed to the
  summary's recorders; the vision tower's heads recorded in the prompt's pass
  (`analysis.tower`);
- show-no-tower: the same with `--no-tower`, its tower not read (its layers run SDPA):
  what reading the tower's heads costs is the difference.

Each side runs twice in its process: the first call, what `attnviz show` pays once (its
lazy imports, first allocations), and the same call again, what each further answer costs
(the API or `serve` in a loop). Both sides load the model the way `show` finds it (the
process's model for its settings, `models.get`), before the clock starts: show's first call
loads nothing. Peak RSS of each process (model load included) is given beside.

Run: .venv/bin/python bench/bench_vlm.py [--runs 3] [--new 20] [--width 256] [--head-dim N]
[--quick]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from _common import QUICK_RUNS, ROOT, footer, header, parser, ratios, rounds, spread
from _rss import measure

QUESTION_TOKENS = 30
FAMILIES = ("llava", "qwen2_vl")
TEXT = dict(num_hidden_layers=4, max_position_embeddings=4096)


def text_config(width: int, head_dim: int | None = None) -> dict:
    """The language model's shape at `width` (256 by default): heads of `head_dim` (default
    32 at 256, 64 wider), half as many key/value heads, an MLP 2.69 times as wide (Llama's
    ratio)."""
    d_head = head_dim or (32 if width <= 256 else 64)
    heads = width // d_head
    return dict(TEXT, hidden_size=width, num_attention_heads=heads,
                num_key_value_heads=heads // 2, head_dim=d_head,
                intermediate_size=int(width * 2.6875))  # fmt: skip


SIDE = """
import sys, time
import torch
side, folder, picture, question, n_new, result = sys.argv[1:7]
n_new = int(n_new)
from attnviz.core import models
from attnviz.core.settings import Load
loaded = models.get(Load(folder, "cpu")).load()  # the model show finds: it loads none itself
from attnviz.core import generation, vlm
from attnviz.pipelines.request import ShowRequest
from attnviz.pipelines.show import show

def generate():
    loaded.model.set_attn_implementation("sdpa")  # transformers alone
    config = generation.generation_config(loaded, generation.Settings(n_new))
    prompt = vlm.encode(loaded, picture, question)  # the processor's work counted on both sides
    ids = torch.tensor([prompt.ids])
    with torch.inference_mode():
        out = loaded.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                    **prompt.inputs, generation_config=config)
    return out.sequences.shape[1] - len(prompt), len(prompt)

def shown():
    request = ShowRequest(Load(folder, "cpu"), text=question, picture=picture, prompt=question,
                          generate=n_new, out=None, images=False,
                          tower=side != "show-no-tower")  # --no-tower
    shown = show(request).attention
    c = shown.continuation
    return len(shown.tokens) - c.start, c.start

seconds = []
for _ in range(2):  # the first call in a fresh process, then the same again
    start = time.perf_counter()
    written, length = generate() if side == "generate" else shown()
    seconds.append(time.perf_counter() - start)
open(result, "w").write(f"{seconds[0]} {seconds[1]} {written} {length}")
"""


def _llava(tok, template, width, head_dim):
    import transformers as tf

    vision = dict(model_type="clip_vision_model", hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=128, image_size=336,
                  patch_size=14)  # fmt: skip
    image = tok.convert_tokens_to_ids("<image>")
    config = tf.LlavaConfig(text_config=dict(model_type="llama", vocab_size=len(tok),
                                             **text_config(width, head_dim)),
                            vision_config=vision, image_token_id=image)  # fmt: skip
    images = tf.CLIPImageProcessorPil(size={"shortest_edge": 336},
                                      crop_size={"height": 336, "width": 336})  # fmt: skip
    processor = tf.LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=14,
                                  vision_feature_select_strategy="default",
                                  num_additional_image_tokens=1,
                                  chat_template=template.replace("IMAGE", "<image>"))  # fmt: skip
    return tf.LlavaForConditionalGeneration(config), processor, (336, 336)


def _qwen2_vl(tok, template, width, head_dim):
    import transformers as tf

    from attnviz.core.vlm import _without_video

    ids = {name: tok.convert_tokens_to_ids(f"<|{name}|>")
           for name in ("image_pad", "vision_start", "vision_end")}  # fmt: skip
    shape = text_config(width, head_dim)
    unit = shape["head_dim"] // 16  # the rotary half (head_dim / 2) split 2 : 3 : 3
    text = dict(model_type="qwen2_vl_text", vocab_size=len(tok), **shape,
                rope_scaling={"type": "mrope", "mrope_section": [2 * unit, 3 * unit,
                                                                 3 * unit]})  # fmt: skip
    vision = dict(depth=2, embed_dim=64, hidden_size=width, num_heads=4, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_chans=3, mlp_ratio=2)  # fmt: skip
    config = tf.AutoConfig.for_model("qwen2_vl", text_config=text, vision_config=vision,
                                     image_token_id=ids["image_pad"],
                                     vision_start_token_id=ids["vision_start"],
                                     vision_end_token_id=ids["vision_end"])  # fmt: skip
    side = 672  # 48 × 48 patches of 14, merged 2 × 2: 24 × 24 image tokens
    images = tf.Qwen2VLImageProcessorPil(patch_size=14, min_pixels=side * side,
                                         max_pixels=side * side)  # fmt: skip
    template = template.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>")
    processor = _without_video(tf.Qwen2VLProcessor)(image_processor=images, tokenizer=tok,
                                                    chat_template=template)  # fmt: skip
    return tf.AutoModelForImageTextToText.from_config(config), processor, (side, side)


def build(family: str, folder: Path, width: int = 256,
          head_dim: int | None = None) -> tuple[Path, Path, str]:  # fmt: skip
    """A random `family` model (its language model `width` wide, heads of `head_dim`) saved in
    `folder`, a random picture of the size its processor reads whole, and a question of
    QUESTION_TOKENS tokens: (model folder, picture, question)."""
    import numpy as np
    import torch
    from PIL import Image
    from vlm_models import CORPUS, TEMPLATE, tokenizer

    torch.manual_seed(0)
    if family == "llava":
        tok = tokenizer("<image>")
        model, processor, size = _llava(tok, TEMPLATE, width, head_dim)
    else:
        tok = tokenizer("<|image_pad|>", "<|vision_start|>", "<|vision_end|>")
        model, processor, size = _qwen2_vl(tok, TEMPLATE, width, head_dim)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, 0.05)
    model_folder = folder / family
    model.save_pretrained(model_folder)
    processor.save_pretrained(model_folder)
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), np.uint8)
    picture = folder / f"{family}.png"
    Image.fromarray(pixels).save(picture)
    ids = tok(" ".join(CORPUS))["input_ids"][:QUESTION_TOKENS]
    return model_folder, picture, tok.decode(ids)


def main() -> None:
    options = parser(__doc__, runs=3)
    options.add_argument("--new", type=int, default=20, help="tokens written (default 20)")
    options.add_argument(
        "--width",
        type=int,
        default=256,
        help="the language model's width (default 256; 1024: 16 heads of 64)",
    )
    options.add_argument(
        "--head-dim",
        type=int,
        default=None,
        help="the language model's head size (default 32 at 256 wide, 64 wider; 128: "
        "LLaVA-1.5's, 32 heads at 4096 wide)",
    )
    args = options.parse_args()
    if args.quick:
        args.new, args.runs = 4, min(args.runs, QUICK_RUNS)
    header("A vision-language model's answer read by show, against transformers' generate",
           args)  # fmt: skip
    sides = ["generate", "show", "show-no-tower"]
    sys.path.insert(0, str(ROOT / "tests"))  # the tiny tokenizer and processors' helpers
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES:
            folder, picture, question = build(family, Path(tmp), args.width, args.head_dim)
            times: dict[str, list[float]] = {side: [] for side in sides}
            again: dict[str, list[float]] = {side: [] for side in sides}
            peaks: dict[str, list[float]] = {side: [] for side in sides}
            counts = set()
            for order in rounds(args.runs, sides):
                for side in order:
                    out = Path(tmp) / "out.txt"
                    command = [sys.executable, "-c", SIDE, side, str(folder), str(picture),
                               question, str(args.new), str(out)]  # fmt: skip
                    _, peak = measure(command)
                    seconds, second, written, length = out.read_text().split()
                    times[side].append(float(seconds))
                    again[side].append(float(second))
                    peaks[side].append(peak)
                    counts.add((int(written), int(length)))
            (written, length), *others = sorted(counts)
            if others:
                raise SystemExit(f"{family}: the sides wrote different numbers of tokens: "
                                 f"{sorted(counts)}")  # fmt: skip
            shape = text_config(args.width, args.head_dim)
            print(f"### {family}, a language model {args.width} wide "
                  f"({shape['num_attention_heads']} heads of {shape['head_dim']})\n\n"
                  f"A {length}-token prompt (576 image tokens, a "
                  f"{QUESTION_TOKENS}-token question, the chat template's), {written} tokens "
                  "written (greedy); ratios to `generate` in the same round, min / median / max "
                  f"over {args.runs} rounds; seconds exclude the model's load, peak RSS "
                  "includes it\n")  # fmt: skip
            print("| side | **÷ generate**, first call | seconds (median) | ÷ generate, "
                  "called again | seconds (median) | peak RSS MiB (median) |")  # fmt: skip
            print("|---|---|---|---|---|---|")
            for side in sides:
                ratio = spread(ratios(times[side], times["generate"]), 2, bold=True)
                warm = spread(ratios(again[side], again["generate"]), 2)
                print(f"| {side} | {ratio} | {statistics.median(times[side]):.2f} | {warm} | "
                      f"{statistics.median(again[side]):.2f} | "
                      f"{statistics.median(peaks[side]):.0f} |")  # fmt: skip
            print()
    footer()


if __name__ == "__main__":
    main()
