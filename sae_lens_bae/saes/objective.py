"""The BAE's objective: reconstruction, the entropy of the minibatch's mean code, and the summed
|off-diagonal covariance| of the code, for one BAE (codes [batch, n_bits]) or any leading
dimensions (codes [..., batch, n_bits], one objective each).

* :func:`minibatch_entropy`: measured on the minibatch (not per sample), so minimising it makes
  codes sparse *globally*: a bit that fires on every token costs as much as one that never does,
  so there are no dense features.
* :func:`covariance_penalty`: exact and memory-bounded, in tiles (a 65536-bit code never builds
  its 16 GiB covariance matrix). The plain path here multiplies tiles as fp32 matmuls; faster
  exact paths (int8 and sparse products on CPU, fused Triton kernels on GPUs) register
  themselves from ``sae_lens_bae.kernels`` (:func:`register_penalty_path`).
* :class:`LocalBatch`: the data-parallel seam. Every term is a property of the minibatch; a
  data-parallel trainer gives the BAE a batch object over its ranks
  (``sae_lens_bae.parallel.GlobalBatch``) whose ``gather`` and ``sum`` make each term the one
  of the global minibatch. This process alone is the identity.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.saes.input_frame import frame_factor

__all__ = [
    "LOCAL_BATCH",
    "LocalBatch",
    "autocast_off",
    "band_tiles",
    "bae_objective",
    "binary_entropy",
    "code_penalties",
    "covariance_penalty",
    "dense_covariance_penalty",
    "minibatch_entropy",
    "reconstruction_loss",
    "register_penalty_path",
    "tiled_penalty",
]

_LN2 = math.log(2.0)


def autocast_off(device_type: str) -> contextlib.AbstractContextManager[object]:
    """``torch.autocast(device_type, enabled=False)`` where autocast is on, else a null context
    (entering an autocast object costs host time, and a small BAE's GPU step is host-bound)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


class LocalBatch:
    """The minibatch of this process alone: the data-parallel seam's default, the identity."""

    world = 1
    rank = 0

    def gather(self, x: Tensor, dim: int = -2, *, codes: bool = False) -> Tensor:  # noqa: ARG002
        """The ranks' ``x`` concatenated along ``dim``: here ``x`` itself."""
        return x

    def sum(self, x: Tensor) -> Tensor:
        """``x`` added over the ranks: here ``x`` itself."""
        return x


LOCAL_BATCH = LocalBatch()

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
    0 turns its term off (a zero, no kernel); ``covariance_off``: per leading index, True where
    the covariance term is off."""
    rows = batch.world * bits.shape[-2]
    if entropy_coefficient != 0:  # a_e applied inside: no kernel of its own
        mean_code = (
            bits.float().mean(-2) if batch.world == 1 else batch.sum(bits.float().sum(-2)) / rows
        )
        entropy = binary_entropy(mean_code, min(0.5 / rows, 0.25), scale=entropy_coefficient)
    else:
        entropy = _zero_like(bits[..., 0, 0])
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
        covariance_loss = _zero_like(entropy)
    if weight is not None:
        entropy, covariance_loss = entropy * weight, covariance_loss * weight
    return {"entropy_loss": entropy, "covariance_loss": covariance_loss}


_ZEROS: dict[tuple[torch.device, torch.dtype], Tensor] = {}
"""One zero per device and dtype: the terms that are off are views of it."""


def _zero_like(like: Tensor) -> Tensor:
    """A term that is off: outside a compiled graph a view of a zero made once, which costs no
    kernel (a small BAE's GPU step costs its launches)."""
    if torch.compiler.is_compiling():  # a compiled graph fuses it anyway
        return torch.zeros_like(like, dtype=torch.float32)
    key = (like.device, torch.float32)
    if key not in _ZEROS:
        _ZEROS[key] = torch.zeros((), dtype=torch.float32, device=like.device)
    return _ZEROS[key].expand(like.shape)


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
    terms = {"mse_loss": squared_error(sae_out, sae_in, batch), **code_penalties(bits, **penalties)}
    terms["loss"] = terms["mse_loss"] + terms["entropy_loss"] + terms["covariance_loss"]
    return terms


# ----------------------------------------------------------------------------- covariance

PenaltyPath = Callable[
    [Tensor, "int | None", "bool | None", tuple[int, int], float], "Tensor | None"
]
"""A faster exact covariance penalty: (codes [G, B, n], block, binary, share, scale) -> the [G]
penalties, or None where it does not apply."""

_PENALTY_PATHS: list[PenaltyPath] = []


def register_penalty_path(path: PenaltyPath) -> None:
    """Add a faster exact path of :func:`covariance_penalty`, tried (in the order registered)
    before the plain tiles; ``sae_lens_bae.kernels`` registers its paths on import."""
    if path not in _PENALTY_PATHS:
        _PENALTY_PATHS.append(path)


_SIGN_CACHE_LIMIT = 1 << 24
"""Codes with at most this many covariance entries keep the forward's sign tiles (int8) for
backward instead of recomputing them: a quarter fewer matmul FLOPs."""
EXACT_FP32_BATCH = 4096
"""Binary tiles are B * (co-occurrence count) - c_i c_j, integers up to B^2: exact in fp32 for
B <= 4096 (B^2 <= 2^24); larger batches work in float64."""
_EXACT_INT32_BATCH = 46340
"""... and in int32 (int8 products' tiles) for B <= 46340 (B^2 < 2^31)."""
_TILE_ELEMENTS = {"cuda": 1 << 22, "cpu": 1 << 19}
"""Default tile: at most this many entries over all leading indices, per device type."""


class DenseProducts:
    """The tiles' two products as (batched) fp32 matmuls of the codes x [G, B, n]: the plain
    path, exact for 0/1 codes while sums stay below 2^24; also the centred products of codes
    that are not 0/1. A faster path hands :func:`tiled_penalty` its own products."""

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


def dense_products(x: Tensor, counts: Tensor, dtype: torch.dtype, block: int) -> tuple[Any, Tensor]:  # noqa: ARG001
    """The plain products of 0/1 codes and their counts (a faster path passes its own chooser
    of this signature to :func:`tiled_penalty`, which may flip bits: ``products.flips``)."""
    return DenseProducts(x, True), counts


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
    choose: Callable[..., Any] = dense_products,
) -> Float[Tensor, " G"]:
    """The penalty through tiles whose products ``choose`` picks for 0/1 codes (the plain fp32
    matmuls by default; ``sae_lens_bae.kernels.products`` passes int8 and sparse ones)."""
    return _TiledPenalty.apply(codes, block, binary, share, float(scale), choose)


def covariance_penalty(
    codes: Float[Tensor, "... batch n"],
    block_size: int | None = None,
    *,
    binary: bool | None = None,
    share: tuple[int, int] = (0, 1),
    scale: float = 1.0,
) -> Float[Tensor, "..."]:
    """Sum of |off-diagonal entries| of the unbiased covariance of the code bits, times
    ``scale``, per leading index; exact, in ``block_size`` tiles (default: the widest the
    device's tile budget allows), never building the n x n matrix.

    ``binary``: whether the codes are all 0/1 (None: checked, which waits for the device).
    ``share = (rank, world)``: only that rank's band of tiles, a partial sum that the ranks of a
    data-parallel group add up. The first registered faster path that applies computes it
    (:func:`register_penalty_path`), else the plain tiles.
    """
    if codes.ndim < 2:
        raise ValueError(
            f"covariance_penalty needs codes of shape [..., batch, n], got {tuple(codes.shape)}"
        )
    if codes.shape[-2] < 2:
        raise ValueError("covariance_penalty needs a batch of at least 2 samples")
    if block_size is not None and block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if not 0 <= share[0] < share[1]:
        raise ValueError(f"share must be (rank, world) with 0 <= rank < world, got {share}")
    codes = codes if codes.is_floating_point() else codes.float()
    if binary is None:  # a wait for the device: callers that know (training) say so
        binary = bool(((codes == 0) | (codes == 1)).all())
    lead, (batch, n) = codes.shape[:-2], codes.shape[-2:]
    stacked = codes.reshape(math.prod(lead), batch, n)
    for path in _PENALTY_PATHS:
        penalty = path(stacked, block_size, binary, share, float(scale))
        if penalty is not None:
            return penalty.reshape(lead)
    return tiled_penalty(stacked, block_size, binary, share, scale).reshape(lead)


def dense_covariance_penalty(codes: Float[Tensor, "batch n"]) -> Float[Tensor, ""]:
    """Reference through ``torch.cov``: O(n^2) memory; for tests and benchmarks."""
    cov = torch.cov(codes.T)
    return cov.abs().sum() - cov.diagonal().abs().sum()
