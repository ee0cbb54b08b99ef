"""The covariance penalty of the BAE objective: the sum of the absolute off-diagonal covariances
of the code channels, exact, in tiles (a 65536-channel code never builds its 16 GiB matrix).

Binary codes make every tile an integer product, computed one of four ways:

* on CUDA with triton, fused kernels that never write a tile to memory (``fused_covariance``);
* dense (batched) matmuls: bf16 operands with fp32 accumulation on CUDA;
* on CPU, int8 matmuls with int32 accumulation (``torch._int_mm``): 0/1 codes and -1/0/1 signs
  are int8 numbers, and the CPU multiplies int8 2x (AVX2) to 4x (AVX-512 VNNI) faster than fp32;
  fp32 matmuls where this torch has no int8 product (and as the reference, ``CPU_INT8 = False``);
* on CPU, for very sparse codes, sums over the entries that are 1 only (``embedding_bag``), after
  flipping every channel that fires in more than half of the batch (|cov| does not change when a
  channel is flipped): rho * B * n^2 additions instead of B * n^2 multiply-adds at density rho.

All are exact; the tests check them against ``torch.cov`` and each other.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.fused_covariance import (
    band_tiles,
    fused_applies,
    fused_backward,
    fused_forward,
)

__all__ = ["covariance_penalty", "dense_covariance_penalty"]


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


CPU_INT8 = True
"""On CPU, binary codes multiply as int8 matmuls (``_Int8Products``) when this torch can
(``cpu_int8_products``); False: fp32 matmuls, the path before them (benchmarks compare the two)."""


@functools.cache
def cpu_int8_products() -> bool:
    """Whether this torch multiplies int8 matrices on the CPU with int32 results (``_int_mm``)."""
    probe = torch.ones(2, 8, dtype=torch.int8)
    try:  # a 2 x 8 probe: the only failure it can meet is a torch without the kernel
        torch._int_mm(probe, probe.T.contiguous())
    except (AttributeError, NotImplementedError, RuntimeError):
        return False
    return True


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
one BAE on CUDA; 724 x 724 elsewhere, where a tile that stays in cache makes the penalty of
d_sae = 2304 two times faster on 2 CPU cores than 2048-wide tiles: ``benchmarks/train_step.py``)."""

SPARSE_DENSITY = 0.05
"""On CPU, binary codes whose density (after flipping the channels that fire more than half of the
time) is at most this take the sparse products (``SPARSE_DENSITY_FP32`` where the matmuls are
fp32). Forward + backward on 2 cores (AMD EPYC) at batch 512, d_sae 2304 / 8192, int8 matmuls
against sparse sums, ms (noisy to 20%):

| density | AVX-512 VNNI | oneDNN capped at AVX2 |
|---|---|---|
| 0.16 | 17 / 260 against 44 / 539 | 29 / 484 against 34 / 554 |
| 0.08 | 23 / 341 against 33 / 333 | 29 / 506 against 21 / 365 |
| 0.04 | 23 / 267 against 26 / 241 | 29 / 499 against 16 / 238 |
| 0.02 | 22 / 332 against 24 / 341 | 28 / 471 against 12 / 202 |

The int8 matmuls cost the same at any density; the crossover is near 0.03 with VNNI and 0.1
without. 0.05 is at most 15% off the faster path with VNNI; on AVX2 alone, codes between 0.05
and 0.1 take int8 matmuls up to 40% slower than the sparse sums would be."""
SPARSE_DENSITY_FP32 = 0.25
"""The same against fp32 matmuls: on 2 AVX2 cores (d_sae = 2304, batch 512) the sparse forward +
backward beats them below a density of about 0.3."""

SPARSE_MIN_BLOCK = 256
"""...and whose tiles are at least this wide: each tile costs one ``embedding_bag`` call per
member of a stack, so many small BAEs (45 of d_sae = 576 share tiles 116 wide) are faster
through batched matmuls (measured: 166 ms against 249 ms at density 0.16, batch 256)."""


