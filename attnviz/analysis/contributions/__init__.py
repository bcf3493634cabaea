"""What each token contributes, not only where heads look: the norm, ALTI and rollout measures.

Head h's output for query i is Σ_j α^h_ij f^h(x_j), with f^h(x) = (x W_V^h + b_V^h) W_O^h
(under grouped-query attention, W_V^h is the head's shared value head; RoPE does not touch
values). A key with a large weight α and a short f(x) passes on little. Each measure is one
`Measure` in MEASURES:

    weights  α^h_ij, per head (rows sum to 1)
    norm     ‖α^h_ij f^h(x_j)‖ = α^h_ij ‖f^h(x_j)‖, per head (Kobayashi et al. 2020)
    alti     per layer, with the residual and the normalisation after the block (Ferrando et
             al. 2022, ALTI), composed from layer 0 up: R_0 = C_0, R_l = C_l R_{l−1}
    rollout  per layer, heads averaged with the residual as I (Abnar & Zuidema 2020):
             Ã_l = (mean_h α_l + I) rows renormalised, R_0 = Ã_0, R_l = Ã_l R_{l−1}

ALTI decomposes the vector the layer's attention block writes for token i:

    t_ij = Σ_h α^h_ij f^h(x_j) + [i = j] r_i        r_i: the residual stream at i

where r is the block's input X in a post-LN encoder (BERT: u_i = Σ_j t_ij + b_O is its
LayerNorm's input) and the stream before the input norm in a pre-LN decoder (Llama: x_j is
that norm's output, and u_i = Σ_j t_ij + b_O is the stream after the block). The
normalisation after the block is linearised with the real input's scale, as Kobayashi et al.
(2021) do: t'_ij = γ ⊙ (t_ij − mean(t_ij)) / s(u_i) for a LayerNorm (s: the standard
deviation with eps; an RMSNorm neither centres nor has a bias, s is the root mean square);
Gemma2 normalises the block's output alone and then adds r_i unnormalised. A pre-LN decoder
has no normalisation here: t' = t. Then, with y_i = Σ_j t'_ij,

    c_ij = max(0, ‖y_i‖₁ − ‖y_i − t'_ij‖₁), rows normalised to sum to 1.

The biases (b_O, and the LayerNorm's β and its share of b_O) belong to no token and are left
out of y_i, as in ALTI. Everything is computed from the captured tensors of one forward pass;
no (T, T, d_model) tensor is held whole: ALTI works through the queries in blocks.
"""

from attnviz.analysis.contributions.maths import (
    BLOCK_FLOATS,
    MIXING,
    AltiLayer,
    Mixed,
    alti_layer,
    mixed,
    mixing_ratios,
    mixing_rows,
    rollout_layer,
    special_means,
    special_rows,
    value_heads,
)
from attnviz.analysis.contributions.measures import (
    DEFAULT,
    FUSIONS,
    MEASURES,
    Measure,
    get,
    refuse_on_stacks,
    shares,
    with_rollout,
)
from attnviz.analysis.contributions.recorders import (
    ContributionSums,
    CorpusContributions,
    EveryMeasure,
    MeasureRecorder,
    PageMeasures,
    PageParts,
    SpecialShares,
    Values,
    mixing_left_out,
    mixing_means,
    read_measure,
    stack_values,
    values_of,
)

__all__ = [
    "Measure",
    "MEASURES",
    "DEFAULT",
    "get",
    "FUSIONS",
    "with_rollout",
    "refuse_on_stacks",
    "shares",
    "BLOCK_FLOATS",
    "value_heads",
    "rollout_layer",
    "AltiLayer",
    "alti_layer",
    "Mixed",
    "mixed",
    "MIXING",
    "mixing_ratios",
    "mixing_rows",
    "special_rows",
    "special_means",
    "Values",
    "values_of",
    "MeasureRecorder",
    "SpecialShares",
    "ContributionSums",
    "mixing_left_out",
    "CorpusContributions",
    "read_measure",
    "stack_values",
    "mixing_means",
    "PageMeasures",
    "EveryMeasure",
    "PageParts",
]
