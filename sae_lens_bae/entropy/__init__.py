"""Entropy of sets of hidden states, estimated by BAEs: one set (``estimate_entropy``) or a grid of
sets, one BAE each, trained together (``estimate_entropies``); beside them the k-means reference
that tells a cell no code reads at its sample size from one a BAE misses
(``reference_reading``)."""

from sae_lens_bae.entropy.cells import (
    TRACING_RECIPE,
    CellEntropy,
    EntropyRecipe,
    estimate_entropies,
)
from sae_lens_bae.entropy.estimate import EntropyEstimate, estimate_entropy
from sae_lens_bae.entropy.frame import normalise_scale, placement_shift
from sae_lens_bae.entropy.reference import QuantizerReading, reference_reading

__all__ = [
    "TRACING_RECIPE",
    "CellEntropy",
    "EntropyEstimate",
    "EntropyRecipe",
    "QuantizerReading",
    "estimate_entropies",
    "estimate_entropy",
    "normalise_scale",
    "placement_shift",
    "reference_reading",
]
