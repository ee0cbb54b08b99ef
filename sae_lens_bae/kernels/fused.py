"""The covariance penalty of 0/1 codes as two Triton kernels: each tile is computed once, in
registers, with nothing but the codes read from memory.

The tiled PyTorch path (``saes.objective``) builds every d_sae x d_sae tile in memory and passes
over it several times (count, scale, subtract, sign, abs, sum; and in backward sign, two products,
two sums). Here one program per upper-triangular tile and stacked BAE does all of it:

* forward: the co-occurrence counts ``X_I^T X_J`` (fp16 operands, exact for 0/1, fp32
  accumulation; the codes read in their own dtype: no cast kernel) and the column counts c in
  the same loop (no count kernel), ``B * count - c_i c_j`` (B(B-1) times the covariance: an
  exact integer for B <= 4096), ``|.|`` summed over the off-diagonal entries, one partial sum
  per tile; the diagonal tiles also write the codes as bf16, backward's operand;
* backward, for codes of at most ``SIGN_CACHE_LIMIT`` covariance entries (one BAE of
  d_sae <= 8192): the forward also stores the sign S of every tile (and of its mirror) in a
  bf16 n x n matrix, and backward is one matmul, H S (bf16 operands, fp32 accumulation: exact);
* backward of wider codes (no n x n matrix fits: 8 GiB at d_sae 65536): the same tile
  recomputed, its sign S, and the gradient's integer products ``X_I S`` and ``X_J S^T`` and
  ``c^T S`` added into fp32 buffers (atomic adds of integers below 2^24, so exact and
  deterministic in any order).

Triton ships with torch's CUDA wheels; ``TRITON_INTERPRET=1`` runs the same kernels on CPU tensors
(the test suite checks them that way against the PyTorch path).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch import Tensor

from sae_lens_bae.kernels.products import integer_mm
from sae_lens_bae.kernels.tiles import band_tiles

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only torch without triton: the PyTorch path serves every device
    triton = None

__all__ = [
    "FUSED_DEVICES",
    "HAS_TRITON",
    "SIGN_CACHE_LIMIT",
    "band_tiles",
    "fused_backward",
    "fused_backward_from_signs",
    "fused_forward",
    "fused_on",
    "fused_gradient",
    "fused_penalty",
    "sign_matrix",
    "tile_pairs",
]

HAS_TRITON = triton is not None
"""Whether the kernels can run (CUDA tensors, or CPU ones under ``TRITON_INTERPRET=1``)."""

FUSED_DEVICES: set[str] = {"cuda"}
"""Device types whose binary codes take these kernels (with triton installed): CUDA. ``fused_on()``
turns them off to time the tiled PyTorch path; the tests add "cpu" under ``TRITON_INTERPRET=1``."""

BLOCK_N = 128
"""Tile side on CUDA (bits)."""
BLOCK_B = 32
"""Samples per step of a tile's loop over the batch."""
NUM_WARPS = 8
"""Warps per program: a 128 x 128 fp32 accumulator is 64 registers a thread at 8 warps. The
block sizes are first guesses, to be tuned on a GPU (``make gpu-checks``)."""

SIGN_CACHE_LIMIT = 1 << 26
"""Codes [G, B, n] with G n^2 at most this keep the forward's signs for backward (bf16: 128 MiB
at n = 8192, the size of a few activation batches) and take backward as one matmul; wider codes
recompute the tiles with atomic adds (``fused_backward``). The atomic adds of a [B, n] gradient
per tile are the kernels' slowest part: 2 B n^2 / 128 of them per step (0.27 billion at n =
8192, B = 512), where the matmul reads S once. 0 turns the cache off (the benchmark's
``bae_atomic`` rows)."""


CODES_IN_KERNEL = True
"""The forward kernel reads the codes in their own dtype and writes backward's bf16 copy itself
(no cast launch: a GPU step of a small BAE is host-bound); False: one cast to bf16 before it,
so the kernel reads half the bytes (fp32 codes), which may matter where the step is
device-bound (the benchmark's ``bae_cast`` rows time both)."""


