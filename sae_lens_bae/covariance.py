"""The covariance penalty of the BAE objective: the sum of the absolute off-diagonal covariances
of the code channels, exact, in tiles (a 65536-channel code never builds its 16 GiB matrix).

Binary codes make every tile an integer product, exact: on CUDA with triton, fused kernels that
never write a covariance tile to memory, only its sign where the sign matrix fits
(``fused_covariance``); elsewhere tiles of matmuls (bf16 on CUDA,
int8 on CPU) or, for very sparse codes on CPU, sums over the entries that are 1
(``covariance_products``). The tests check every way against ``torch.cov`` and each other.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.covariance_products import (
    DenseProducts,
    Products,
    binary_products,
)
from sae_lens_bae.fused_covariance import (
    band_tiles,
    fused_gradient,
    fused_penalty,
)
from sae_lens_bae.fused_covariance_ops import compiled_penalty, fused_applies

__all__ = ["autocast_off", "covariance_penalty", "dense_covariance_penalty"]


def autocast_off(device_type: str) -> contextlib.AbstractContextManager[object]:
    """``torch.autocast(device_type, enabled=False)`` where autocast is on, else a null context:
    entering and leaving an autocast object costs about 8 us of host time, and a GPU step of a
    small BAE is host-bound (``benchmarks/train_step.py --profile``)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def _tiles(
    n: int, block: int, share: tuple[int, int] = (0, 1)
) -> Iterator[tuple[slice, slice, bool]]:
    """Upper-triangular tiles (I <= J) of an n x n matrix; the flag marks diagonal tiles.

    ``share = (rank, world)``: only every world-th tile from the rank-th, the band of tiles one
    rank of a data-parallel group owns.
    """
    for i, j in band_tiles(-(-n // block), share):
        yield (
            slice(i * block, min((i + 1) * block, n)),
            slice(j * block, min((j + 1) * block, n)),
            i == j,
        )


_SIGN_CACHE_LIMIT = 1 << 24
"""Codes with at most this many covariance entries in all (n <= 4096 for one BAE) keep the
forward's sign tiles as int8 for backward (at most 16 MiB, less than the [batch, n] codes) instead
of recomputing them: a quarter fewer matmul FLOPs."""

_EXACT_FP32_BATCH = 4096
"""The binary path computes B * (co-occurrence count) - c_i c_j, integers up to B^2: exact in
fp32 for B <= 4096 (B^2 <= 2^24); larger batches work in float64, exact up to B = 2^26."""
_EXACT_INT32_BATCH = 46340
"""... and in int32 (the int8 products' tiles) for B <= 46340 (B^2 < 2^31)."""

_TILE_ELEMENTS = {"cuda": 1 << 22, "cpu": 1 << 19}
"""Default tile: at most this many entries over the whole stack, per device type (2048 x 2048 for
one BAE on CUDA; 724 x 724 elsewhere, where a tile that stays in the cache is faster:
``benchmarks/train_step.py`` times both)."""


def _default_block(n: int, groups: int, device: torch.device) -> int:
    """Tile side for n channels: the widest that the device's tile budget allows, then evened out
    so that the tiles divide n as equally as possible (no thin remainder tile, and the triangle of
    tiles covers fewer entries: 3 tiles of 1152 for n = 2304 instead of 2048, 2048 x 256 and
    256 x 256)."""
    budget = _TILE_ELEMENTS.get(device.type, _TILE_ELEMENTS["cpu"])
    widest = min(n, max(128, math.isqrt(budget // max(groups, 1))))
    return -(-n // -(-n // widest))


class _CovariancePenalty(torch.autograd.Function):
    """D = sum_{i != j} |cov_ij| over upper-triangular tiles, recomputing tiles in backward
    (above ``_SIGN_CACHE_LIMIT`` entries; smaller codes keep their int8 sign tiles).

    Codes come as a stack [G, B, n] (G = 1 for one BAE); every tile is a batched matmul (one
    int8 matmul per member on CPU, still faster than fp32 batched ones for stacks of small BAEs:
    docs/research/benchmarks.md), so G small BAEs share the tiles' work. Binary codes H (batch
    B, column counts c):
    B(B-1) cov = B H^T H - c c^T, where H^T H counts co-occurrences, so every tile and its sign are
    exact integers. The gradient is dD/dH = 2/(B-1) (H - 1 p^T) S with S = sign(cov) (zero
    diagonal), and (H - 1 p^T) S = H S - 1 (c^T S) / B is an integer product too (c^T S: the
    column sums of H S, integers summed in int32 on the int8 path). Flipping a
    channel (1 - H_i) flips the sign of its row and column of cov: D is unchanged and the gradient
    of H_i is minus that of 1 - H_i (the sparse path). Other codes are centred first and go through
    the same tiles in fp32 (or in their own dtype if wider).
    Extra memory: the [G, B, n] gradient plus a few [G, block, block] tiles.
    """

    @staticmethod
    def forward(
        ctx,
        codes: Tensor,
        block: int | None,
        binary: bool | None,
        share: tuple[int, int],
        scale: float,
    ) -> Tensor:
        with autocast_off(codes.device.type):  # bf16 outputs would round counts
            ctx.scale = scale
            return _CovariancePenalty._forward(ctx, codes, block, binary, share)

    @staticmethod
    def _forward(
        ctx, codes: Tensor, block: int | None, binary: bool | None, share: tuple[int, int]
    ) -> Tensor:
        groups, batch, n = codes.shape
        if binary is None:  # a host sync: callers that know (training) say so
            binary = bool(((codes == 0) | (codes == 1)).all())
        work_dtype = torch.promote_types(codes.dtype, torch.float32)
        if binary and batch > _EXACT_FP32_BATCH:  # B * count reaches B^2 > 2^24: fp32 rounds
            work_dtype = torch.float64
        # compiled graphs take the kernels as one op instead (covariance_penalty)
        ctx.fused = (
            binary and not torch.compiler.is_compiling() and fused_applies(codes, _EXACT_FP32_BATCH)
        )
        if ctx.fused:  # one Triton program per tile: codes, counts and (if it fits) signs in memory
            total, x, signs = fused_penalty(codes, share, ctx.scale)  # signs None: tiles again
            ctx.save_for_backward(x, *(() if signs is None else (signs,)))
            ctx.share = share
            return total.to(work_dtype)  # fp32 codes: no kernel
        block = block or _default_block(n, groups, codes.device)  # the tiled path's tiles
        x = codes.detach()
        flips = None
        if binary:
            counts = x.sum(1, dtype=work_dtype)
            products, x, counts, flips = binary_products(x, counts, work_dtype, block)
            norm = float(batch) * (batch - 1)
        else:
            x = (x - x.mean(1, keepdim=True)).to(work_dtype)
            products, counts = DenseProducts(x, False), None
            norm = float(batch - 1)
        total = torch.zeros(groups, dtype=torch.float64, device=codes.device)
        signs: list[Tensor] | None = [] if groups * n * n <= _SIGN_CACHE_LIMIT else None
        for rows, cols, diagonal in _tiles(n, block, share):
            tile = _scaled_cov_tile(products, counts, rows, cols, work_dtype)
            if signs is not None:  # backward's sign tiles: the diagonal never counts
                sign = tile.sign()
                sign = sign.to(torch.int8) if products.int8_signs else sign
                if diagonal:
                    sign.diagonal(dim1=1, dim2=2).zero_()
                signs.append(sign)
            tile = tile.abs_()
            tile_sum = tile.sum(dim=(1, 2), dtype=torch.float64)
            if diagonal:
                total += tile_sum - tile.diagonal(dim1=1, dim2=2).sum(1, dtype=torch.float64)
            else:
                total += 2.0 * tile_sum
        ctx.save_for_backward(counts if counts is not None else x.new_empty(0))
        ctx.products, ctx.flips, ctx.signs = products, flips, signs
        ctx.block, ctx.binary, ctx.work_dtype, ctx.share = block, binary, work_dtype, share
        return (total * (ctx.scale / norm)).to(work_dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None, None, None]:
        with autocast_off(grad_out.device.type):
            return _CovariancePenalty._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None, None, None]:
        if ctx.fused:
            x, *signs = ctx.saved_tensors
            upstream = grad_out.to(torch.float32).view(-1, 1, 1)
            grad = fused_gradient(x, signs[0] if signs else None, ctx.share, upstream, ctx.scale)
            return grad, None, None, None, None
        (counts,) = ctx.saved_tensors
        products, binary, dtype = ctx.products, ctx.binary, ctx.work_dtype
        groups, batch, n = products.x.shape
        # H S, summed in the products' own dtype (int32 from the int8 matmuls: no casts per tile)
        accumulate = torch.int32 if products.int32_results else dtype
        grad = torch.zeros(groups, batch, n, dtype=accumulate, device=grad_out.device)
        for index, (rows, cols, diagonal) in enumerate(_tiles(n, ctx.block, ctx.share)):
            if ctx.signs is not None:  # diagonal already zero
                sign = ctx.signs[index]
            else:
                sign = _scaled_cov_tile(products, counts if binary else None, rows, cols, dtype)
                sign = sign.sign_()
                if diagonal:
                    sign.diagonal(dim1=1, dim2=2).zero_()
            grad[:, :, cols] += products.left(rows, sign)
            if not diagonal:
                grad[:, :, rows] += products.left(cols, sign.transpose(1, 2))
        grad = grad.to(dtype)
        if binary:  # minus 1 (c^T S) / B: c^T S is the column sums of H S
            grad -= grad.sum(1, keepdim=True) / batch
        if ctx.flips is not None:  # back from the flipped channels to the codes
            grad *= ctx.flips[:, None, :]
        grad *= grad_out.to(dtype).view(groups, 1, 1) * (2.0 * ctx.scale / (batch - 1))
        return grad, None, None, None, None


def _scaled_cov_tile(
    products: Products,
    counts: Tensor | None,
    rows: slice,
    cols: slice,
    dtype: torch.dtype,
) -> Tensor:
    """Covariance tiles [G, rows, cols] times B(B-1) for binary codes (integers: exact sign), else
    times B-1."""
    product = products.gram(rows, cols)
    batch = products.x.shape[1]
    if counts is None:
        return product.to(dtype)
    if not product.is_floating_point() and batch <= _EXACT_INT32_BATCH:  # int32 all the way
        whole = counts.to(torch.int32)
        return product.mul_(batch).sub_(whole[:, rows, None] * whole[:, None, cols])
    outer = counts[:, rows, None] * counts[:, None, cols]
    return product.to(dtype).mul_(batch).sub_(outer)


def covariance_penalty(
    codes: Float[Tensor, "*stack batch n"],
    block_size: int | None = None,
    *,
    binary: bool | None = None,
    share: tuple[int, int] = (0, 1),
    scale: float = 1.0,
) -> Float[Tensor, "*stack"]:
    """Sum of |off-diagonal entries| of the unbiased covariance of the code channels (times
    ``scale``).

    Exact and memory-bounded: the n x n covariance is never built. It is computed in
    ``block_size`` x ``block_size`` tiles, using its symmetry, and recomputed tile by tile in
    backward. The default tile holds at most 4M entries over the stack on CUDA (2048 x 2048, or n
    if smaller, for one BAE) and 512K elsewhere, evened out over n. At n = 65536, batch 512 the
    extra memory is a few hundred MiB instead of the dense version's 16 GiB per n x n matrix.
    Pure 0/1 codes take an exact integer path (bf16 matmuls with fp32 accumulation on CUDA).
    Leading dimensions are a stack of independent code sets (one per BAE of a ``StackedBAE``), each
    with its own penalty, computed by batched matmuls.
    ``binary``: whether the codes are all 0/1 (None: checked, which waits for the device; a
    training step passes True, its codes come from the step function).
    ``share = (rank, world)``: only the rank's band of tiles (every world-th), a partial sum that
    the ranks of a data-parallel group add up (``bae_objective`` with a ``GlobalBatch``).
    ``scale``: a constant factor (the objective's coefficient), applied inside the penalty's own
    last step in forward and backward, so that it costs no kernel of its own either way (a small
    BAE's GPU step costs its launches).
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
    if not 0 <= share[0] < share[1]:
        raise ValueError(f"share must be (rank, world) with 0 <= rank < world, got {share}")
    codes = codes if codes.ndim == 3 else codes.reshape(groups, batch, n)
    fused = None
    if binary and torch.compiler.is_compiling():
        fused = compiled_penalty(codes, share, float(scale), _EXACT_FP32_BATCH)
    if fused is not None:
        return fused.to(torch.promote_types(codes.dtype, torch.float32)).reshape(stack)
    penalty = _CovariancePenalty.apply(codes, block_size, binary, share, float(scale))
    return penalty.reshape(stack)


def dense_covariance_penalty(codes: Float[Tensor, "batch n"]) -> Float[Tensor, ""]:
    """Reference through ``torch.cov``: O(n^2) memory; for tests and benchmarks."""
    cov = torch.cov(codes.T)
    return cov.abs().sum() - cov.diagonal().abs().sum()
