"""What the layer map says of one layer: its modules (`LayerModules`), and the stacks an
encoder-decoder model's layers are in.

A family's module here (one a family, registered in `layer_map.NAMED`) has:
- `TYPES`: the config `model_type`s it reads; `CAUSAL`: whether they are decoders;
- for encoder-decoder models, `STACKS`: ("encoder", "decoder", "cross"), and `modules` takes
  the stack as a third argument;
- `modules(model, layer) -> LayerModules`: the layer's attention module (whose output holds
  the probabilities (B, H, T, T)), the projection whose input is the block's input X, and
  W_O, whose output is the block's output before residual and normalisation; and, for the
  contribution measures, where the residual stream is read and the normalisation that
  follows the block (post-LN encoders normalise block + residual; pre-LN decoders add the
  block to the residual stream unnormalised; Gemma2 normalises the block alone, then adds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STACKS = ("encoder", "decoder", "cross")  # an encoder-decoder model's three attention stacks


@dataclass(frozen=True, eq=False)
class LayerModules:
    """One layer's modules: its attention (whose output is (…, probabilities (B, H, T, T))),
    the projection whose input is X, and W_O, whose output is the block's output.

    `residual` is the module whose input is the residual stream the block's output is added
    to (a pre-LN decoder's input norm); None where that is X itself (post-LN encoders).
    `norm` is the normalisation after the block: of block + residual when
    `norm_covers_residual` (BERT's LayerNorm), of the block alone otherwise (Gemma2's
    post-attention RMSNorm); None where the block is added to the stream as it is.
    `probs_at` is where the attention module's output tuple holds the probabilities (T5's
    is (output, position bias, probabilities)); `kv_input` the projection whose input is what
    the keys and values are made of (cross-attention: the encoder's last hidden states),
    None where that is X.
    """

    attention: Any
    q: Any
    o: Any
    residual: Any = None
    norm: Any = None
    norm_covers_residual: bool = True
    probs_at: int = 1
    kv_input: Any = None
