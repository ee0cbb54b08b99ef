"""Faster exact paths of the BAE's covariance penalty: :func:`covariance_penalty`, of the
signature of the plain ``saes.objective.covariance_penalty`` (which it equals), the fused Triton
kernels first (CUDA), else the tiles (``kernels.tiles``) with the int8 and sparse products (CPU;
bf16 matmuls on CUDA without triton). It plugs into a BAE's objective through one seam, the
training class's ``covariance_penalty`` attribute, which the package sets when it is imported.
"""

from __future__ import annotations

import math

from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.kernels import fused_ops, products
from sae_lens_bae.saes.objective import penalty_input

__all__ = ["covariance_penalty", "fused_ops", "products"]


def covariance_penalty(
    codes: Float[Tensor, "... batch n"],
    block_size: int | None = None,
    *,
    binary: bool | None = None,
    share: tuple[int, int] = (0, 1),
    scale: float = 1.0,
) -> Float[Tensor, "..."]:
    """``saes.objective.covariance_penalty``, exactly, never building the n x n matrix: the fused
    kernels where they apply (binary codes on a GPU with triton), else ``block_size`` tiles
    (default: the widest the device's tile budget allows) of the products that are fastest there.
    ``share = (rank, world)``: only that rank's band of tiles, a partial sum that the ranks of a
    data-parallel group add up."""
    if block_size is not None and block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    codes = penalty_input(codes, share)
    if binary is None:  # a wait for the device: callers that know (training) say so
        binary = bool(((codes == 0) | (codes == 1)).all())
    lead, (batch, n) = codes.shape[:-2], codes.shape[-2:]
    stacked = codes.reshape(math.prod(lead), batch, n)
    penalty = fused_ops.penalty_path(stacked, block_size, binary, share, float(scale))
    if penalty is None:
        penalty = products.penalty_path(stacked, block_size, binary, share, float(scale))
    return penalty.reshape(lead)
