"""Re-initialising a BAE's constant code channels during training, as SAE trainers resample dead
latents.

The minibatch entropy is as small for a channel that never fires as for one that always fires:
both carry no information, and neither gets a useful gradient through the surrogate once its
pre-activations sit far from the threshold. ``resample_constant_channels`` gives such channels a
new start on what the BAE reconstructs worst: the encoder column points at one of the minibatch's
worst-reconstructed samples, the threshold makes the channel fire on a small fraction of the
minibatch (its rare state is its 1), and the decoder row is the mean residual of the samples it
fires on. Deterministic (no random draws), so stacked and separate trainings stay equal.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = [
    "CONSTANT_RARITY",
    "RESAMPLE_RATE",
    "constant_channels",
    "resample_constant_channels",
    "resample_members",
]

CONSTANT_RARITY = 1e-4
"""A channel whose rare state occurs on fewer than this fraction of tokens is constant: it carries
(almost) no information. The feature statistics' ``constant`` column uses the same threshold."""

RESAMPLE_RATE = 0.05
"""A resampled channel fires on this fraction of the minibatch it is resampled on: rare, so its
rare state is its 1, and frequent enough that its gradient is not zero on the next minibatches."""


def constant_channels(
    counts: Float[Tensor, "*stack n_bits"], samples: int, rarity: float = CONSTANT_RARITY
) -> Bool[Tensor, "*stack n_bits"]:
    """Channels whose rare state (firing, or not firing) took fewer than ``rarity`` of the
    ``samples`` samples; at least those that fired on none or on all of them. Not only exactly
    constant ones: a channel firing on 3 of 64k training tokens reads as dead on held-out text."""
    rare = torch.minimum(counts, samples - counts)
    return (rare == 0) | (rare < rarity * samples)


@torch.no_grad()
def resample_constant_channels(
    W_enc: Float[Tensor, "d_in n_bits"],
    b_enc: Float[Tensor, " n_bits"],
    W_dec: Float[Tensor, "d_sae d_in"],
    encoder_inputs: Float[Tensor, "batch d_in"],
    residuals: Float[Tensor, "batch d_in"],
    channels: Bool[Tensor, " n_bits"],
    *,
    bits_per_feature: int = 1,
    rate: float = RESAMPLE_RATE,
) -> int:
    """Re-initialise ``channels`` in place; returns how many were.

    Channel ``j`` (the ``i``-th to be resampled) reads the sample with the ``i``-th largest
    squared residual: its encoder column is that sample's input, scaled to the mean norm of the
    other columns; its bias puts the threshold at the (1 - ``rate``) quantile of the minibatch's
    projections, so it fires on ``rate`` of the minibatch; its decoder row (``bits_per_feature``
    = 1 only; a wider feature shares its row) is the mean residual of the samples it fires on.
    """
    index = channels.nonzero()[:, 0]
    if index.numel() == 0:
        return 0
    errors = residuals.float().pow(2).sum(-1)
    worst = torch.argsort(errors, descending=True)
    picks = worst[torch.arange(index.numel(), device=worst.device) % worst.numel()]
    alive = ~channels
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
def resample_members(
    W_enc: Float[Tensor, "G d_in n_bits"],
    b_enc: Float[Tensor, "G n_bits"],
    W_dec: Float[Tensor, "G d_sae d_in"],
    encoder_inputs: Float[Tensor, "members batch d_in"],
    residuals: Float[Tensor, "members batch d_in"],
    window_counts: Int[Tensor, "G n_bits"],
    window_samples: Int[Tensor, ""],
    code_mean: Float[Tensor, "G n_bits"],
    *,
    members: Sequence[int],
    bits_per_feature: int = 1,
) -> list[int]:
    """Resample the constant channels of each stack row ``members[i]``, on its minibatch
    ``encoder_inputs[i]``, in place: what one BAE (G = 1) and a stack of G do at the end of a
    resampling window. A resampled channel's running mean restarts at its new rate; the rows'
    window counts restart at zero. Returns how many channels each row resampled."""
    samples = int(window_samples)
    counts = []
    for i, g in enumerate(members):
        channels = constant_channels(window_counts[g], samples)
        counts.append(
            resample_constant_channels(
                W_enc[g],
                b_enc[g],
                W_dec[g],
                encoder_inputs[i],
                residuals[i],
                channels,
                bits_per_feature=bits_per_feature,
            )
        )
        code_mean[g][channels] = RESAMPLE_RATE
        window_counts[g] = 0
    window_samples.zero_()
    return counts
