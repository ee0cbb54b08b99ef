"""A BAE's input scale: one constant factor, measured on its first training batch, that brings
its inputs to the total variance its recipe was calibrated at (``rescale_inputs_to``).

A BAE's training is not scale-invariant (docs/entropy.md): its penalties weigh against a
reconstruction error that grows with the square of the states' scale, and Adam's steps have one
size whatever the scale the weights need. Multiplying the input by a constant k before the
encoder, dividing the reconstruction by k after the decoder, and measuring the reconstruction
loss in the scaled units makes training on ``s * x`` the same as training on ``x`` (k absorbs s),
so a recipe calibrated at one scale holds on states of any scale, with no step on the caller's
side. The factor is fixed once (never re-estimated): the encoder's weights are learnt for it.
It is taken from the inputs' variance (mean squared distance from their mean), not their mean
squared norm: states far from the origin (an LLM's share a large mean) would otherwise be scaled
by where they sit rather than by how they spread (``entropy.normalise_scale``).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

__all__ = ["INPUT_SCALE_BUFFER", "current_input_scale", "fix_input_scale", "register_input_scale"]

INPUT_SCALE_BUFFER = "input_scale"
"""The buffer holding k (fp32 scalar; 0 until the first training batch sets it)."""


def register_input_scale(module: nn.Module, target: float | None) -> None:
    """Give a BAE its (unset) input scale when its config asks for one (``target`` not None)."""
    if target is not None:
        module.register_buffer(
            INPUT_SCALE_BUFFER,
            torch.zeros((), dtype=torch.float32, device=next(module.parameters()).device),
        )


def current_input_scale(module: nn.Module) -> Tensor | None:
    """k, or 1 while unset (an untrained BAE reads its inputs as given); None without one."""
    scale = getattr(module, INPUT_SCALE_BUFFER, None)
    if scale is None:
        return None
    return torch.where(scale > 0, scale, torch.ones_like(scale))


@torch.no_grad()
def fix_input_scale(scale: Tensor, x: Float[Tensor, "... d_in"], target: float) -> None:
    """Set an unset ``scale`` so that ``x * scale`` has total variance ``target`` (mean squared
    distance from the batch's mean); a set one is kept (a resumed or continued run keeps the
    factor its weights were learnt for), and a batch without variance leaves it unset. On the
    device, without a host sync."""
    rows = x.detach().float().reshape(-1, x.shape[-1])
    variance = (rows - rows.mean(0)).pow(2).sum(-1).mean()
    flat = variance <= 1e-12 * rows.pow(2).sum(-1).mean()
    fresh = torch.sqrt(target / variance.clamp_min(torch.finfo(torch.float32).tiny))
    scale.copy_(torch.where((scale > 0) | flat, scale, fresh))
