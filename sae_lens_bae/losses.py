"""The loss terms of the Binary Autoencoder, usable outside training, and ``bae_objective``, the
one function every BAE trainer (a single BAE, a stack of G) computes its training losses with.

* :func:`reconstruction_loss`: squared error, averaged over batch *and* dimensions.
* :func:`minibatch_entropy`: entropy in bits of the mean code of a minibatch. Measured on the
  minibatch (not per sample), so minimising it makes codes sparse *globally*: a channel that fires
  on every token costs as much as one that never does, so there are no dense features.
* :func:`covariance_penalty`: sum of the absolute off-diagonal covariances of the code channels,
  computed exactly in tiles so that a 65536-channel code never needs its 16 GiB covariance matrix.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.global_batch import GlobalBatch

__all__ = [
    "LOSS_TERMS",
    "bae_objective",
    "binary_entropy",
    "covariance_penalty",
    "dense_covariance_penalty",
    "minibatch_entropy",
    "reconstruction_loss",
    "total_loss",
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
    """

    @staticmethod
    def forward(ctx, p: Tensor, eps: float) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(p)
        ctx.eps = eps
        q = 1.0 - p
        return -(torch.special.xlogy(p, p) + torch.special.xlogy(q, q)).sum(-1) / _LN2

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        (p,) = ctx.saved_tensors
        pc = p.clamp(ctx.eps, 1.0 - ctx.eps)
        return grad_out.unsqueeze(-1) * torch.log2((1.0 - pc) / pc), None


def binary_entropy(p: Float[Tensor, "... n"], eps: float = 1e-6) -> Float[Tensor, "..."]:
    """H(p) = -sum_i [p_i log2 p_i + (1-p_i) log2(1-p_i)] in bits, with 0 log 0 = 0.

    ``eps`` only bounds the gradient at p in {0, 1}; the value is exact.
    """
    if not 0.0 < eps < 0.5:
        raise ValueError(f"eps must be in (0, 0.5), got {eps}")
    return _BinaryEntropy.apply(p, eps)  # type: ignore[no-any-return]


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


def _tiles(
    n: int, block: int, share: tuple[int, int] = (0, 1)
) -> Iterator[tuple[slice, slice, bool]]:
    """Upper-triangular tiles (I <= J) of an n x n matrix; the flag marks diagonal tiles.

    ``share = (rank, world)``: only every world-th tile from the rank-th, the band of tiles one
    rank of a data-parallel group owns.
    """
    rank, world = share
    index = 0
    for i0 in range(0, n, block):
        for j0 in range(i0, n, block):
            if index % world == rank:
                yield slice(i0, min(i0 + block, n)), slice(j0, min(j0 + block, n)), i0 == j0
            index += 1


def _bf16_products(a: Tensor) -> bool:
    """Whether small-integer products run as bf16 matmuls with fp32 accumulation (on CUDA)."""
    return a.is_cuda


def _integer_mm(a: Tensor, b: Tensor) -> Tensor:
    """fp32 (batched) product of matrices with small-integer entries (0/1 codes, -1/0/1 signs).

    On CUDA it multiplies bf16 inputs with fp32 accumulation and output: exact for such entries and
    several times faster than fp32. Elsewhere fp32, exact while sums stay below 2**24.
    """
    if _bf16_products(a):
        mm = torch.mm if a.ndim == 2 else torch.bmm
        try:
            return mm(a.bfloat16(), b.bfloat16(), out_dtype=torch.float32)
        except TypeError:  # a torch without mm(out_dtype=...); anything else (OOM) propagates
            pass
    return a.float() @ b.float()


_SIGN_CACHE_LIMIT = 1 << 24
"""Codes with at most this many covariance entries in all (n <= 4096 for one BAE) keep the
forward's sign tiles as int8 for backward (at most 16 MiB, less than the [batch, n] codes) instead
of recomputing them: a quarter fewer matmul FLOPs."""

_EXACT_FP32_BATCH = 4096
"""The binary path computes B * (co-occurrence count) - c_i c_j, integers up to B^2: exact in
fp32 for B <= 4096 (B^2 <= 2^24); larger batches work in float64, exact up to B = 2^26."""

