"""The loss terms of the Binary Autoencoder, usable outside training, and ``bae_objective``, the
one function every BAE trainer (a single BAE, a stack of G) computes its training losses with.

* :func:`reconstruction_loss`: squared error, averaged over batch *and* dimensions.
* :func:`minibatch_entropy`: entropy in bits of the mean code of a minibatch. Measured on the
  minibatch (not per sample), so minimising it makes codes sparse *globally*: a channel that fires
  on every token costs as much as one that never does, so there are no dense features.
* :func:`covariance_penalty` (from :mod:`sae_lens_bae.covariance`): sum of the absolute
  off-diagonal covariances of the code channels, computed exactly in tiles so that a 65536-channel
  code never needs its 16 GiB covariance matrix.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.covariance import autocast_off, covariance_penalty, dense_covariance_penalty
from sae_lens_bae.global_batch import GlobalBatch

__all__ = [
    "LOSS_TERMS",
    "bae_objective",
    "binary_entropy",
    "covariance_penalty",
    "dense_covariance_penalty",
    "minibatch_entropy",
    "reconstruction_loss",
]

_LN2 = math.log(2.0)


def reconstruction_loss(
    sae_out: Float[Tensor, "... d_in"], sae_in: Float[Tensor, "... d_in"]
) -> Float[Tensor, ""]:
    """Squared error averaged over every element (batch and d_in).

    The default BAE coefficients (a_e = a_c = 1e-7) were tuned against this scale. SAELens' own
    ``mse_loss`` (``TrainingSAE.training_forward_pass``) sums over d_in before averaging over the
    batch, so it is d_in times larger than this loss.
    """
    return (sae_out - sae_in.to(sae_out.dtype)).pow(2).mean()


class _BinaryEntropy(torch.autograd.Function):
    """Sum of binary entropies in bits with an exact value and a finite gradient.

    The true derivative log2((1-p)/p) is infinite at p in {0, 1}; the backward clamps p to
    [eps, 1 - eps] so a dead or always-on channel gets a large but finite push.

    Both directions take few kernels (a small BAE's GPU step costs its launches):
    ``binary_cross_entropy(p, p)`` is -[p ln p + (1-p) ln(1-p)] per channel (0 at p in {0, 1},
    its logs clamped at -100 where they meet 0 factors), and ``logit(p, eps)`` is
    ln(p / (1-p)) of p clamped to [eps, 1 - eps], minus the derivative in nats.
    """

    @staticmethod
    def forward(ctx, p: Tensor, eps: float, scale: float) -> Tensor:
        ctx.save_for_backward(p)
        ctx.eps, ctx.scale = eps, scale
        with autocast_off(p.device.type):  # autocast refuses it: p is fp32
            if p.ndim == 1:  # one BAE: the sum in the same kernel
                nats = F.binary_cross_entropy(p, p, reduction="sum")
            else:
                nats = F.binary_cross_entropy(p, p, reduction="none").sum(-1)
        return nats * (scale / _LN2)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None]:
        (p,) = ctx.saved_tensors
        return torch.logit(p, ctx.eps) * (grad_out * (-ctx.scale / _LN2)).unsqueeze(-1), None, None


def binary_entropy(
    p: Float[Tensor, "... n"], eps: float = 1e-6, scale: float = 1.0
) -> Float[Tensor, "..."]:
    """H(p) = -sum_i [p_i log2 p_i + (1-p_i) log2(1-p_i)] in bits, with 0 log 0 = 0, for p in
    [0, 1] (firing rates; torch refuses others: a RuntimeError on CPU, a device assert on CUDA),
    times ``scale`` (a loss coefficient, applied with the change to bits: no kernel of its own in
    forward or backward).

    ``eps`` only bounds the gradient at p in {0, 1}; the value is exact.
    """
    if not 0.0 < eps < 0.5:
        raise ValueError(f"eps must be in (0, 0.5), got {eps}")
    return _BinaryEntropy.apply(p, eps, float(scale))


def minibatch_entropy(codes: Float[Tensor, "... batch n"]) -> Float[Tensor, "..."]:
    """Entropy in bits of the minibatch's mean code p = mean_batch(codes).

    Leading dimensions (e.g. a stack of G BAEs) are kept: the result has shape ``codes.shape[:-2]``.
    The gradient at p in {0, 1} is the one at half a sample (p = 1/(2 batch)), so it stays finite
    and in line with its neighbours.
    """
    if codes.ndim < 2:
        raise ValueError(
            f"minibatch_entropy needs codes of shape [..., batch, n], got {tuple(codes.shape)}"
        )
    batch = codes.shape[-2]
    return binary_entropy(codes.float().mean(-2), eps=min(0.5 / batch, 0.25))


def bae_objective(
    sae_in: Float[Tensor, "*stack batch d_in"],
    sae_out: Float[Tensor, "*stack batch d_in"],
    bits: Float[Tensor, "*stack batch n_bits"],
    *,
    entropy_coefficient: float,
    covariance_coefficient: float,
    entropy_on: bool = True,
    covariance_block_size: int | None = None,
    batch: GlobalBatch | None = None,
    global_bits: Float[Tensor, "*stack global_batch n_bits"] | None = None,
    covariance_off: Float[Tensor, "*stack"] | None = None,
) -> dict[str, Float[Tensor, "*stack"]]:
    """The BAE's training loss terms for a minibatch, per member of a stack of BAEs.

    Returns the terms of ``LOSS_TERMS``: ``reconstruction_loss`` (squared error averaged over the
    batch and d_in), ``entropy_loss`` (``entropy_coefficient`` times the minibatch entropy in
    bits, zero while ``entropy_on`` is False) and ``covariance_loss`` (``covariance_coefficient``
    times the summed |off-diagonal covariance| of the bits); and ``batch_entropy_bits`` (the
    entropy, detached, for logging). Each has the shape of the leading ``stack`` dimensions: ()
    for one BAE, [G] for a ``StackedBAE``. Beside them, ``batch_mean_code`` (detached, [*stack,
    n_bits]): the mean code the entropy was measured on, which trainers fold into their running
    mean code (one reduction over the codes, not two); and ``loss``, the training loss: the terms
    summed in that order, those that are off left out (they add zero, and a kernel). Every
    trainer calls this one function, so a change to the objective is made once.

    ``batch``: in data-parallel training, the ranks' minibatches as one (``GlobalBatch.of()``):
    every term is then the one of the concatenated global minibatch, on every rank, and its
    gradient is what ``DistributedDataParallel`` averages into the single-process gradient.
    ``global_bits``: ``batch.gather(bits, codes=True)`` if the caller already has it.
    ``covariance_off``: per member of a stack, True where that BAE trains without the covariance
    term (its final phase after it converged).
    """
    if bits.shape[:-1] != sae_in.shape[:-1] or sae_out.shape != sae_in.shape:
        raise ValueError(
            "bae_objective needs sae_in and sae_out of one shape [*stack, batch, d_in] and bits "
            f"[*stack, batch, n_bits]; got {tuple(sae_in.shape)}, {tuple(sae_out.shape)} and "
            f"{tuple(bits.shape)}"
        )
    # in fp32 whatever the autocast dtype: a bf16 mean would round the loss to 3 digits
    wide = torch.promote_types(sae_out.dtype, torch.float32)
    out, target = sae_out.to(wide), sae_in.to(wide)
    batch = batch or GlobalBatch.local()
    rows = batch.rows(bits.shape[-2])
    if batch.world == 1:
        reconstruction = _squared_error(out, target, "mean")
        mean_code = bits.float().mean(dim=-2)
    else:  # sums over the ranks, divided by the global count
        summed = batch.sum(_squared_error(out, target, "sum"))
        reconstruction = summed / (rows * sae_in.shape[-1])
        mean_code = batch.sum(bits.float().sum(dim=-2)) / rows
    eps = min(0.5 / rows, 0.25)  # minibatch_entropy's
    if entropy_on and entropy_coefficient != 0:  # a_e applied inside: no kernel of its own
        entropy = binary_entropy(mean_code, eps, scale=entropy_coefficient)
        entropy_bits = entropy.detach() * (1.0 / entropy_coefficient)
        zero = _zero_term(entropy_bits)
    else:
        entropy_bits = binary_entropy(mean_code.detach(), eps)
        entropy = zero = _zero_term(entropy_bits)
    if covariance_coefficient > 0:
        # every rank computes its band of tiles on the gathered codes; the bands add up
        penalty = covariance_penalty(  # a_c applied inside: no kernel of its own either way
            batch.gather(bits, codes=True) if global_bits is None else global_bits,
            covariance_block_size,
            binary=True,
            share=(batch.rank, batch.world),
            scale=covariance_coefficient,
        )
        covariance = batch.sum(penalty)
        if covariance_off is not None:
            covariance = covariance.masked_fill(covariance_off, 0.0)
    else:
        covariance = zero
    loss = reconstruction
    if entropy_on and entropy_coefficient != 0:
        loss = loss + entropy
    if covariance_coefficient > 0:
        loss = loss + covariance
    return {
        "loss": loss,
        "reconstruction_loss": reconstruction,
        "entropy_loss": entropy,
        "covariance_loss": covariance,
        "batch_entropy_bits": entropy_bits.detach(),
        "batch_mean_code": mean_code.detach(),
    }


_ZEROS: dict[tuple[torch.device, torch.dtype], Tensor] = {}
"""One zero per device and dtype: the terms that are off this step are views of it."""


def _zero_term(like: Tensor) -> Tensor:
    """A term that is off (zero) with ``like``'s shape, device and dtype: outside a compiled graph
    a view of a zero made once, which costs no kernel and which the loss leaves out of its
    sum (a small BAE's GPU step costs its launches)."""
    if torch.compiler.is_compiling():  # a compiled graph fuses it anyway
        return torch.zeros_like(like)
    key = (like.device, like.dtype)
    if key not in _ZEROS:
        _ZEROS[key] = torch.zeros((), dtype=like.dtype, device=like.device)
    return _ZEROS[key].expand(like.shape)


def _squared_error(out: Tensor, target: Tensor, reduction: str) -> Tensor:
    """Squared error over the last two dimensions (batch, d_in), per member of a stack: one
    ``mse_loss`` kernel (and one in backward) for a single BAE."""
    if out.ndim == 2:
        return F.mse_loss(out, target, reduction=reduction)
    error = F.mse_loss(out, target, reduction="none")
    return error.mean(dim=(-2, -1)) if reduction == "mean" else error.sum(dim=(-2, -1))


LOSS_TERMS = ("reconstruction_loss", "entropy_loss", "covariance_loss")
"""The terms of ``bae_objective`` that make up the training loss, in the order they are summed."""
