"""Held-out evaluation of any SAELens SAE (a BAE or a baseline) on cached activations."""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.losses import binary_entropy

__all__ = ["evaluate_sae"]


@torch.no_grad()
def evaluate_sae(
    sae: Any,
    activations: Float[Tensor, "n d_in"],
    batch_size: int = 4096,
    dense_threshold: float = 0.5,
    targets: Float[Tensor, "n d_out"] | None = None,
) -> dict[str, Any]:
    """Reconstruction and firing statistics of ``sae`` on ``activations``.

    Returns ``reconstruction_loss`` (squared error averaged over samples and dimensions),
    ``relative_error`` (SSE / sum of squares), ``explained_variance`` (1 - SSE / SST; both are None
    for data without squares or variance, e.g. all-zero activations), ``l0`` (mean
    active features per sample), ``entropy_bits`` (H of the features' firing rates: for a BAE with
    ``bits = 1`` the entropy estimate of the set), ``dead`` (never fire), ``dense`` (fire on more
    than ``dense_threshold`` of samples) and the per-feature ``firing_rates``. ``targets``: what
    the output should be when it is not the input (a transcoder's next hook point); errors and
    variance are then measured against them.
    """
    if targets is not None and targets.shape[0] != activations.shape[0]:
        raise ValueError(
            f"{activations.shape[0]} activation rows but {targets.shape[0]} target rows"
        )
    reference = activations if targets is None else targets
    sse = sum_sq = 0.0
    fired = torch.zeros(sae.cfg.d_sae, dtype=torch.float64)
    n = 0
    mean = reference.double().mean(0)
    sst = (reference.double() - mean).pow(2).sum().item()
    for start in range(0, activations.shape[0], batch_size):
        x = activations[start : start + batch_size].to(sae.device, sae.dtype)
        features = sae.encode(x)
        out = sae.decode(features)
        y = reference[start : start + batch_size].to(sae.device, sae.dtype)
        sse += (out - y).double().pow(2).sum().item()
        sum_sq += y.double().pow(2).sum().item()
        fired += (features != 0).sum(0, dtype=torch.float64).cpu()
        n += x.shape[0]
    rates = (fired / n).float()
    return {
        "n_samples": n,
        "reconstruction_loss": sse / (n * reference.shape[1]),
        "relative_error": sse / sum_sq if sum_sq > 0 else None,
        "explained_variance": 1.0 - sse / sst if sst > 0 else None,
        "l0": float(fired.sum() / n),
        "entropy_bits": binary_entropy(rates).item(),
        "dead": int((rates == 0).sum()),
        "dense": int((rates > dense_threshold).sum()),
        "d_sae": int(sae.cfg.d_sae),
        "firing_rates": rates,
    }
