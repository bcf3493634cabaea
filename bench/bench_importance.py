"""Head importance on SmolLM2: ablation and gradient against plain forward passes.

Ten texts of 40 SmolLM2 tokens (the samples corpus, cut). Per round, side by side in one
process (the model loaded once, before the rounds), in an order rotated every round:

- `ablation`: `analysis.importance.importance(..., "ablation")` over the heads of the chosen
  layers, ablated copies of the texts batched together, each batch starting at its ablated
  layer from the clean pass's outputs of the layers below (reuse);
- `ablation, no reuse`: the same with `reuse=False`, every ablated copy through every layer;
- `plain`: as many plain forward passes of the causal LM over the ten texts (one batch,
  logits computed, no hooks) as there are heads: what a loop that ablates one head per pass
  costs, without the ablation;
- `gradient`: `importance(..., "gradient")` over every head, against one plain pass.

With reuse a head of layer l costs layers l…29 and the LM head, so heads of low layers cost
more than heads of high ones, about linearly in l, and a batch holds one layer's heads only
(a layer's cost does not depend on which others are chosen). The default layers, 2, 7, 12,
17, 22 and 27 (54 heads), are the middles of six equal spans of the 30: their mean layer is
14.5, the mean of 0…29, so under that linear cost their time per head is all 270 heads'.
`--all` times every head instead (5 times longer, about 9 min a round on 2 cores: fewer
rounds, e.g. `--all --runs 3`).
`--random-weights` builds a model of SmolLM2's shape with random weights and random token
ids (no GGUF file needed: for a machine without it, e.g. a GPU box); `--device cuda` runs there.
Run: .venv/bin/python bench/bench_importance.py [--runs 5] [--all] [--quick]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread

SAMPLES = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"
N_TEXTS, N_TOKENS = 10, 40
SPREAD = [2, 7, 12, 17, 22, 27]  # the middles of six equal spans of SmolLM2's 30 layers
# SmolLM2-135M's shape (its config.json), for --random-weights.
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
               rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=0)  # fmt: skip


def smollm2(random_weights: bool, device: str):
    """(loaded model, encoded texts): SmolLM2 and ten 40-token texts from the corpus, or a
    random model of its shape and random ids."""
    from types import SimpleNamespace

    import torch

    from attnviz.core.attention import Encoded
    from attnviz.core.model_info import LoadedModel, ModelInfo
    from attnviz.core.models import load_model

    if not random_weights:
        loaded = load_model("smollm2", device)
        lines = [s for s in SAMPLES.read_text().splitlines() if s.strip()]
        ids: list[int] = []
        for line in lines:
            ids += loaded.tokenizer(" " + line)["input_ids"]
        bos = loaded.tokenizer.bos_token_id
        rows = [[bos, *ids[i * N_TOKENS : (i + 1) * N_TOKENS - 1]] for i in range(N_TEXTS)]
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(**SMOLLM2)
        config._attn_implementation = "eager"
        model = LlamaForCausalLM(config).eval().to(device)
        info = ModelInfo("SmolLM2 shape, random weights", "LlamaForCausalLM", "llama", 30, 9,
                         576, 64, 8192, True, 3)  # fmt: skip
        loaded = LoadedModel(model, SimpleNamespace(pad_token_id=0), info, device)
        rows = torch.randint(1, 49152, (N_TEXTS, N_TOKENS)).tolist()
    texts = []
    for row in rows:
        n = len(row)
        texts.append(Encoded("", tuple(row), ("t",) * n, (False,) * n, tuple(range(n)),
                             ("t",) * n, ()))  # fmt: skip
    return loaded, texts


def main() -> None:
    options = parser(__doc__, runs=5)
    options.add_argument("--all", action="store_true", help="ablate all 270 heads per round")
    options.add_argument(
        "--random-weights",
        action="store_true",
        help="SmolLM2's shape with random weights (no GGUF file needed)",
    )
    options.add_argument("--device", default="cpu")  # fmt: skip
    args = options.parse_args()
    import torch

    from attnviz.analysis.importance import importance
    from attnviz.core.tokens import pad

    layers = None if args.all else SPREAD
    if args.quick:
        args.runs, layers = 2, [15]
    header("Head importance: ablation and gradient against plain forward passes", args)
    loaded, texts = smollm2(args.random_weights, args.device)
    n_heads = loaded.info.n_heads * (loaded.info.n_layers if layers is None else len(layers))
    inputs = pad(loaded, texts)
    model = loaded.model

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def plain(passes: int) -> float:
        sync()
        start = time.perf_counter()
        with torch.inference_mode():
            for _ in range(passes):
                model(**inputs)
        sync()
        return time.perf_counter() - start

    def timed(method: str, chosen, reuse: bool = True) -> float:
        sync()
        start = time.perf_counter()
        importance(loaded, texts, method, layers=chosen, reuse=reuse)
        sync()
        return time.perf_counter() - start

    sides = {
        "ablation": lambda: timed("ablation", layers),
        "ablation, no reuse": lambda: timed("ablation", layers, reuse=False),
        "plain": lambda: plain(n_heads),
        "gradient": lambda: timed("gradient", None),
        "one pass": lambda: plain(1),
    }
    plain(2)
    timed("gradient", None)  # warm-up: first calls allocate
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    for order in rounds(args.runs, list(sides)):
        for name in order:
            seconds[name].append(sides[name]())
    chosen = "all layers" if layers is None else "layers " + ", ".join(map(str, layers))
    print(f"SmolLM2{' (random weights)' if args.random_weights else ''} on {args.device}, "
          f"{N_TEXTS} texts × {N_TOKENS} tokens, {n_heads} heads ({chosen}) ablated per round; "
          "min / **median** / max over the rounds\n")  # fmt: skip
    print("| ratio (same round) | min / median / max | target |")
    print("|---|---|---|")
    print(
        f"| ablation of {n_heads} heads ÷ {n_heads} plain passes | "
        f"{spread(ratios(seconds['ablation'], seconds['plain']), bold=True)} | ≤ 0.5 |"
    )
    print(
        f"| ablation, no reuse ÷ {n_heads} plain passes | "
        f"{spread(ratios(seconds['ablation, no reuse'], seconds['plain']))} | |"
    )
    print(
        "| ablation ÷ ablation, no reuse | "
        f"{spread(ratios(seconds['ablation'], seconds['ablation, no reuse']))} | |"
    )
    print(
        f"| gradient, all heads ÷ one plain pass | "
        f"{spread(ratios(seconds['gradient'], seconds['one pass']), bold=True)} | ≤ 3 |"
    )
    print("\n| side | seconds, min / median / max | per head |")
    print("|---|---|---|")
    for name, values in seconds.items():
        each = statistics.median(values) / n_heads if name.startswith(("abl", "plain")) else None
        per_head = f"{each:.3f} s" if each is not None else ""
        print(f"| {name} | {spread(values, 3)} | {per_head} |")
    footer()


if __name__ == "__main__":
    main()
