"""The binary code's primitives: the Heaviside step with its surrogate gradient, more-bit grouping
of code bits into values, and the firing thresholds that call a bit constant or dense."""

from __future__ import annotations

import einops
import torch
from jaxtyping import Bool, Float
from torch import Tensor

__all__ = [
    "CONSTANT_RARITY",
    "DENSE_FREQUENCY",
    "bits_to_values",
    "constant_bits",
    "step",
]


CONSTANT_RARITY = 1e-4
"""A bit whose rare state occurs on fewer than this fraction of tokens is constant: it carries
(almost) no information. The feature statistics' ``constant`` column uses the same threshold."""

DENSE_FREQUENCY = 0.1
"""A bit (or an SAE latent) in its rare state on more than this fraction of tokens is dense (the
SAE literature's 10%; a bit's rare state is at most half of them, so 1/2 could never count one)."""


def constant_bits(
    counts: Float[Tensor, "*stack n_bits"], samples: int, rarity: float = CONSTANT_RARITY
) -> Bool[Tensor, "*stack n_bits"]:
    """Bits whose rare state (firing, or not firing) took fewer than ``rarity`` of the
    ``samples`` samples; at least those that fired on none or on all of them. Not only exactly
    constant ones: a bit firing on 3 of 64k training tokens reads as dead on held-out text."""
    rare = torch.minimum(counts, samples - counts)
    return (rare == 0) | (rare < rarity * samples)


SURROGATE_CPU_CUTOFF = 30.0
"""On CPU the sigmoid surrogate's derivative beyond |x / T| = 30 is held at its value there
(under 4e-13 of its peak): further out, a small upstream gradient times sigmoid(x / T) is a
denormal float, and a CPU multiplies denormals about 100x slower, so one BAE whose
pre-activations outgrew T would slow a whole stacked training run."""


def _sigmoid_surrogate(grad_out: Tensor, x: Tensor, temperature: float) -> Tensor:
    """``grad_out`` times d/dx sigmoid(x / T), i.e. ``sigmoid(x/T)(1 - sigmoid(x/T)) / T`` (the
    paper's definition is T = 1)."""
    # sigmoid_backward fuses grad * s (1 - s): two kernels at T = 1 instead of six (a GPU step
    # of a small BAE costs its kernel launches)
    scaled = x if temperature == 1.0 else x * (1.0 / temperature)
    if x.device.type == "cpu":  # GPUs run denormals at full speed: no extra kernel there
        scaled = scaled.clamp(-SURROGATE_CPU_CUTOFF, SURROGATE_CPU_CUTOFF)
    grad = torch.ops.aten.sigmoid_backward(grad_out, torch.sigmoid(scaled))
    return grad if temperature == 1.0 else grad * (1.0 / temperature)


def _heaviside(x: Tensor) -> Tensor:
    """1 where ``x >= 0`` (0 where NaN), in x's dtype: the comparison writes x's dtype itself, one
    kernel where ``(x >= 0).to(x.dtype)`` is two (a small BAE's GPU step costs its launches)."""
    if torch.compiler.is_compiling():  # a compiled graph fuses the cast anyway
        return (x >= 0).to(x.dtype)
    return torch.ge(x, 0, out=torch.empty_like(x))


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, temperature: float) -> Tensor:
        ctx.save_for_backward(x)
        ctx.temperature = temperature
        return _heaviside(x)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None]:
        (x,) = ctx.saved_tensors
        return _sigmoid_surrogate(grad_out, x, ctx.temperature), None


def step(x: Float[Tensor, "..."], temperature: float | None = None) -> Float[Tensor, "..."]:
    """Heaviside step (1 where ``x >= 0``) in ``x``'s dtype.

    With ``temperature`` T set, gradients pass through with the sigmoid surrogate derivative
    d/dx sigmoid(x / T); without, the result is a constant for autograd (inference).
    """
    if temperature is None:
        return _heaviside(x)
    return _Step.apply(x, temperature)


def bits_to_values(
    bits: Float[Tensor, "... n_bits"], bits_per_feature: int
) -> Float[Tensor, "... n_values"]:
    """More-bit decoding: each group of C bits becomes sum_j 2^j b_j / (2^C - 1) in [0, 1].

    Bit j of feature k sits at index ``k * C + j`` (j = 0 is the least significant bit).
    """
    if bits_per_feature == 1:
        return bits
    if bits.shape[-1] % bits_per_feature:
        raise ValueError(f"{bits.shape[-1]} bits do not split into groups of {bits_per_feature}")
    weights = 2.0 ** torch.arange(bits_per_feature, device=bits.device, dtype=bits.dtype)
    grouped = einops.rearrange(bits, "... (value bit) -> ... value bit", bit=bits_per_feature)
    # integer sums are exact, then one rounding: all ones is exactly 1 (1/7 + 2/7 + 4/7 in
    # fp32 is 1.0000001 on some CPUs' matmul kernels)
    return (grouped @ weights) / (2**bits_per_feature - 1)
