"""Feature-set entropy with a known answer: SAELens synthetic models whose support pattern's
entropy ``support_entropy`` gives exactly, read by the BAE (``estimate_entropies``, its trust
columns included).

Each cell is a model without correlation (no closed form exists with it) and with constant
magnitudes, so a hidden state is a function of its support alone and the set of states holds
exactly the support's entropy. The cells cross two sizes, two superposition ratios (dimensions
per feature) and a hierarchy of mutually exclusive children against independent features. The
estimator runs with ``CELL_RECIPE`` as fixed before any cell was read: it is not tuned on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from sae_lens.synthetic import (
    HierarchyConfig,
    SyntheticModel,
    SyntheticModelConfig,
    ZipfianFiringProbabilityConfig,
)

from sae_lens_bae.entropy import TRACING_RECIPE, EntropyRecipe, estimate_entropies
from sae_lens_bae.entropy.support import support_entropy

__all__ = ["CELLS", "CELL_RECIPE", "cell_model", "entropy_rows", "within_tolerance"]

CELLS = [
    (features, ratio, hierarchy)
    for features in (16, 32)
    for ratio in (2, 4)
    for hierarchy in (False, True)
]
"""(features, features per dimension, hierarchy) of every cell: sizes whose independent cell holds
at most log2(CELL_SAMPLES) - 4 bits, so that many states can show the entropy they hold."""

CELL_RECIPE = TRACING_RECIPE.changed(expansion=4, seeds=1)
"""The tracing recipe with a code at least as wide as the features (4 bits per dimension, the
widest ratio) and one seed."""
CELL_SAMPLES = 16_384
"""Training and held-out states per cell."""


def cell_model(features: int, ratio: int, hierarchy: bool, seed: int) -> SyntheticModel:
    """A cell's model: Zipfian firing as SynthSAEBench's, constant magnitude 1, no bias or
    correlation; with ``hierarchy``, trees of depth 2 and branching 3 whose children exclude
    each other, one root per 16 features."""
    tree = HierarchyConfig(
        total_root_nodes=features // 16,
        branching_factor=3,
        max_depth=2,
        mutually_exclusive_portion=1.0,
        mutually_exclusive_min_depth=0,
        compensate_probabilities=False,
    )
    config = SyntheticModelConfig(
        num_features=features,
        hidden_dim=features // ratio,
        firing_probability=ZipfianFiringProbabilityConfig(
            exponent=0.5, max_prob=0.4, min_prob=5e-4
        ),
        hierarchy=tree if hierarchy else None,
        std_firing_magnitudes=0.0,
        mean_firing_magnitudes=1.0,
        bias=False,
        seed=seed,
    )
    return SyntheticModel(config)


def within_tolerance(bits: float, truth: float) -> bool:
    """Whether a reading is within max(0.25 bit, 3%) of the truth."""
    return abs(bits - truth) <= max(0.25, 0.03 * truth)


def entropy_rows(
    seed: int = 0,
    device: str = "cpu",
    cells: Sequence[tuple[int, int, bool]] = tuple(CELLS),
    samples: int = CELL_SAMPLES,
    recipe: EntropyRecipe = CELL_RECIPE,
) -> list[dict[str, Any]]:
    """Every cell's exact support entropy beside the BAE's reading of ``samples`` held-out
    states (trained on as many others)."""
    models = [cell_model(*cell, seed=seed + index) for index, cell in enumerate(cells)]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        train = [model.sample(samples) for model in models]
        held_out = [model.sample(samples) for model in models]
    readings: list[Any] = [None] * len(cells)
    for width in sorted({features // ratio for features, ratio, _ in cells}):
        group = [i for i, (features, ratio, _) in enumerate(cells) if features // ratio == width]
        found = estimate_entropies(  # one stack per width: stacked BAEs share their d_in
            [train[i] for i in group],
            recipe,
            eval_sets=[held_out[i] for i in group],
            device=device,
            progress=False,
        )
        for i, reading in zip(group, found, strict=True):
            readings[i] = reading
    rows = []
    for (features, ratio, hierarchy), model, reading in zip(cells, models, readings, strict=True):
        truth = support_entropy(model)
        rows.append(
            {
                "cell": f"{features}f/{features // ratio}d{' hierarchy' if hierarchy else ''}",
                "features": features,
                "hidden_dim": features // ratio,
                "hierarchy": hierarchy,
                "truth_bits": truth,
                "bits": reading.bits,
                "reliable": reading.reliable,
                "within_tolerance": within_tolerance(reading.bits, truth),
                "relative_error": reading.relative_error,
                "ceiling_bits": reading.ceiling_bits,
            }
        )
    return rows
