"""Re-initialising a BAE's constant code bits during training, as SAE trainers resample dead
latents.

The minibatch entropy is as small for a bit that never fires as for one that always fires:
both carry no information, and neither gets a useful gradient through the surrogate once its
pre-activations sit far from the threshold. ``resample_constant_bits`` gives such bits a
new start on what the BAE reconstructs worst: the encoder column points at one of the minibatch's
worst-reconstructed samples, the threshold makes the bit fire on a small fraction of the
minibatch (its rare state is its 1), and the decoder row is the mean residual of the samples it
fires on. Deterministic (no random draws), so stacked and separate trainings stay equal. When it
runs is the BAE's ``saes.schedule.Schedule``.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sae_lens_bae.saes.binary import constant_bits

__all__ = [
    "RESAMPLE_RATE",
    "resample_constant_bits",
    "resample_window",
    "RESAMPLE_UNTIL_FRACTION",
]

RESAMPLE_RATE = 0.05
"""A resampled bit fires on this fraction of the minibatch it is resampled on: rare, so its
rare state is its 1, and frequent enough that its gradient is not zero on the next minibatches."""


@torch.no_grad()
def resample_constant_bits(
    W_enc: Float[Tensor, "d_in n_bits"],
    b_enc: Float[Tensor, " n_bits"],
    W_dec: Float[Tensor, "d_sae d_in"],
    encoder_inputs: Float[Tensor, "batch d_in"],
    residuals: Float[Tensor, "batch d_in"],
    constant: Bool[Tensor, " n_bits"],
    *,
    bits_per_feature: int = 1,
    rate: float = RESAMPLE_RATE,
) -> int:
    """Re-initialise the ``constant`` bits in place; returns how many were.

    Bit ``j`` (the ``i``-th to be resampled) reads the sample with the ``i``-th largest
    squared residual: its encoder column is that sample's input, scaled to the mean norm of the
    other columns; its bias puts the threshold at the (1 - ``rate``) quantile of the minibatch's
    projections, so it fires on ``rate`` of the minibatch; its decoder row (``bits_per_feature``
    = 1 only; a wider feature shares its row) is the mean residual of the samples it fires on.
    """
    index = constant.nonzero()[:, 0]
    if index.numel() == 0:
        return 0
    errors = residuals.float().pow(2).sum(-1)
    worst = torch.argsort(errors, descending=True)
    picks = worst[torch.arange(index.numel(), device=worst.device) % worst.numel()]
    alive = ~constant
    norms = W_enc.norm(dim=0)
    scale = norms[alive].mean() if alive.any() else norms.mean()
    directions = encoder_inputs[picks].to(W_enc.dtype)  # [m, d_in]
    directions = directions / directions.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    columns = (directions * scale).T  # [d_in, m]
    W_enc[:, index] = columns
    projections = encoder_inputs.to(W_enc.dtype) @ columns  # [batch, m]
    threshold = torch.quantile(projections.float(), 1.0 - rate, dim=0).to(b_enc.dtype)
    b_enc[index] = -threshold
    firing = projections >= threshold
    if bits_per_feature == 1:
        weights = firing.to(residuals.dtype)
        mean_residual = (weights.T @ residuals) / weights.sum(0).clamp_min(1.0)[:, None]
        W_dec[index] = mean_residual.to(W_dec.dtype)
    return int(index.numel())


@torch.no_grad()
def resample_window(
    W_enc: Float[Tensor, "d_in n_bits"],
    b_enc: Float[Tensor, " n_bits"],
    W_dec: Float[Tensor, "d_sae d_in"],
    encoder_inputs: Float[Tensor, "batch d_in"],
    residuals: Float[Tensor, "batch d_in"],
    window_counts: Int[Tensor, " n_bits"],
    window_samples: int,
    code_mean: Float[Tensor, " n_bits"],
    *,
    bits_per_feature: int = 1,
) -> int:
    """End one BAE's resampling window, in place: resample the bits that were constant through it
    on this minibatch; a resampled bit's running mean restarts at its new rate and the window's
    counts at zero (the caller restarts the samples seen). Returns how many bits were resampled."""
    constant = constant_bits(window_counts, window_samples)
    count = resample_constant_bits(
        W_enc, b_enc, W_dec, encoder_inputs, residuals, constant, bits_per_feature=bits_per_feature
    )
    code_mean[constant] = RESAMPLE_RATE
    window_counts.zero_()
    return count


RESAMPLE_UNTIL_FRACTION = 0.95
"""Resampling stops after this fraction of training: a bit resampled in the last steps
would have no time to learn (the default recipe's choice, docs/research/code-notes.md)."""