_TILE_ELEMENTS = 1 << 22
"""Default tile: at most this many entries over the whole stack (2048 x 2048 for one BAE)."""


class _CovariancePenalty(torch.autograd.Function):
    """D = sum_{i != j} |cov_ij| over upper-triangular tiles, recomputing tiles in backward
    (above ``_SIGN_CACHE_LIMIT`` entries; smaller codes keep their int8 sign tiles).

    Codes come as a stack [G, B, n] (G = 1 for one BAE); every tile is a batched matmul, so G small
    BAEs cost one kernel per tile instead of G. Binary codes H (batch B, column counts c):
    B(B-1) cov = B H^T H - c c^T, where H^T H counts co-occurrences, so every tile and its sign are
    exact integers. The gradient is dD/dH = 2/(B-1) (H - 1 p^T) S with S = sign(cov) (zero
    diagonal), and (H - 1 p^T) S = H S - 1 (c^T S) / B is an integer product too. Other codes are
    centred first and go through the same tiles in fp32 (or in their own dtype if wider).
    Extra memory: the [G, B, n] gradient plus a few [G, block, block] tiles.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, codes: Tensor, block: int, binary: bool | None, share: tuple[int, int]
    ) -> Tensor:
        with torch.autocast(codes.device.type, enabled=False):  # bf16 outputs would round counts
            return _CovariancePenalty._forward(ctx, codes, block, binary, share)

    @staticmethod
    def _forward(
        ctx, codes: Tensor, block: int, binary: bool | None, share: tuple[int, int]
    ) -> Tensor:
        groups, batch, n = codes.shape
        if binary is None:  # a host sync: callers that know (training) say so
            binary = bool(((codes == 0) | (codes == 1)).all())
        work_dtype = torch.promote_types(codes.dtype, torch.float32)
        if binary and batch > _EXACT_FP32_BATCH:  # B * count reaches B^2 > 2^24: fp32 rounds
            work_dtype = torch.float64
        x = codes.detach()
        if binary:
            counts = x.sum(1, dtype=work_dtype)
            if x.is_cuda:
                x = x.bfloat16()  # exact for 0/1, half the memory of fp32
            norm = float(batch) * (batch - 1)
        else:
            x = (x - x.mean(1, keepdim=True)).to(work_dtype)
            counts = None
            norm = float(batch - 1)
        total = torch.zeros(groups, dtype=torch.float64, device=codes.device)
        signs: list[Tensor] | None = [] if groups * n * n <= _SIGN_CACHE_LIMIT else None
        for rows, cols, diagonal in _tiles(n, block, share):
            tile = _scaled_cov_tile(x, counts, rows, cols, work_dtype)
            if signs is not None:
                signs.append(tile.sign().to(torch.int8))
            tile = tile.abs_()
            tile_sum = tile.sum(dim=(1, 2), dtype=torch.float64)
            if diagonal:
                total += tile_sum - tile.diagonal(dim1=1, dim2=2).sum(1, dtype=torch.float64)
            else:
                total += 2.0 * tile_sum
        ctx.save_for_backward(x, counts if counts is not None else x.new_empty(0))
        ctx.block, ctx.binary, ctx.work_dtype, ctx.signs = block, binary, work_dtype, signs
        ctx.share = share
        return (total / norm).to(work_dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        with torch.autocast(grad_out.device.type, enabled=False):
            return _CovariancePenalty._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None, None]:
        x, counts = ctx.saved_tensors
        binary, dtype = ctx.binary, ctx.work_dtype
        groups, batch, n = x.shape
        grad = torch.zeros(groups, batch, n, dtype=dtype, device=x.device)
        sign_sums = torch.zeros(groups, 1, n, dtype=dtype, device=x.device)  # c^T S (binary)
        for index, (rows, cols, diagonal) in enumerate(_tiles(n, ctx.block, ctx.share)):
            if ctx.signs is not None:
                sign = ctx.signs[index].to(dtype)
            else:
                sign = _scaled_cov_tile(x, counts if binary else None, rows, cols, dtype).sign_()
            if diagonal:
                sign.diagonal(dim1=1, dim2=2).zero_()
            grad[:, :, cols] += _matmul(x[:, :, rows], sign, binary)
            if binary:
                sign_sums[:, :, cols] += counts[:, None, rows] @ sign
            if not diagonal:
                grad[:, :, rows] += _matmul(x[:, :, cols], sign.transpose(1, 2), binary)
                if binary:
                    sign_sums[:, :, rows] += counts[:, None, cols] @ sign.transpose(1, 2)
        if binary:
            grad -= sign_sums / batch
        grad *= grad_out.to(dtype).view(groups, 1, 1) * (2.0 / (batch - 1))
        return grad, None, None, None


def _matmul(a: Tensor, b: Tensor, integer_entries: bool) -> Tensor:
    return _integer_mm(a, b) if integer_entries else a @ b


def _scaled_cov_tile(
    x: Tensor, counts: Tensor | None, rows: slice, cols: slice, dtype: torch.dtype
) -> Tensor:
    """Covariance tiles [G, rows, cols] times B(B-1) for binary codes (integers: exact sign), else
    times B-1."""
    product = _matmul(x[:, :, rows].transpose(1, 2), x[:, :, cols], counts is not None).to(dtype)
    if counts is None:
        return product
    outer = counts[:, rows, None] * counts[:, None, cols]
    return product.mul_(x.shape[1]).sub_(outer)


def covariance_penalty(
    codes: Float[Tensor, "*stack batch n"],
    block_size: int | None = None,
    *,
    binary: bool | None = None,
    share: tuple[int, int] = (0, 1),
) -> Float[Tensor, "*stack"]:
    """Sum of |off-diagonal entries| of the unbiased covariance of the code channels.

    Exact and memory-bounded: the n x n covariance is never built. It is computed in
    ``block_size`` x ``block_size`` tiles, using its symmetry, and recomputed tile by tile in
    backward. The default tile holds at most 4M entries over the stack (2048 x 2048, or n if
    smaller, for one BAE). At n = 65536, batch 512 the extra memory is a few hundred MiB instead of
    the dense version's 16 GiB per n x n matrix. Pure 0/1 codes take an exact integer path (bf16
    matmuls with fp32 accumulation on CUDA). Leading dimensions are a stack of independent code
    sets (one per BAE of a ``StackedBAE``), each with its own penalty, computed by batched matmuls.
    ``binary``: whether the codes are all 0/1 (None: checked, which waits for the device; a
    training step passes True, its codes come from the step function).
    ``share = (rank, world)``: only the rank's band of tiles (every world-th), a partial sum that
    the ranks of a data-parallel group add up (``bae_objective`` with a ``GlobalBatch``).
    """
    if codes.ndim < 2:
        raise ValueError(
            f"covariance_penalty needs codes of shape [..., batch, n], got {tuple(codes.shape)}"
        )
    if codes.shape[-2] < 2:
        raise ValueError("covariance_penalty needs a batch of at least 2 samples")
    if block_size is not None and block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if not codes.is_floating_point():
        codes = codes.float()
    stack, (batch, n) = codes.shape[:-2], codes.shape[-2:]
    groups = math.prod(stack)
    block = block_size or min(n, max(128, math.isqrt(_TILE_ELEMENTS // max(groups, 1))))
    if not 0 <= share[0] < share[1]:
        raise ValueError(f"share must be (rank, world) with 0 <= rank < world, got {share}")
    penalty = _CovariancePenalty.apply(codes.reshape(groups, batch, n), block, binary, share)
    return penalty.reshape(stack)  # type: ignore[no-any-return]


def dense_covariance_penalty(codes: Float[Tensor, "batch n"]) -> Float[Tensor, ""]:
    """Reference through ``torch.cov``: O(n^2) memory; for tests and benchmarks."""
    cov = torch.cov(codes.T)
    return cov.abs().sum() - cov.diagonal().abs().sum()


def bae_objective(
    sae_in: Float[Tensor, "*stack batch d_in"],
    sae_out: Float[Tensor, "*stack batch d_in"],
    bits: Float[Tensor, "*stack batch n_bits"],
    *,
    entropy_coefficient: float,
    covariance_coefficient: float,
    firing_coefficient: float = 0.0,
    entropy_on: bool = True,
    covariance_block_size: int | None = None,
    batch: GlobalBatch | None = None,
    global_bits: Float[Tensor, "*stack global_batch n_bits"] | None = None,
) -> dict[str, Float[Tensor, "*stack"]]:
    """The BAE's training loss terms for a minibatch, per member of a stack of BAEs.

    Returns the terms of ``LOSS_TERMS``: ``reconstruction_loss`` (squared error averaged over the
    batch and d_in), ``entropy_loss`` (``entropy_coefficient`` times the minibatch entropy in bits,
    zero while ``entropy_on`` is False), ``covariance_loss`` (``covariance_coefficient`` times the
    summed |off-diagonal covariance| of the bits), ``firing_loss`` (``firing_coefficient`` times
    the summed firing rates of the minibatch, i.e. the mean number of active bits per sample: the
    entropy is symmetric in p and 1 - p, so without it a channel that is always on costs as
    little as one that never fires), and ``batch_entropy_bits`` (the entropy, detached, for
    logging). Each has the shape of the leading ``stack`` dimensions: () for one BAE, [G] for a
    ``StackedBAE``. ``total_loss`` sums the terms; every trainer calls this one function, so a
    change to the objective is made once.

    ``batch``: in data-parallel training, the ranks' minibatches as one (``GlobalBatch.of()``):
    every term is then the one of the concatenated global minibatch, on every rank, and its
    gradient is what ``DistributedDataParallel`` averages into the single-process gradient.
    ``global_bits``: ``batch.gather(bits, codes=True)`` if the caller already has it.
    """
    if bits.shape[:-1] != sae_in.shape[:-1] or sae_out.shape != sae_in.shape:
        raise ValueError(
            "bae_objective needs sae_in and sae_out of one shape [*stack, batch, d_in] and bits "
            f"[*stack, batch, n_bits]; got {tuple(sae_in.shape)}, {tuple(sae_out.shape)} and "
            f"{tuple(bits.shape)}"
        )
    # in fp32 whatever the autocast dtype: a bf16 mean would round the loss to 3 digits
    wide = torch.promote_types(sae_out.dtype, torch.float32)
    squared = (sae_out.to(wide) - sae_in.to(wide)).pow(2)
    batch = batch or GlobalBatch.local()
    rows = batch.rows(bits.shape[-2])
    if batch.world == 1:
        reconstruction = squared.mean(dim=(-2, -1))
        mean_code = bits.float().mean(dim=-2)
    else:  # sums over the ranks, divided by the global count
        reconstruction = batch.sum(squared.sum(dim=(-2, -1))) / (rows * squared.shape[-1])
        mean_code = batch.sum(bits.float().sum(dim=-2)) / rows
    entropy_bits = binary_entropy(mean_code, eps=min(0.5 / rows, 0.25))  # minibatch_entropy's
    zero = torch.zeros_like(entropy_bits)
    entropy = entropy_coefficient * entropy_bits if entropy_on else zero
    if covariance_coefficient > 0:
        # every rank computes its band of tiles on the gathered codes; the bands add up
        penalty = covariance_penalty(
            batch.gather(bits, codes=True) if global_bits is None else global_bits,
            covariance_block_size,
            binary=True,
            share=(batch.rank, batch.world),
        )
        covariance = covariance_coefficient * batch.sum(penalty)
    else:
        covariance = zero
    if firing_coefficient > 0:
        firing = firing_coefficient * mean_code.sum(-1).to(zero.dtype)
    else:
        firing = zero
    return {
        "reconstruction_loss": reconstruction,
        "entropy_loss": entropy,
        "covariance_loss": covariance,
        "firing_loss": firing,
        "batch_entropy_bits": entropy_bits.detach(),
    }


LOSS_TERMS = ("reconstruction_loss", "entropy_loss", "covariance_loss", "firing_loss")
"""The terms of ``bae_objective`` that make up the training loss, in the order they are summed."""


def total_loss(terms: dict[str, Tensor]) -> Tensor:
    """The training loss of ``bae_objective``'s terms, summed in one order by every trainer."""
    total = terms[LOSS_TERMS[0]]
    for name in LOSS_TERMS[1:]:
        total = total + terms[name]
    return total
