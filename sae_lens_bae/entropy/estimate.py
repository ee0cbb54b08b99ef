"""Entropy of a set of hidden states, estimated by a trained BAE.

The estimate is H(p) = -sum_i [p_i log2 p_i + (1-p_i) log2(1-p_i)] with p the BAE's mean binary
code over the *whole* set (not per minibatch). Since the BAE is trained to make its code channels
independent (covariance penalty) and compact (minibatch entropy), the sum of channel entropies
approaches the entropy of the set.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.losses import binary_entropy

__all__ = ["EntropyEstimate", "estimate_entropy"]


@dataclass
class EntropyEstimate:
    """An entropy estimate in bits, the per-channel firing rates it came from, and the count."""

    bits: float
    firing_rates: Float[Tensor, " n_bits"]
    n_samples: int


@torch.no_grad()
def estimate_entropy(
    bae: torch.nn.Module,
    activations: Float[Tensor, "n d_in"] | Iterable[Float[Tensor, "batch d_in"]],
    batch_size: int = 4096,
) -> EntropyEstimate:
    """Entropy in bits of ``activations`` as seen by ``bae`` (any object with ``encode_bits``).

    Streams: a tensor is encoded ``batch_size`` rows at a time, and an iterable of batches (e.g.
    read from an activation cache) is consumed once, so the set never needs to fit in memory.
    """
    batches = (
        (activations[i : i + batch_size] for i in range(0, activations.shape[0], batch_size))
        if isinstance(activations, Tensor)
        else activations
    )
    counts: Tensor | None = None
    n = 0
    for batch in batches:
        bits = bae.encode_bits(batch)
        bits = bits.reshape(-1, bits.shape[-1])
        batch_counts = bits.sum(0, dtype=torch.float64)
        counts = batch_counts if counts is None else counts + batch_counts
        n += bits.shape[0]
    if counts is None or n == 0:
        raise ValueError("estimate_entropy needs at least one activation")
    rates = (counts / n).float()
    bits = max(binary_entropy(rates).item(), 0.0) + 0.0  # + 0.0: no -0.0 for a constant code
    return EntropyEstimate(bits=bits, firing_rates=rates, n_samples=n)
