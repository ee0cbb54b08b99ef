"""Entropy estimation with BAEs: the estimator, and the benchmarks and traces built on it."""

from sae_lens_bae.entropy.cells import (
    TRACING_RECIPE,
    CellEntropy,
    EntropyRecipe,
    estimate_entropies,
)
from sae_lens_bae.entropy.estimate import EntropyEstimate, estimate_entropy

__all__ = [
    "TRACING_RECIPE",
    "CellEntropy",
    "EntropyEstimate",
    "EntropyRecipe",
    "estimate_entropies",
    "estimate_entropy",
]
