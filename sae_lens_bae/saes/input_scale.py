"""A BAE's input frame: one constant factor and one constant shift, measured on its first training
batch, that bring its inputs to the total variance and the place its recipe was calibrated at
(``rescale_inputs_to``): the encoder reads ``k (x + t)``, the decoder's output is divided by k
and t is subtracted again.

A BAE's training is not scale-invariant (docs/research/entropy-reading.md): its penalties weigh
against a reconstruction error that grows with the square of the states' scale, and Adam's steps
have one size whatever the scale the weights need. Multiplying the input by a constant k before the
encoder, dividing the reconstruction by k after the decoder, and measuring the reconstruction
loss in the scaled units makes training on ``s * x`` the same as training on ``x`` (k absorbs s),
so a recipe calibrated at one scale holds on states of any scale, with no step on the caller's
side. k is taken from the inputs' variance (mean squared distance from their mean), not their
mean squared norm: states far from the origin (an LLM's share a large mean) would otherwise be
scaled by where they sit rather than by how they spread (``entropy.frame``).

Nor is training translation-invariant: the initial encoder's hyperplanes pass through the origin,
and the encoder's gradient is the input times the pre-activations' gradient, so a large common
component of the inputs steers every update (biases can absorb a translation of the forward
pass, not of the gradients: a 4-bit set moved 100 times its spread away read 2 bits at 46%
error with the biases moved instead). t moves the inputs so that their mean sits at
``sqrt(variance)`` along the unit diagonal, where ``estimate_entropies`` puts every set
(``entropy.frame.placement_shift``), so a translated set trains as the set itself, up to
rounding. Both are fixed once (never re-estimated): the weights are learnt for them.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

__all__ = [
    "INPUT_SCALE_BUFFER",
    "INPUT_SHIFT_BUFFER",
    "InputFrameMixin",
    "current_input_scale",
    "fix_input_frame",
    "frame_input",
    "placement",
    "register_input_scale",
    "unframe_output",
]

INPUT_SCALE_BUFFER = "input_scale"
"""The buffer holding k (fp32 scalar; 0 until the first training batch sets it)."""
INPUT_SHIFT_BUFFER = "input_shift"
"""The buffer holding t (fp32, d_in; 0 until the first training batch sets it)."""


def register_input_scale(module: nn.Module, target: float | None) -> None:
    """Give a BAE its (unset) input frame when its config asks for one (``target`` not None)."""
    if target is not None:
        device = next(module.parameters()).device
        module.register_buffer(
            INPUT_SCALE_BUFFER, torch.zeros((), dtype=torch.float32, device=device)
        )
        d_in = module.cfg.d_in  # type: ignore[union-attr]
        module.register_buffer(
            INPUT_SHIFT_BUFFER, torch.zeros(d_in, dtype=torch.float32, device=device)
        )


def current_input_scale(module: nn.Module) -> Tensor | None:
    """k, or 1 while unset (an untrained BAE reads its inputs as given); None without one."""
    scale = getattr(module, INPUT_SCALE_BUFFER, None)
    if scale is None:
        return None
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def frame_input(module: nn.Module, x: Tensor) -> Tensor:
    """``k (x + t)``: the input in the frame the BAE trains in (``x`` without a frame)."""
    scale = current_input_scale(module)
    if scale is None:
        return x
    shift = getattr(module, INPUT_SHIFT_BUFFER, None)
    return (x if shift is None else x + shift.to(x.dtype)) * scale.to(x.dtype)


def unframe_output(module: nn.Module, y: Tensor) -> Tensor:
    """``y / k - t``: a reconstruction back in the input's own units."""
    scale = current_input_scale(module)
    if scale is None:
        return y
    shift = getattr(module, INPUT_SHIFT_BUFFER, None)
    y = y / scale.to(y.dtype)
    return y if shift is None else y - shift.to(y.dtype)


def placement(rows: Float[Tensor, "n d_in"]) -> tuple[Tensor, Tensor]:
    """(total variance, shift t) of states, in their dtype: the mean squared distance from their
    mean, and the vector that puts their mean at ``sqrt(variance)`` along the unit diagonal (the
    one rule for a BAE's frame and for ``entropy.frame``'s sets)."""
    mean = rows.mean(0)
    variance = (rows - mean).pow(2).sum(-1).mean()
    return variance, variance.sqrt() / rows.shape[-1] ** 0.5 - mean


@torch.no_grad()
def fix_input_frame(module: nn.Module, x: Float[Tensor, "... d_in"], target: float) -> None:
    """Set the module's unset k so that ``k x`` has total variance ``target``, and in the same
    call its shift t (``placement``); a set frame is kept (a resumed or continued run keeps the
    frame its weights were learnt for), and a batch without variance leaves it unset. On the
    device, without a host sync."""
    scale, shift = getattr(module, INPUT_SCALE_BUFFER), getattr(module, INPUT_SHIFT_BUFFER)
    rows = x.detach().float().reshape(-1, x.shape[-1])
    variance, fresh_shift = placement(rows)
    flat = variance <= 1e-12 * rows.pow(2).sum(-1).mean()
    fresh = torch.sqrt(target / variance.clamp_min(torch.finfo(torch.float32).tiny))
    setting = (scale <= 0) & ~flat
    scale.copy_(torch.where(setting, fresh, scale))
    shift.copy_(torch.where(setting, fresh_shift, shift))


class InputFrameMixin:
    """Loading a BAE whose config has a frame but whose weights were saved before the shift
    existed: its shift is 0 (what it did), not a missing key."""

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        key = prefix + INPUT_SHIFT_BUFFER
        framed = getattr(self, INPUT_SHIFT_BUFFER, None) is not None
        if framed and key not in state_dict and prefix + INPUT_SCALE_BUFFER in state_dict:
            d_in = self.cfg.d_in  # type: ignore[attr-defined]
            state_dict[key] = torch.zeros(d_in, dtype=torch.float32)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)  # type: ignore[misc]
