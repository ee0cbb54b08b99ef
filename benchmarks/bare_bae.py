"""The bare BAE: the paper's equations and nothing else, the yardstick every piece of the
package's BAE is measured against (docs/research/ablation.md), with one addition the package
shares with every SAELens SAE: an encoder bias ``b_enc`` (the paper's encoder has none). Short
enough to check by eye:

    h_B   = step(h0 W_enc + b_enc)                 surrogate gradient: d/dx sigmoid(x)
    h_rec = h_B W_dec + b_dec
    loss  = ||h0 - h_rec||^2 (batch mean) + a_e H(mean_batch h_B) + a_c sum_{i!=j} |cov(h_B)_ij|

trained by Adam at a constant rate on the minibatches given. ``max_grad_norm`` is the one
switch: SAELens' ``SAETrainer`` clips every SAE's gradient to norm 1, so the package's BAE with
every extra of its own switched off equals this loop with ``max_grad_norm=1.0``
(tests/test_bare_bae.py). Not part of the package's API.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn


class BareBAE(nn.Module):
    """Encoder with bias, step, decoder with bias; weights given (e.g. copied from another
    model's initialisation, so two implementations start from one point)."""

    def __init__(self, W_enc: Tensor, b_enc: Tensor, W_dec: Tensor, b_dec: Tensor) -> None:
        super().__init__()
        self.W_enc, self.b_enc = nn.Parameter(W_enc.clone()), nn.Parameter(b_enc.clone())
        self.W_dec, self.b_dec = nn.Parameter(W_dec.clone()), nn.Parameter(b_dec.clone())

    def forward(self, h0: Tensor) -> tuple[Tensor, Tensor]:
        """(h_B, h_rec): the code (values 0/1, the sigmoid's derivative as its gradient) and the
        reconstruction."""
        pre = h0 @ self.W_enc + self.b_enc
        smooth = torch.sigmoid(pre)
        bits = (pre >= 0).to(pre.dtype) + (smooth - smooth.detach())
        return bits, bits @ self.W_dec + self.b_dec


def minibatch_entropy(bits: Tensor) -> Tensor:
    """H of the minibatch's mean code, in bits. The derivative log2((1-p)/p) is infinite at p in
    {0, 1}: it is taken at half a sample from the edge (the clamp passes gradients through)."""
    p = bits.mean(0)
    edge = 0.5 / bits.shape[0]
    q = p + (p.clamp(edge, 1 - edge) - p).detach()
    return -(q * q.log2() + (1 - q) * (1 - q).log2()).sum()


def covariance_penalty(bits: Tensor) -> Tensor:
    """Sum of |off-diagonal entries| of the code's unbiased covariance, written for 0/1 codes as
    (B H^T H - c c^T) / (B (B - 1)) with column counts c (integers: no rounding in the sum)."""
    batch = bits.shape[0]
    counts = bits.sum(0)
    scaled = batch * (bits.T @ bits) - counts[:, None] * counts[None, :]
    off_diagonal = scaled.abs().sum() - scaled.diagonal().abs().sum()
    return off_diagonal / (batch * (batch - 1))


def bare_loss(bae: BareBAE, h0: Tensor, a_e: float, a_c: float) -> Tensor:
    bits, h_rec = bae(h0)
    reconstruction = (h0 - h_rec).pow(2).sum(-1).mean()
    return reconstruction + a_e * minibatch_entropy(bits) + a_c * covariance_penalty(bits)


def train_bare(
    bae: BareBAE,
    batches: Iterable[Tensor],
    *,
    a_e: float,
    a_c: float,
    lr: float,
    max_grad_norm: float | None = None,
) -> BareBAE:
    """Adam (betas 0.9, 0.999) at ``lr`` on every batch of ``batches``, in place."""
    optimizer = torch.optim.Adam(bae.parameters(), lr=lr, betas=(0.9, 0.999))
    for h0 in batches:
        bare_loss(bae, h0, a_e, a_c).backward()
        if max_grad_norm is not None:
            nn.utils.clip_grad_norm_(bae.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
    return bae