def _default_block(n: int, groups: int, device: torch.device) -> int:
    """Tile side for n channels: the widest that the device's tile budget allows, then evened out
    so that the tiles divide n as equally as possible (no thin remainder tile, and the triangle of
    tiles covers fewer entries: 3 tiles of 1152 for n = 2304 instead of 2048, 2048 x 256 and
    256 x 256)."""
    budget = _TILE_ELEMENTS.get(device.type, _TILE_ELEMENTS["cpu"])
    widest = min(n, max(128, math.isqrt(budget // max(groups, 1))))
    return -(-n // -(-n // widest))


class _DenseProducts:
    """The two products the tiles need, as batched matmuls of the codes x [G, B, n]."""

    int8_signs = True  # cached sign tiles: int8 (a quarter of the memory) convert on the fly
    int32_results = False  # the products come in the work dtype

    def __init__(self, x: Tensor, integer_entries: bool) -> None:
        self.x, self.integer_entries = x, integer_entries

    def gram(self, rows: slice, cols: slice) -> Tensor:
        """x[:, :, rows]^T x[:, :, cols]: [G, rows, cols] (co-occurrence counts of 0/1 codes)."""
        return _matmul(self.x[:, :, rows].transpose(1, 2), self.x[:, :, cols], self.integer_entries)

    def left(self, rows: slice, matrix: Tensor) -> Tensor:
        """x[:, :, rows] @ matrix: [G, B, cols]."""
        return _matmul(self.x[:, :, rows], matrix, self.integer_entries)


class _Int8Products:
    """The same products for 0/1 codes on CPU as int8 matmuls with int32 results, one
    ``torch._int_mm`` per member of a stack: exact (int32 sums of 0/1 and -1/0/1 products). The
    codes' column blocks are made contiguous once (int8: a quarter of the fp32 codes, and
    faster to multiply than strided views); sign tiles are multiplied as they come, transposed
    views included."""

    int8_signs = True
    int32_results = True

    def __init__(self, x: Tensor) -> None:
        self.x = x.to(torch.int8)
        self._blocks: dict[tuple[int, int], list[Tensor]] = {}
        self._transposed: dict[tuple[int, int], list[Tensor]] = {}

    def _columns(self, block: slice, transposed: bool = False) -> list[Tensor]:
        cache = self._transposed if transposed else self._blocks
        key = (block.start, block.stop)
        if key not in cache:
            cache[key] = [_row_major(codes[:, block].T if transposed else codes[:, block])
                          for codes in self.x]  # fmt: skip
        return cache[key]

    def gram(self, rows: slice, cols: slice) -> Tensor:
        pairs = zip(self._columns(rows, transposed=True), self._columns(cols), strict=True)
        return _stack([torch._int_mm(a, b) for a, b in pairs])

    def left(self, rows: slice, matrix: Tensor) -> Tensor:
        signs = matrix.to(torch.int8)
        pairs = zip(self._columns(rows), signs, strict=True)
        return _stack(
            [torch._int_mm(a, b if 1 not in b.shape else _row_major(b)) for a, b in pairs]
        )


def _row_major(matrix: Tensor) -> Tensor:
    """``matrix`` with the strides of a fresh row-major one. ``contiguous()`` keeps any stride
    of a dimension of size 1, and ``torch._int_mm`` on CPU (torch 2.13) reads such a stride as
    the row length: a [1, 16] view with strides (1, 1) multiplies as garbage (strided and
    transposed views of wider matrices multiply right)."""
    rows, cols = matrix.shape
    if matrix.stride() == (cols, 1):
        return matrix
    return torch.empty((rows, cols), dtype=matrix.dtype, device=matrix.device).copy_(matrix)


_Bags = list[tuple[Tensor, Tensor]]
"""Per code set of a stack: (the indices of the bags' members, the bags' start offsets)."""


class _SparseProducts:
    """The same products for sparse 0/1 codes, as sums of the rows that the 1 entries pick.

    ``gram``: for each channel i of ``rows``, the sum of the rows x[k, cols] over the samples k
    where i fires. ``left``: for each sample, the sum of the rows of ``matrix`` of the channels of
    ``rows`` that fire in it. Both are ``embedding_bag`` sums of exact integers, so they equal the
    dense products bit for bit; the index lists are built once per set of codes.
    """

    int8_signs = False  # embedding_bag reads its weights in the work dtype: no conversion
    int32_results = False

    def __init__(self, x: Tensor, dtype: torch.dtype) -> None:
        self.x, self.dtype = x, dtype
        self.bits = x.bool()  # nonzero() on bool is twice as fast as on float
        # the blocks of columns of x, contiguous, are kept when they are small (the sign tiles
        # are too): together they are a copy of x, 128 MiB at n = 65536
        self.keep_columns = x.shape[0] * x.shape[2] ** 2 <= _SIGN_CACHE_LIMIT
        self._columns: dict[tuple[int, int], list[Tensor]] = {}
        self._by_channel: dict[tuple[int, int], _Bags] = {}
        self._by_sample: dict[tuple[int, int], _Bags] = {}

    def gram(self, rows: slice, cols: slice) -> Tensor:
        key = (cols.start, cols.stop)
        columns = self._columns.get(key)
        if columns is None:
            columns = [codes[:, cols].to(self.dtype).contiguous() for codes in self.x]
            if self.keep_columns:
                self._columns[key] = columns
        bags = self._bags(self._by_channel, rows, by_channel=True)
        out = [
            F.embedding_bag(samples, weight, offsets, mode="sum")
            for (samples, offsets), weight in zip(bags, columns, strict=True)
        ]
        return _stack(out)

    def left(self, rows: slice, matrix: Tensor) -> Tensor:
        out = []
        bags = self._bags(self._by_sample, rows, by_channel=False)
        for (channels, offsets), weight in zip(bags, matrix, strict=True):
            if not (weight.is_contiguous() and weight.dtype == self.dtype):
                weight = torch.empty(weight.shape, dtype=self.dtype).copy_(weight)
            out.append(F.embedding_bag(channels, weight, offsets, mode="sum"))
        return _stack(out)

    def _bags(self, cache: dict[tuple[int, int], _Bags], rows: slice, by_channel: bool) -> _Bags:
        """Per code set, the bags of the 1 entries of the channels ``rows``: by channel (each
        channel's samples) or by sample (each sample's channels, as indices into ``rows``), with
        the bags' start offsets. Built once per block of channels."""
        key = (rows.start, rows.stop)
        if key not in cache:
            cache[key] = []
            for bits in self.bits:
                block = bits[:, rows].T if by_channel else bits[:, rows]
                owners, members = block.nonzero(as_tuple=True)  # sorted by owner
                offsets = torch.zeros(block.shape[0], dtype=torch.long)
                offsets[1:] = torch.bincount(owners, minlength=block.shape[0]).cumsum(0)[:-1]
                cache[key].append((members, offsets))
        return cache[key]


def _stack(tiles: list[Tensor]) -> Tensor:
    return tiles[0].unsqueeze(0) if len(tiles) == 1 else torch.stack(tiles)


def _cpu_int8() -> bool:
    return CPU_INT8 and cpu_int8_products()


def _cpu_matmuls(x: Tensor) -> _Int8Products | _DenseProducts:
    """The matmul products of 0/1 codes on CPU: int8 where this torch has them (``CPU_INT8``)."""
    return _Int8Products(x) if _cpu_int8() else _DenseProducts(x, True)


def _binary_products(
    x: Tensor, counts: Tensor, dtype: torch.dtype, block: int
) -> tuple[_DenseProducts | _Int8Products | _SparseProducts, Tensor, Tensor, Tensor | None]:
    """(products, codes, counts, channel signs) for 0/1 codes x [G, B, n].

    On CPU (outside ``torch.compile``, whose graphs need fixed shapes) codes whose flipped density
    is at most ``SPARSE_DENSITY``, in tiles at least ``SPARSE_MIN_BLOCK`` wide, come back with
    every channel that fires in more than half of the batch flipped (1 - x), their counts, the
    sparse products and the +-1 signs that map the gradient back. Elsewhere the codes as they
    are and matmuls: bf16 on CUDA (exact for 0/1, half the memory), int8 on CPU where this torch
    has the product (``CPU_INT8``), else fp32.
    """
    if x.is_cuda:
        x = x.bfloat16()
        return _DenseProducts(x, True), x, counts, None
    if torch.compiler.is_compiling() or min(block, x.shape[2]) < SPARSE_MIN_BLOCK:
        return _cpu_matmuls(x), x, counts, None
    batch = x.shape[1]
    flipped = counts > batch / 2
    rare_counts = torch.where(flipped, batch - counts, counts)
    limit = SPARSE_DENSITY if _cpu_int8() else SPARSE_DENSITY_FP32
    if float(rare_counts.sum()) > limit * x.numel():
        return _cpu_matmuls(x), x, counts, None
    if not flipped.any():
        return _SparseProducts(x, dtype), x, counts, None
    x = torch.where(flipped[:, None, :], 1 - x, x)
    signs = 1.0 - 2.0 * flipped.to(dtype)
    return _SparseProducts(x, dtype), x, rare_counts, signs


class _CovariancePenalty(torch.autograd.Function):
    """D = sum_{i != j} |cov_ij| over upper-triangular tiles, recomputing tiles in backward
    (above ``_SIGN_CACHE_LIMIT`` entries; smaller codes keep their int8 sign tiles).

    Codes come as a stack [G, B, n] (G = 1 for one BAE); every tile is a batched matmul, so G small
    BAEs cost one kernel per tile instead of G. Binary codes H (batch B, column counts c):
    B(B-1) cov = B H^T H - c c^T, where H^T H counts co-occurrences, so every tile and its sign are
    exact integers. The gradient is dD/dH = 2/(B-1) (H - 1 p^T) S with S = sign(cov) (zero
    diagonal), and (H - 1 p^T) S = H S - 1 (c^T S) / B is an integer product too. Flipping a
    channel (1 - H_i) flips the sign of its row and column of cov: D is unchanged and the gradient
    of H_i is minus that of 1 - H_i (the sparse path). Other codes are centred first and go through
    the same tiles in fp32 (or in their own dtype if wider).
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
        ctx.fused = binary and fused_applies(codes, _EXACT_FP32_BATCH)
        if ctx.fused:  # one Triton program per tile: nothing but codes and counts in memory
            x = codes.detach().to(torch.float16).contiguous()  # exact for 0/1
            counts = x.sum(1, dtype=torch.float32)
            ctx.save_for_backward(x, counts)
            ctx.share = share
            total = fused_forward(x, counts, share)
            return (total / (float(batch) * (batch - 1))).to(work_dtype)
        x = codes.detach()
        flips = None
        if binary:
            counts = x.sum(1, dtype=work_dtype)
            products, x, counts, flips = _binary_products(x, counts, work_dtype, block)
            norm = float(batch) * (batch - 1)
        else:
            x = (x - x.mean(1, keepdim=True)).to(work_dtype)
            products, counts = _DenseProducts(x, False), None
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
        return (total / norm).to(work_dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        with torch.autocast(grad_out.device.type, enabled=False):
            return _CovariancePenalty._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None, None]:
        if ctx.fused:
            x, counts = ctx.saved_tensors
            grad = fused_backward(x, counts, ctx.share)
            scale = grad_out.float().view(-1, 1, 1) * (2.0 / (x.shape[1] - 1))
            return grad.mul_(scale), None, None, None
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
        grad *= grad_out.to(dtype).view(groups, 1, 1) * (2.0 / (batch - 1))
        return grad, None, None, None


def _matmul(a: Tensor, b: Tensor, integer_entries: bool) -> Tensor:
    return _integer_mm(a, b) if integer_entries else a @ b.to(a.dtype)


def _scaled_cov_tile(
    products: _DenseProducts | _SparseProducts,
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
) -> Float[Tensor, "*stack"]:
    """Sum of |off-diagonal entries| of the unbiased covariance of the code channels.

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
    block = block_size or _default_block(n, groups, codes.device)
    if not 0 <= share[0] < share[1]:
        raise ValueError(f"share must be (rank, world) with 0 <= rank < world, got {share}")
    penalty = _CovariancePenalty.apply(codes.reshape(groups, batch, n), block, binary, share)
    return penalty.reshape(stack)  # type: ignore[no-any-return]


def dense_covariance_penalty(codes: Float[Tensor, "batch n"]) -> Float[Tensor, ""]:
    """Reference through ``torch.cov``: O(n^2) memory; for tests and benchmarks."""
    cov = torch.cov(codes.T)
    return cov.abs().sum() - cov.diagonal().abs().sum()
