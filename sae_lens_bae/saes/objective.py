"""The BAE's objective: SAELens' ``mse_loss``, the entropy of the minibatch's mean code, and the
summed |off-diagonal covariance| of the code, for one BAE (codes [batch, n_bits]) or any leading
dimensions (codes [..., batch, n_bits], one objective each): :func:`bae_objective` sums them.

* :func:`minibatch_entropy`: measured on the minibatch (not per sample), so it pushes each bit's
  firing rate over the minibatch towards 0 or 1: the paper's argument for a code sparse across
  tokens. It does not guarantee one (how dense codes get on LLM states:
  docs/research/recipe-study.md).
* :func:`covariance_penalty`: the plain maths, exact. A faster exact path of the same signature
  (``sae_lens_bae.kernels.covariance_penalty``: tiles, int8 and sparse products, fused Triton
  kernels) plugs in where the objective is called (``code_penalties(covariance=...)``).
* ``batch``: every term is a property of the minibatch, reduced over ``saes.minibatch``'s
  ``LOCAL_BATCH`` (this process) or a data-parallel trainer's ``parallel.GlobalBatch``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.saes.input_frame import frame_factor
from sae_lens_bae.saes.minibatch import LOCAL_BATCH

__all__ = [
    "EXACT_FP32_BATCH",
    "CovariancePenalty",
    "autocast_off",
    "bae_objective",
    "binary_entropy",
    "penalty_input",
    "code_counts",
    "code_penalties",
    "covariance_penalty",
    "dense_covariance_penalty",
    "frame_weight",
    "minibatch_entropy",
    "reconstruction_loss",
    "squared_error",
    "with_loss",
]

_LN2 = math.log(2.0)


def autocast_off(device_type: str) -> contextlib.AbstractContextManager[object]:
    """``torch.autocast(device_type, enabled=False)`` where autocast is on, else a null context
    (entering an autocast object costs host time, and a small BAE's GPU step is host-bound)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


CovariancePenalty = Callable[..., Tensor]
"""A covariance penalty as :func:`covariance_penalty` computes it: ``(codes [..., batch, n], *,
binary, share, scale) -> [...]``; the seam through which a faster exact path
(``sae_lens_bae.kernels.covariance_penalty``) replaces the plain one."""


def reconstruction_loss(
    sae_out: Float[Tensor, "... d_in"], sae_in: Float[Tensor, "... d_in"]
) -> Float[Tensor, ""]:
    """Squared error averaged over every element (batch and d_in): the scale the recipes'
    coefficients are given against (SAELens' ``mse_loss`` sums over d_in, d_in times more)."""
    return (sae_out - sae_in.to(sae_out.dtype)).pow(2).mean()


class _BinaryEntropy(torch.autograd.Function):
    """Sum of binary entropies in bits, exact, with a finite gradient: the true derivative
    log2((1-p)/p) is infinite at p in {0, 1}, so backward clamps p to [eps, 1 - eps].
    ``binary_cross_entropy(p, p)`` is -[p ln p + (1-p) ln(1-p)] per bit in one kernel, and
    ``logit(p, eps)`` the clamped derivative in nats in one more."""

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
    """H(p) = -sum_i [p_i log2 p_i + (1-p_i) log2(1-p_i)] in bits (0 log 0 = 0) for firing rates
    p in [0, 1], times ``scale`` (a loss coefficient, applied with the change to bits). ``eps``
    only bounds the gradient at p in {0, 1}; the value is exact."""
    if not 0.0 < eps < 0.5:
        raise ValueError(f"eps must be in (0, 0.5), got {eps}")
    return _BinaryEntropy.apply(p, eps, float(scale))


def minibatch_entropy(codes: Float[Tensor, "... batch n"]) -> Float[Tensor, "..."]:
    """Entropy in bits of the minibatch's mean code; its gradient at p in {0, 1} is the one at
    half a sample (p = 1/(2 batch))."""
    if codes.ndim < 2:
        raise ValueError(
            f"minibatch_entropy needs codes of shape [..., batch, n], got {tuple(codes.shape)}"
        )
    batch = codes.shape[-2]
    return binary_entropy(codes.float().mean(-2), eps=min(0.5 / batch, 0.25))


def squared_error(
    sae_out: Float[Tensor, "... batch d_in"],
    sae_in: Float[Tensor, "... batch d_in"],
    batch: Any = LOCAL_BATCH,
) -> Float[Tensor, "..."]:
    """SAELens' ``mse_loss``: the squared error summed over d_in and averaged over the (global)
    minibatch, per leading index, in fp32 whatever the autocast dtype (a bf16 sum keeps 3
    digits)."""
    wide = torch.promote_types(sae_out.dtype, torch.float32)
    error = F.mse_loss(sae_out.to(wide), sae_in.to(wide), reduction="none").sum(-1)
    if batch.world == 1:
        return error.mean(-1)
    return batch.sum(error.sum(-1)) / (batch.world * error.shape[-1])


def frame_weight(input_frame: tuple[Tensor, Tensor] | None) -> Tensor | None:
    """What a BAE's penalties are multiplied by: 1 / k^2 for an input frame ``k (x + t)`` (the
    coefficients weigh them against the squared error in the frame's units, ``mse_loss`` is in
    the inputs' own); None without a frame."""
    if input_frame is None:
        return None
    return frame_factor(input_frame[0]).pow(-2)


def code_counts(bits: Float[Tensor, "... batch n_bits"], batch: Any = LOCAL_BATCH) -> Tensor:
    """How often each bit fired in the (global) minibatch, detached: [..., n_bits] (fp32, exact
    for minibatches below 2^24 rows); the mean code is ``counts / (batch.world * rows)``."""
    return batch.sum(bits.detach().float().sum(-2))


def code_penalties(
    bits: Float[Tensor, "... batch n_bits"],
    *,
    entropy_coefficient: float,
    covariance_coefficient: float,
    weight: Tensor | None = None,
    covariance_off: Tensor | None = None,
    batch: Any = LOCAL_BATCH,
    covariance: CovariancePenalty | None = None,
) -> dict[str, Tensor]:
    """The code's two terms on the (global) minibatch: ``entropy_loss`` (a_e times the entropy in
    bits of the mean code) and ``covariance_loss`` (a_c times the summed |off-diagonal
    covariance|, through ``covariance``: :func:`covariance_penalty` unless a faster exact path
    is given), each times ``weight`` (per leading index: :func:`frame_weight`). A coefficient of
    0 turns its term off (a zero, not computed); ``covariance_off``: per leading index, True where
    the covariance term is off."""
    rows = batch.world * bits.shape[-2]
    if entropy_coefficient != 0:  # a_e applied inside: no kernel of its own
        mean_code = (
            bits.float().mean(-2) if batch.world == 1 else batch.sum(bits.float().sum(-2)) / rows
        )
        entropy = binary_entropy(mean_code, min(0.5 / rows, 0.25), scale=entropy_coefficient)
    else:
        entropy = bits.new_zeros(bits.shape[:-2], dtype=torch.float32)
    if covariance_coefficient > 0:  # every rank computes its share; the shares add up
        penalty = (covariance or covariance_penalty)(
            batch.gather(bits, codes=True),
            binary=True,
            share=(batch.rank, batch.world),
            scale=covariance_coefficient,
        )
        if covariance_off is not None:
            penalty = penalty.masked_fill(covariance_off, 0.0)
        covariance_loss = batch.sum(penalty)
    else:
        covariance_loss = torch.zeros_like(entropy)
    if weight is not None:
        entropy, covariance_loss = entropy * weight, covariance_loss * weight
    return {"entropy_loss": entropy, "covariance_loss": covariance_loss}


def bae_objective(
    sae_in: Float[Tensor, "... batch d_in"],
    sae_out: Float[Tensor, "... batch d_in"],
    bits: Float[Tensor, "... batch n_bits"],
    **penalties: Any,
) -> dict[str, Tensor]:
    """The BAE's objective, per leading index: ``loss`` = ``mse_loss`` (SAELens':
    :func:`squared_error`, in the inputs' own units) + :func:`code_penalties`' terms, with every
    term returned. A BAE's training step is SAELens' (``mse_loss`` plus the terms its
    ``calculate_aux_loss`` returns); a stack and the held-out evaluation call this."""
    if bits.shape[:-1] != sae_in.shape[:-1] or sae_out.shape != sae_in.shape:
        raise ValueError(
            "bae_objective needs sae_in and sae_out of one shape [..., batch, d_in] and bits "
            f"[..., batch, n_bits]; got {tuple(sae_in.shape)}, {tuple(sae_out.shape)} and "
            f"{tuple(bits.shape)}"
        )
    batch = penalties.get("batch", LOCAL_BATCH)
    return with_loss(
        {"mse_loss": squared_error(sae_out, sae_in, batch), **code_penalties(bits, **penalties)}
    )


def with_loss(terms: dict[str, Tensor]) -> dict[str, Tensor]:
    """``terms`` (``mse_loss`` and :func:`code_penalties`' terms) with their sum as ``loss``."""
    terms["loss"] = terms["mse_loss"] + terms["entropy_loss"] + terms["covariance_loss"]
    return terms


# ----------------------------------------------------------------------------- covariance

EXACT_FP32_BATCH = 4096
"""Binary codes' B * (co-occurrence count) - c_i c_j are integers up to B^2: exact in fp32 for
B <= 4096 (B^2 <= 2^24); larger batches work in float64."""


def penalty_input(codes: Tensor, share: tuple[int, int]) -> Tensor:
    """``codes`` as a covariance penalty reads them (floating point), after refusing a shape,
    a batch or a share it cannot take."""
    if codes.ndim < 2:
        raise ValueError(
            f"covariance_penalty needs codes of shape [..., batch, n], got {tuple(codes.shape)}"
        )
    if codes.shape[-2] < 2:
        raise ValueError("covariance_penalty needs a batch of at least 2 samples")
    if not 0 <= share[0] < share[1]:
        raise ValueError(f"share must be (rank, world) with 0 <= rank < world, got {share}")
    return codes if codes.is_floating_point() else codes.float()


def covariance_penalty(
    codes: Float[Tensor, "... batch n"],
    *,
    binary: bool | None = None,
    share: tuple[int, int] = (0, 1),
    scale: float = 1.0,
) -> Float[Tensor, "..."]:
    """Sum of |off-diagonal entries| of the unbiased covariance of the code bits, times
    ``scale``, per leading index: the plain maths, which builds each n x n matrix whole
    (``sae_lens_bae.kernels.covariance_penalty`` computes the same exactly, in memory-bounded
    tiles, faster). For 0/1 codes H (``binary``; None: checked, which waits for the device) with
    column counts c, B(B-1) cov = B H^T H - c c^T is an integer matrix (exact in the work dtype);
    other codes are centred. ``share = (rank, world)``: the rank's share of the sum that the ranks
    of a data-parallel group add up (here 1 / world of it)."""
    codes = penalty_input(codes, share)
    if binary is None:
        binary = bool(((codes == 0) | (codes == 1)).all())
    batch = codes.shape[-2]
    with autocast_off(codes.device.type):  # bf16 outputs would round counts
        dtype = torch.promote_types(codes.dtype, torch.float32)
        if binary and batch > EXACT_FP32_BATCH:  # B * count reaches B^2 > 2^24: fp32 rounds
            dtype = torch.float64
        x = codes.to(dtype)
        if binary:
            counts = x.sum(-2)
            scaled = batch * (x.mT @ x) - counts.unsqueeze(-1) * counts.unsqueeze(-2)
            norm = float(batch) * (batch - 1)
        else:
            centred = x - x.mean(-2, keepdim=True)
            scaled, norm = centred.mT @ centred, float(batch - 1)
        total = scaled.abs().sum((-2, -1), dtype=torch.float64)
        total = total - scaled.diagonal(dim1=-2, dim2=-1).abs().sum(-1, dtype=torch.float64)
        return (total * (scale / (norm * share[1]))).to(dtype)


def dense_covariance_penalty(codes: Float[Tensor, "batch n"]) -> Float[Tensor, ""]:
    """Reference through ``torch.cov``: O(n^2) memory; for tests and benchmarks."""
    cov = torch.cov(codes.T)
    return cov.abs().sum() - cov.diagonal().abs().sum()
