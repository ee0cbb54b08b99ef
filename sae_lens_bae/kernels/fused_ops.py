"""The fused covariance kernels (``kernels.fused``) as the covariance penalty's path for binary
codes on a device of ``FUSED_DEVICES`` (:func:`penalty_path`): eager steps through an autograd
``Function``, which costs no op dispatch; ``torch.compile`` graphs through ``torch.library``
custom ops, since inductor cannot trace a Triton launch made from Python."""

from __future__ import annotations

import torch
from torch import Tensor

from sae_lens_bae.kernels import fused as fused_covariance
from sae_lens_bae.kernels.fused import fused_gradient, fused_penalty
from sae_lens_bae.saes.objective import EXACT_FP32_BATCH, autocast_off

__all__ = [
    "compiled_penalty",
    "fused_applies",
    "fused_gradient_op",
    "fused_penalty_op",
    "penalty_path",
]


def fused_applies(codes: Tensor, max_batch: int) -> bool:
    """Whether binary codes [G, B, n] take the kernels: triton, a device of ``FUSED_DEVICES``,
    and a batch of at most ``max_batch`` (exact fp32 tiles). Eager steps reach them through
    ``_FusedPenalty``, compiled graphs through :func:`compiled_penalty`."""
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


class _FusedPenalty(torch.autograd.Function):
    """The penalty of binary codes [G, B, n] through the kernels, its gradient from the codes and
    signs the forward kept (or the tiles recomputed where the signs were too wide to keep)."""

    @staticmethod
    def forward(ctx, codes: Tensor, share: tuple[int, int], scale: float) -> Tensor:
        with autocast_off(codes.device.type):
            total, x, signs = fused_penalty(codes, share, scale)  # signs None: tiles again
            ctx.save_for_backward(x, *(() if signs is None else (signs,)))
            ctx.share, ctx.scale = share, scale
            return total.to(torch.promote_types(codes.dtype, torch.float32))  # fp32: no kernel

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None]:
        with autocast_off(grad_out.device.type):
            x, *signs = ctx.saved_tensors
            upstream = grad_out.to(torch.float32).view(-1, 1, 1)
            grad = fused_gradient(x, signs[0] if signs else None, ctx.share, upstream, ctx.scale)
            return grad, None, None


def penalty_path(
    codes: Tensor, block: int | None, binary: bool | None, share: tuple[int, int], scale: float
) -> Tensor | None:
    """The kernels' penalty of codes known to be binary where they apply (``fused_applies``),
    else None. The kernels' tile is their own: ``block`` does not apply."""
    del block
    if not binary or not fused_applies(codes, EXACT_FP32_BATCH):
        return None
    if torch.compiler.is_compiling():
        total = compiled_penalty(codes, share, scale, EXACT_FP32_BATCH)
        return None if total is None else total.to(torch.promote_types(codes.dtype, torch.float32))
    return _FusedPenalty.apply(codes, share, scale)
