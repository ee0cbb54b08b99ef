"""Per-model feature statistics: the columns of the BAE-vs-SAE comparison table."""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.evaluation import evaluate_sae
from sae_lens_bae.features.records import FeatureRecords

__all__ = ["decoder_covariance_norm", "feature_statistics"]


@torch.no_grad()
def decoder_covariance_norm(W_dec: Float[Tensor, "d_sae d_in"]) -> float:
    """Spectral norm of the covariance matrix of the decoder's rows (the feature directions).

    Large when many features point along a few shared directions (redundant, entangled
    features); small when they spread out.
    """
    rows = W_dec.detach().double()
    if rows.shape[0] < 2:
        raise ValueError("decoder_covariance_norm needs at least two decoder rows")
    cov = torch.cov(rows.T)
    return float(torch.linalg.eigvalsh(cov).abs().max())


def feature_statistics(
    sae: Any,
    activations: Float[Tensor, "n d_in"],
    records: FeatureRecords | None = None,
    *,
    dense_threshold: float = 0.5,
    activated_min_samples: int = 8,
    targets: Float[Tensor, "n d_out"] | None = None,
) -> dict[str, Any]:
    """Held-out reconstruction loss, explained variance, L0, dead/dense counts, firing
    frequencies (from ``evaluate_sae``), the decoder covariance norm, and, given ``records``, the
    number of activated features (more than ``activated_min_samples`` tokens in the records).
    ``targets``: a transcoder's output hook point (errors are measured against them)."""
    stats = evaluate_sae(sae, activations, dense_threshold=dense_threshold, targets=targets)
    stats["decoder_covariance_norm"] = decoder_covariance_norm(sae.W_dec)
    stats["dense_threshold"] = dense_threshold
    if records is not None:
        stats["activated"] = records.activated(activated_min_samples)
        stats["activated_min_samples"] = activated_min_samples
    return stats
