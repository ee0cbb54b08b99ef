"""The covariance penalty in memory-bounded tiles: exact, and never building the n x n matrix
(a 65536-bit code would need 16 GiB), with the gradient from the tiles' signs (kept in int8, or
recomputed in backward). Which products multiply a tile of 0/1 codes (fp32, bf16, int8 or sparse
sums) is chosen by ``kernels.products``; ``saes.objective.covariance_penalty`` is the plain maths
these tiles equal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.saes.objective import EXACT_FP32_BATCH, autocast_off

__all__ = ["DenseProducts", "band_tiles", "tiled_penalty"]

_SIGN_CACHE_LIMIT = 1 << 24
"""Codes with at most this many covariance entries keep the forward's sign tiles (int8) for
backward instead of recomputing them: a quarter fewer matmul FLOPs."""
_EXACT_INT32_BATCH = 46340
"""Binary tiles are exact in int32 (int8 products' tiles) for B <= 46340 (B^2 < 2^31)."""
_TILE_ELEMENTS = {"cuda": 1 << 22, "cpu": 1 << 19}
"""Default tile: at most this many entries over all leading indices, per device type."""


class DenseProducts:
    """The tiles' two products as (batched) fp32 matmuls of the codes x [G, B, n]: the plain
    path, exact for 0/1 codes while sums stay below 2^24; also the centred products of codes
    that are not 0/1. The products of 0/1 codes come from a chooser (``kernels.products``); the
    flags say the dtypes the tiles keep their signs and results in, and the bits flipped."""

    int8_signs = True  # cached sign tiles in int8 (a quarter of the memory)
    int32_results = False  # the products come in the work dtype
    flips: Tensor | None = None  # no bit flipped (see kernels.products.SparseProducts)

    def __init__(self, x: Tensor, integer_entries: bool) -> None:
        self.x, self.integer_entries = x, integer_entries

    def _mm(self, a: Tensor, b: Tensor) -> Tensor:
        return a.float() @ b.float() if self.integer_entries else a @ b.to(a.dtype)

    def gram(self, rows: slice, cols: slice) -> Tensor:
        """x[:, :, rows]^T x[:, :, cols]: [G, rows, cols] (co-occurrence counts of 0/1 codes)."""
        return self._mm(self.x[:, :, rows].transpose(1, 2), self.x[:, :, cols])

    def left(self, rows: slice, matrix: Tensor) -> Tensor:
        """x[:, :, rows] @ matrix: [G, B, cols]."""
        return self._mm(self.x[:, :, rows], matrix)


def band_tiles(count: int, share: tuple[int, int] = (0, 1)) -> list[tuple[int, int]]:
    """(I, J) block indices of the upper triangle I <= J of ``count`` x ``count`` blocks, row by
    row, every world-th from the rank-th (``share = (rank, world)``): one rank's band."""
    rank, world = share
    return [(i, j) for i in range(count) for j in range(i, count)][rank::world]


def _tiles(n: int, block: int, share: tuple[int, int]) -> Iterator[tuple[slice, slice, bool]]:
    """The band's tiles of an n x n matrix as slices; the flag marks diagonal tiles."""
    for i, j in band_tiles(-(-n // block), share):
        rows = slice(i * block, min((i + 1) * block, n))
        yield rows, slice(j * block, min((j + 1) * block, n)), i == j


def _default_block(n: int, groups: int, device: torch.device) -> int:
    """The widest tile the device's budget allows, evened out so that tiles divide n equally."""
    budget = _TILE_ELEMENTS.get(device.type, _TILE_ELEMENTS["cpu"])
    widest = min(n, max(128, math.isqrt(budget // max(groups, 1))))
    return -(-n // -(-n // widest))


def _scaled_tile(
    products: Any, counts: Tensor | None, rows: slice, cols: slice, dtype: torch.dtype
) -> Tensor:
    """Covariance tile [G, rows, cols] times B(B-1) for binary codes (exact integers: an exact
    sign), else times B-1."""
    product = products.gram(rows, cols)
    batch = products.x.shape[1]
    if counts is None:
        return product.to(dtype)
    if not product.is_floating_point() and batch <= _EXACT_INT32_BATCH:  # int32 all the way
        whole = counts.to(torch.int32)
        return product.mul_(batch).sub_(whole[:, rows, None] * whole[:, None, cols])
    return product.to(dtype).mul_(batch).sub_(counts[:, rows, None] * counts[:, None, cols])


class _TiledPenalty(torch.autograd.Function):
    """D = sum_{i != j} |cov_ij| over upper-triangular tiles of codes [G, B, n], recomputing
    tiles in backward (or keeping their int8 signs, below ``_SIGN_CACHE_LIMIT`` entries).

    Binary codes H (batch B, column counts c): B(B-1) cov = B H^T H - c c^T, so every tile and
    its sign are exact integers. The gradient is dD/dH = 2/(B-1) (H - 1 p^T) S with S = sign(cov)
    (zero diagonal), and (H - 1 p^T) S = H S - 1 (c^T S) / B, an integer product too. Other
    codes are centred first and go through the same tiles in fp32 (or their own wider dtype).
    """

    @staticmethod
    def forward(
        ctx,
        codes: Tensor,
        block: int | None,
        binary: bool | None,
        share: tuple[int, int],
        scale: float,
        choose: Callable[..., Any],
    ) -> Tensor:
        with autocast_off(codes.device.type):  # bf16 outputs would round counts
            groups, batch, n = codes.shape
            if binary is None:  # a host sync: callers that know (training) say so
                binary = bool(((codes == 0) | (codes == 1)).all())
            dtype = torch.promote_types(codes.dtype, torch.float32)
            if binary and batch > EXACT_FP32_BATCH:  # B * count reaches B^2 > 2^24: fp32 rounds
                dtype = torch.float64
            block = block or _default_block(n, groups, codes.device)
            x, counts = codes.detach(), None
            if binary:
                products, counts = choose(x, x.sum(1, dtype=dtype), dtype, block)
            else:
                products = DenseProducts((x - x.mean(1, keepdim=True)).to(dtype), False)
            signs: list[Tensor] | None = [] if groups * n * n <= _SIGN_CACHE_LIMIT else None
            total = torch.zeros(groups, dtype=torch.float64, device=codes.device)
            for rows, cols, diagonal in _tiles(n, block, share):
                tile = _scaled_tile(products, counts, rows, cols, dtype)
                if signs is not None:  # backward's sign tiles: the diagonal never counts
                    sign = tile.sign().to(torch.int8) if products.int8_signs else tile.sign()
                    if diagonal:
                        sign.diagonal(dim1=1, dim2=2).zero_()
                    signs.append(sign)
                tile_sum = tile.abs_().sum(dim=(1, 2), dtype=torch.float64)
                if diagonal:
                    total += tile_sum - tile.diagonal(dim1=1, dim2=2).sum(1, dtype=torch.float64)
                else:
                    total += 2.0 * tile_sum
            ctx.save_for_backward(counts if counts is not None else x.new_empty(0))
            ctx.products, ctx.signs, ctx.scale = products, signs, scale
            ctx.block, ctx.binary, ctx.dtype, ctx.share = block, binary, dtype, share
            norm = float(batch) * (batch - 1) if binary else float(batch - 1)
            return (total * (scale / norm)).to(dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        with autocast_off(grad_out.device.type):
            (counts,) = ctx.saved_tensors
            products, dtype = ctx.products, ctx.dtype
            groups, batch, n = products.x.shape
            # H S, summed in the products' own dtype (int32 from int8 matmuls: no casts per tile)
            accumulate = torch.int32 if products.int32_results else dtype
            grad = torch.zeros(groups, batch, n, dtype=accumulate, device=grad_out.device)
            for index, (rows, cols, diagonal) in enumerate(_tiles(n, ctx.block, ctx.share)):
                if ctx.signs is not None:  # diagonal already zero
                    sign = ctx.signs[index]
                else:
                    tile = _scaled_tile(products, counts if ctx.binary else None, rows, cols, dtype)
                    sign = tile.sign_()
                    if diagonal:
                        sign.diagonal(dim1=1, dim2=2).zero_()
                grad[:, :, cols] += products.left(rows, sign)
                if not diagonal:
                    grad[:, :, rows] += products.left(cols, sign.transpose(1, 2))
            grad = grad.to(dtype)
            if ctx.binary:  # minus 1 (c^T S) / B: c^T S is the column sums of H S
                grad -= grad.sum(1, keepdim=True) / batch
            if products.flips is not None:  # back from flipped bits to the codes
                grad *= products.flips[:, None, :]
            grad *= grad_out.to(dtype).view(groups, 1, 1) * (2.0 * ctx.scale / (batch - 1))
            return grad, None, None, None, None, None


def tiled_penalty(
    codes: Float[Tensor, "G batch n"],
    block: int | None,
    binary: bool | None,
    share: tuple[int, int],
    scale: float,
    choose: Callable[..., Any],
) -> Float[Tensor, " G"]:
    """The penalty of codes [G, B, n] through tiles whose products ``choose`` picks for 0/1
    codes (``(x, counts, dtype, block) -> (products, counts)``: ``kernels.products`` picks
    fp32, bf16, int8 or sparse ones, which may flip bits: ``products.flips``)."""
    return _TiledPenalty.apply(codes, block, binary, share, float(scale), choose)