@functools.lru_cache(maxsize=64)
def tile_pairs(
    n: int, block: int, share: tuple[int, int], device: torch.device
) -> tuple[Tensor, Tensor, int]:
    """``band_tiles`` of n bits in tiles of ``block``, as two int32 index tensors (I, J) on
    ``device`` and their count (an int: ``len`` of a tensor costs host time), once per shape."""
    tiles = torch.tensor(band_tiles(-(-n // block), share), dtype=torch.int32).reshape(-1, 2)
    return tiles[:, 0].contiguous().to(device), tiles[:, 1].contiguous().to(device), len(tiles)


@contextlib.contextmanager
def fused_on(*device_types: str) -> Iterator[None]:
    """Within the block, exactly ``device_types`` take the kernels (none: the tiled path
    everywhere, to time or check it against them); ``FUSED_DEVICES`` is restored after."""
    saved = set(FUSED_DEVICES)
    FUSED_DEVICES.clear()
    FUSED_DEVICES.update(device_types)
    try:
        yield
    finally:
        FUSED_DEVICES.clear()
        FUSED_DEVICES.update(saved)


if HAS_TRITON:

    @triton.jit
    def _program_cov_tile(
        x_ptr,
        copy_ptr,
        tile_i_ptr,
        tile_j_ptr,
        batch,
        n,
        BLOCK_N: tl.constexpr,
        BLOCK_B: tl.constexpr,
        COPY: tl.constexpr,
    ):
        """This program's tile t (row block ti, column block tj) of stack member g: B(B-1) cov,
        zero off the matrix and on its diagonal, with its bit indices and column counts
        (summed here from the codes the loop reads anyway: no count kernel). The codes come in
        any float dtype and multiply as fp16 (exact for 0/1; triton's interpreter gets bf16 dots
        wrong). ``COPY``: the diagonal tiles also write their columns of the codes to
        ``copy_ptr`` in its dtype (backward's operand, with no cast kernel)."""
        t = tl.program_id(0)
        g = tl.program_id(1)
        ti = tl.load(tile_i_ptr + t)
        tj = tl.load(tile_j_ptr + t)
        rows = ti * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tj * BLOCK_N + tl.arange(0, BLOCK_N)
        samples = tl.arange(0, BLOCK_B)
        base = x_ptr + g.to(tl.int64) * batch * n
        acc = tl.zeros((BLOCK_N, BLOCK_N), dtype=tl.float32)
        # column counts: summed elementwise in the loop, across its rows once after it (a
        # reduction across threads each iteration would cost a pass through shared memory)
        sum_i = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
        sum_j = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
        for b0 in range(0, batch, BLOCK_B):
            b = b0 + samples
            offsets = b[:, None].to(tl.int64) * n
            in_rows = (b[:, None] < batch) & (rows[None, :] < n)
            x_i = tl.load(base + offsets + rows[None, :], mask=in_rows, other=0.0)
            x_j = tl.load(
                base + offsets + cols[None, :],
                mask=(b[:, None] < batch) & (cols[None, :] < n),
                other=0.0,
            )
            if COPY:  # noqa: SIM102 (a compile-time branch around a run-time one)
                if ti == tj:
                    copy = copy_ptr + g.to(tl.int64) * batch * n + offsets + rows[None, :]
                    tl.store(copy, x_i.to(copy_ptr.dtype.element_ty), mask=in_rows)
            sum_i += x_i.to(tl.float32)
            sum_j += x_j.to(tl.float32)
            acc = tl.dot(tl.trans(x_i.to(tl.float16)), x_j.to(tl.float16), acc)
        c_i = tl.sum(sum_i, axis=0)
        c_j = tl.sum(sum_j, axis=0)
        cov = acc * batch - c_i[:, None] * c_j[None, :]
        inside = (rows[:, None] < n) & (cols[None, :] < n) & (rows[:, None] != cols[None, :])
        return tl.where(inside, cov, 0.0), rows, cols, c_i, c_j, t, g, ti, tj

    @triton.jit
    def _forward_kernel(
        x_ptr,
        copy_ptr,
        tile_i_ptr,
        tile_j_ptr,
        out_ptr,
        signs_ptr,
        batch,
        n,
        n_tiles,
        scale,
        BLOCK_N: tl.constexpr,
        BLOCK_B: tl.constexpr,
        STORE_SIGNS: tl.constexpr,
        COPY: tl.constexpr,
    ):
        cov, rows, cols, c_i, c_j, t, g, ti, tj = _program_cov_tile(
            x_ptr, copy_ptr, tile_i_ptr, tile_j_ptr, batch, n, BLOCK_N, BLOCK_B, COPY
        )
        total = tl.sum(tl.sum(tl.abs(cov), axis=1), axis=0)
        weight = tl.where(ti == tj, scale, 2.0 * scale)  # an off-diagonal tile: its mirror too
        tl.store(out_ptr + g * n_tiles + t, total * weight)
        if STORE_SIGNS:  # S[rows, cols] and its mirror S[cols, rows], zero on the diagonal
            sign = tl.where(cov > 0, 1.0, tl.where(cov < 0, -1.0, 0.0))
            sign = sign.to(signs_ptr.dtype.element_ty)
            base = signs_ptr + g.to(tl.int64) * n * n
            inside = (rows[:, None] < n) & (cols[None, :] < n)
            tl.store(base + rows[:, None].to(tl.int64) * n + cols[None, :], sign, mask=inside)
            if ti != tj:
                tl.store(
                    base + cols[:, None].to(tl.int64) * n + rows[None, :],
                    tl.trans(sign),
                    mask=(cols[:, None] < n) & (rows[None, :] < n),
                )

    @triton.jit
    def _backward_kernel(
        x_ptr,
        tile_i_ptr,
        tile_j_ptr,
        grad_ptr,
        sign_sums_ptr,
        batch,
        n,
        BLOCK_N: tl.constexpr,
        BLOCK_B: tl.constexpr,
    ):
        cov, rows, cols, c_i, c_j, t, g, ti, tj = _program_cov_tile(
            x_ptr, x_ptr, tile_i_ptr, tile_j_ptr, batch, n, BLOCK_N, BLOCK_B, False
        )
        sign = tl.where(cov > 0, 1.0, tl.where(cov < 0, -1.0, 0.0))
        sums = sign_sums_ptr + g * n
        tl.atomic_add(sums + cols, tl.sum(c_i[:, None] * sign, axis=0), mask=cols < n)
        mirrored = ti != tj  # an off-diagonal tile also holds its mirror's entries
        if mirrored:
            tl.atomic_add(sums + rows, tl.sum(sign * c_j[None, :], axis=1), mask=rows < n)
        sign = sign.to(tl.float16)  # -1/0/1: exact in fp16
        samples = tl.arange(0, BLOCK_B)
        base = x_ptr + g.to(tl.int64) * batch * n
        grad = grad_ptr + g.to(tl.int64) * batch * n
        for b0 in range(0, batch, BLOCK_B):
            b = b0 + samples
            offsets = b[:, None].to(tl.int64) * n
            in_rows = (b[:, None] < batch) & (rows[None, :] < n)
            in_cols = (b[:, None] < batch) & (cols[None, :] < n)
            x_i = tl.load(base + offsets + rows[None, :], mask=in_rows, other=0.0)
            x_i = x_i.to(tl.float16)
            tl.atomic_add(grad + offsets + cols[None, :], tl.dot(x_i, sign), mask=in_cols)
            if mirrored:
                x_j = tl.load(base + offsets + cols[None, :], mask=in_cols, other=0.0)
                x_j = x_j.to(tl.float16)
                tl.atomic_add(
                    grad + offsets + rows[None, :], tl.dot(x_j, tl.trans(sign)), mask=in_rows
                )


def _check(codes: Tensor) -> None:
    if not HAS_TRITON:
        raise RuntimeError("the fused covariance kernels need triton (pip install triton)")
    if codes.ndim != 3 or not codes.is_contiguous() or not codes.is_floating_point():
        raise ValueError(f"fused kernels take contiguous float codes [G, B, n], got {codes.shape}")


def fused_forward(
    codes: Tensor,
    share: tuple[int, int] = (0, 1),
    block_n: int = BLOCK_N,
    block_b: int = BLOCK_B,
    signs: Tensor | None = None,
    scale: float = 1.0,
    copy: Tensor | None = None,
) -> Tensor:
    """``scale`` sum_{i != j} |B(B-1) cov_ij| per stack member (fp32 [G]) of 0/1 codes
    [G, B, n] (any float dtype, contiguous); only the rank's band of tiles. The scale is applied
    per tile, in the kernel (1 / (B(B-1)): the penalty, with no kernel after the sum).

    ``signs`` (contiguous [G, n, n], bf16, from :func:`sign_matrix`): also filled with the sign of
    the covariance, zero on the diagonal and outside the rank's band. ``copy`` (contiguous
    [G, B, n], bf16; only with the whole band, ``share = (0, 1)``, whose diagonal tiles cover
    every column): also filled with the codes, backward's operand, with no cast kernel."""
    _check(codes)
    groups, batch, n = codes.shape
    if signs is not None and (signs.shape != (groups, n, n) or not signs.is_contiguous()):
        raise ValueError(f"signs must be contiguous [{groups}, {n}, {n}], got {signs.shape}")
    if copy is not None and (
        share[1] != 1 or copy.shape != codes.shape or not copy.is_contiguous()
    ):
        raise ValueError(f"copy must be contiguous {list(codes.shape)} and the band whole")
    tile_i, tile_j, n_tiles = tile_pairs(n, block_n, share, codes.device)
    partial = torch.empty(groups, n_tiles, dtype=torch.float32, device=codes.device)
    if n_tiles:
        _forward_kernel[(n_tiles, groups)](
            codes,
            codes if copy is None else copy,
            tile_i,
            tile_j,
            partial,
            partial if signs is None else signs,
            batch,
            n,
            n_tiles,
            scale,
            BLOCK_N=block_n,
            BLOCK_B=block_b,
            STORE_SIGNS=signs is not None,
            COPY=copy is not None,
            num_warps=NUM_WARPS,
        )
    return partial.sum(1)


def sign_matrix(codes: Tensor, share: tuple[int, int] = (0, 1)) -> Tensor | None:
    """The buffer :func:`fused_forward` fills with the covariance's signs ([G, n, n] bf16), or
    None where the codes are too wide to keep one (``SIGN_CACHE_LIMIT``). Zeroed only where the
    kernel leaves entries unwritten: the other ranks' tiles of a data-parallel band."""
    groups, _, n = codes.shape
    if groups * n * n > SIGN_CACHE_LIMIT:
        return None
    alloc = torch.empty if share[1] == 1 else torch.zeros
    return alloc(groups, n, n, dtype=torch.bfloat16, device=codes.device)


def fused_backward_from_signs(codes: Tensor, signs: Tensor) -> Tensor:
    """:func:`fused_backward` from the signs the forward kept: (H S - 1 c^T S / B) [G, B, n]
    (fp32), H S as one matmul of bf16 0/1 and -1/0/1 entries with fp32 accumulation (exact), and
    c^T S its column sums."""
    grad = integer_mm(codes.to(signs.dtype), signs)
    return torch.sub(grad, grad.sum(1, keepdim=True), alpha=1.0 / codes.shape[1])


def fused_backward(
    codes: Tensor,
    share: tuple[int, int] = (0, 1),
    block_n: int = BLOCK_N,
    block_b: int = BLOCK_B,
) -> Tensor:
    """(H S - 1 c^T S / B) [G, B, n] (fp32), S the sign of the covariance with a zero diagonal:
    the gradient of the penalty times (B - 1) / 2, over the rank's band of tiles."""
    _check(codes)
    groups, batch, n = codes.shape
    tile_i, tile_j, n_tiles = tile_pairs(n, block_n, share, codes.device)
    grad = torch.zeros(groups, batch, n, dtype=torch.float32, device=codes.device)
    sign_sums = torch.zeros(groups, n, dtype=torch.float32, device=codes.device)
    if n_tiles:
        _backward_kernel[(n_tiles, groups)](
            codes,
            tile_i,
            tile_j,
            grad,
            sign_sums,
            batch,
            n,
            BLOCK_N=block_n,
            BLOCK_B=block_b,
            num_warps=NUM_WARPS,
        )
    return torch.sub(grad, sign_sums[:, None, :], alpha=1.0 / batch)


def fused_penalty(
    codes: Tensor, share: tuple[int, int] = (0, 1), scale: float = 1.0
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The penalty times ``scale`` (fp32 [G]) of 0/1 codes [G, B, n] through the kernels, with what
    its gradient needs: the codes as bf16 (exact for 0/1; written by the forward kernel itself
    for the whole band) and the sign matrix (None where too wide to keep)."""
    codes = codes.detach().contiguous()  # itself where it already is
    signs = sign_matrix(codes, share)
    batch = codes.shape[1]
    scale = scale / (batch * (batch - 1))
    if share[1] == 1 and CODES_IN_KERNEL:
        x = torch.empty(codes.shape, dtype=torch.bfloat16, device=codes.device)
        total = fused_forward(codes, share, signs=signs, scale=scale, copy=x)
    else:  # a band misses some diagonal tiles, so some columns: one cast
        x = codes.to(torch.bfloat16)
        total = fused_forward(x, share, signs=signs, scale=scale)
    return total, x, signs


def fused_gradient(
    x: Tensor,
    signs: Tensor | None,
    share: tuple[int, int],
    upstream: Tensor | float,
    scale: float = 1.0,
) -> Tensor:
    """The gradient (fp32 [G, B, n]) of the penalty times ``scale``, times ``upstream`` (a float,
    or [G, 1, 1] upstream gradients), from :func:`fused_penalty`'s bf16 codes and signs, or from
    the tiles recomputed where the signs were not kept."""
    grad = fused_backward_from_signs(x, signs) if signs is not None else fused_backward(x, share)
    return grad.mul_(upstream * (2.0 * scale / (x.shape[1] - 1)))
