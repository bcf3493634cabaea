"""Decoder probes: repeated random tokens through a causal model, scored per head.

The model reads [BOS] t_1 … t_n t_1 … t_n (random tokens, several sequences, a fixed seed).
Each head's induction and duplicate-token scores come from `metrics.probe_scores`; the
model's own next-token loss on each repeat shows in-context copying: a model with induction
heads predicts the second repeat far better than the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analysis.metrics import probe_scores, repeated_random_tokens

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.model_info import LoadedModel

SEQUENCES, LENGTH, SEED = 4, 50, 0


@dataclass(frozen=True, eq=False)
class ProbeResult:
    """Per-head probe scores and the model's loss on the first and second repeat."""

    scores: np.ndarray  # (P, L, H) in the order of metrics.PROBES, means over sequences
    loss_first: float  # mean next-token loss, nats, over the first repeat's tokens
    loss_second: float  # the same over the second repeat
    sequences: int
    length: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "sequences": self.sequences,
            "length": self.length,
            "seed": SEED,
            "loss_first_repeat": self.loss_first,
            "loss_second_repeat": self.loss_second,
        }


def run_probes(
    loaded: LoadedModel, sequences: int = SEQUENCES, length: int = LENGTH, batch_size: int = 8
) -> ProbeResult:
    """Run the repeated-random-tokens probe on `loaded` (a causal LM) and score every head.

    Sequences are shortened to fit a model that takes fewer than 1 + 2·length tokens.
    """
    import numpy as np
    import torch

    from attnviz.core import capture

    tokenizer = loaded.tokenizer
    special = set(tokenizer.all_special_ids)
    vocabulary = np.array([i for i in range(len(tokenizer)) if i not in special])
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    prefix = 0 if bos is None else 1
    length = min(length, (loaded.info.max_tokens - prefix) // 2)  # both repeats must fit
    ids = repeated_random_tokens(vocabulary, sequences, length, SEED, bos)  # (S, T)
    every_layer = loaded.info.pick_layers(None)
    scores, first, second = [], [], []
    for start in range(0, sequences, batch_size):
        batch = torch.tensor(ids[start : start + batch_size], device=loaded.device)
        held: dict[int, Any] = {}
        keep = capture.Each(every_layer, ("probs",), held.__setitem__)
        logits = capture.run(loaded, {"input_ids": batch}, [keep], lm_head=True).logits
        probs = [held[layer]["probs"] for layer in every_layer]  # (B, H, T, T) each
        weights = torch.stack(probs, dim=1)  # (B, L, H, T, T)
        weights = weights.float().cpu().numpy()
        scores += [probe_scores(w, length, prefix) for w in weights]
        # loss[:, p − 1] = −log P(token p | the tokens before it), from the logits at p − 1
        log_probs = torch.log_softmax(logits[:, :-1].double(), dim=-1)
        loss = -log_probs.gather(-1, batch[:, 1:, None])[..., 0].cpu().numpy()  # (B, T − 1)
        first.append(loss[:, max(prefix, 1) - 1 : prefix + length - 1])  # first repeat's tokens
        second.append(loss[:, prefix + length - 1 :])  # second repeat's tokens
    return ProbeResult(
        scores=np.mean(scores, axis=0),
        loss_first=float(np.concatenate(first).mean()),
        loss_second=float(np.concatenate(second).mean()),
        sequences=sequences,
        length=length,
    )
