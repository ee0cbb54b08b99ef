"""Entropy of sets of hidden states, estimated by BAEs: one set (``code_entropy``) or a grid of
sets, one BAE each, trained together (``estimate_entropies``); beside them the k-means reference
that tells a cell no code reads at its sample size from one a BAE misses
(``reference_reading``); and states of known entropy to check them on (``planted_cell``, and
a SAELens ``SyntheticModel``'s support pattern, ``support_entropy``)."""

from sae_lens_bae.entropy.cells import (
    TRACING_RECIPE,
    CellEntropy,
    EntropyRecipe,
    estimate_entropies,
)
from sae_lens_bae.entropy.estimate import EntropyEstimate, code_entropy
from sae_lens_bae.entropy.planted import directional_data, planted_cell, recovered_bits
from sae_lens_bae.entropy.reference import QuantizerReading, reference_reading
from sae_lens_bae.entropy.support import support_entropy

__all__ = [
    "TRACING_RECIPE",
    "CellEntropy",
    "EntropyEstimate",
    "EntropyRecipe",
    "QuantizerReading",
    "estimate_entropies",
    "code_entropy",
    "directional_data",
    "planted_cell",
    "recovered_bits",
    "reference_reading",
    "support_entropy",
]
