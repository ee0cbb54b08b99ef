"""The fused covariance kernels (``fused_covariance``) as ``torch.library`` custom ops, the form
a ``torch.compile`` graph calls them in: inductor cannot trace a Triton launch made from Python,
so without the ops a compiled step fell back to the tiled path's ops. Eager steps call the
kernels through ``covariance``'s autograd Function instead, which costs no op dispatch."""

from __future__ import annotations

import torch
from torch import Tensor

from sae_lens_bae import fused_covariance
from sae_lens_bae.fused_covariance import fused_gradient, fused_penalty

__all__ = ["compiled_penalty", "fused_applies", "fused_gradient_op", "fused_penalty_op"]


def fused_applies(codes: Tensor, max_batch: int) -> bool:
    """Whether binary codes [G, B, n] take the kernels: triton, a device of ``FUSED_DEVICES``,
    and a batch of at most ``max_batch`` (exact fp32 tiles). Eager steps reach them through
    ``covariance``'s autograd Function, compiled graphs through :func:`compiled_penalty`."""
    return (
        fused_covariance.HAS_TRITON
        and codes.device.type in fused_covariance.FUSED_DEVICES
        and codes.shape[1] <= max_batch
    )


def compiled_penalty(
    codes: Tensor, share: tuple[int, int], scale: float, max_batch: int
) -> Tensor | None:
    """Inside a compiled graph: the penalty of binary codes [G, B, n] through
    :func:`fused_penalty_op` (fp32, autocast off) where the kernels apply, else None."""
    if not fused_applies(codes, max_batch):
        return None
    with torch.autocast(codes.device.type, enabled=False):
        total, _ = fused_penalty_op(codes, *share, scale)
    return total


@torch.library.custom_op("sae_lens_bae::fused_covariance_penalty", mutates_args=())
def fused_penalty_op(
    codes: Tensor, rank: int, world: int, scale: float = 1.0
) -> tuple[Tensor, Tensor]:
    """:func:`fused_penalty` as one op that a ``torch.compile`` graph calls as it is (inductor
    cannot trace into a Triton launch made from Python, so without the op a compiled step fell
    back to the tiled path's ops); its second output is the sign matrix (empty where not kept).
    ``covariance_penalty`` takes it inside compiled graphs; eager steps keep the autograd
    ``Function``, which costs no op dispatch (about 20 us a call, on a host-bound step)."""
    total, x, signs = fused_penalty(codes, (rank, world), scale)
    return total, signs if signs is not None else x.new_empty(0, dtype=torch.bfloat16)


@fused_penalty_op.register_fake
def _penalty_shapes(
    codes: Tensor, rank: int, world: int, scale: float = 1.0
) -> tuple[Tensor, Tensor]:
    """The op's outputs as compile traces them: shapes and dtypes, no kernel."""
    del rank, world, scale  # the op's signature; the shapes do not depend on them
    groups, _, n = codes.shape
    kept = groups * n * n <= fused_covariance.SIGN_CACHE_LIMIT  # read now: tests change it
    signs = codes.new_empty((groups, n, n) if kept else (0,), dtype=torch.bfloat16)
    return codes.new_empty(groups, dtype=torch.float32), signs


@torch.library.custom_op("sae_lens_bae::fused_covariance_gradient", mutates_args=())
def fused_gradient_op(
    codes: Tensor, signs: Tensor, rank: int, world: int, scale: float = 1.0
) -> Tensor:
    """:func:`fused_gradient` for a unit output, as an op (``signs`` empty: tiles recomputed)."""
    x = codes.detach().to(torch.bfloat16).contiguous()
    return fused_gradient(x, signs if signs.numel() else None, (rank, world), 1.0, scale)


@fused_gradient_op.register_fake
def _gradient_shape(
    codes: Tensor, signs: Tensor, rank: int, world: int, scale: float = 1.0
) -> Tensor:
    del signs, rank, world, scale  # the op's signature; the shape is the codes'
    return codes.new_empty(codes.shape, dtype=torch.float32)


def _save_for_gradient(ctx, inputs: tuple, output: tuple) -> None:
    codes, ctx.rank, ctx.world, ctx.scale = inputs
    ctx.save_for_backward(codes, output[1])


def _penalty_gradient(ctx, grad_total: Tensor, _grad_signs: Tensor) -> tuple:
    codes, signs = ctx.saved_tensors
    grad = fused_gradient_op(codes, signs, ctx.rank, ctx.world, ctx.scale)
    return (grad * grad_total[:, None, None]).to(codes.dtype), None, None, None


fused_penalty_op.register_autograd(_penalty_gradient, setup_context=_save_for_gradient)
