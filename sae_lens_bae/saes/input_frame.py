"""A BAE's input frame: one constant factor and one constant shift, measured on its first training
batch, that bring its inputs to the variance per dimension and the place its recipe was
calibrated at (``input_variance``): the encoder reads ``k (x + t)``, the decoder's output is
divided by k and t is subtracted again.

A BAE's training is not scale-invariant (docs/research/entropy-reading.md): its penalties weigh
against a reconstruction error that grows with the square of the states' scale, and Adam's steps
have one size whatever the scale the weights need. Multiplying the input by a constant k before the
encoder, dividing the reconstruction by k after the decoder, and measuring the reconstruction
loss in the scaled units makes training on ``s * x`` the same as training on ``x`` (k absorbs s),
so a recipe calibrated at one scale holds on states of any scale, with no step on the caller's
side. k is taken from the inputs' variance (mean squared distance from their mean), not their
mean squared norm: states far from the origin (an LLM's share a large mean) would otherwise be
scaled by where they sit rather than by how they spread, and the penalties would weigh many
times more against their reconstruction than the recipe was calibrated for.

Nor is training translation-invariant: the initial encoder's hyperplanes pass through the origin,
and the encoder's gradient is the input times the pre-activations' gradient, so a large common
component of the inputs steers every update (biases can absorb a translation of the forward
pass, not of the gradients). t moves the inputs so that their mean sits at ``sqrt(variance)``
along the unit diagonal ``(1, ..., 1) / sqrt(d)``, where sets of fair bits sit (the recipes were
calibrated on them), so a translated set trains as the set itself, up to rounding. The inputs
are not centred: centred, every bit of the initial encoder splits the set in half; moved
off the origin by as much as they spread, bits start at many rates and can settle constant
(docs/research/entropy-reading.md, "Placed where the recipe was calibrated"). Both are fixed
once (never re-estimated): the weights are learnt for them. Every BAE is framed this way unless
its config's ``input_variance`` is None: the default at variance 1 per dimension, the entropy
recipes at the total variance of the fair-bit sets they were calibrated on, one BAE or a stack.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import torch
from jaxtyping import Float
from torch import Tensor, nn

__all__ = [
    "SCALE_TOLERANCE",
    "check_activations",
    "check_scale",
    "INPUT_SCALE_BUFFER",
    "INPUT_SHIFT_BUFFER",
    "InputFrameFolds",
    "Frame",
    "current_input_scale",
    "fix_frame",
    "frame",
    "frame_factor",
    "module_frame",
    "placement",
    "register_input_frame",
    "unframe",
]

INPUT_SCALE_BUFFER = "input_scale"
"""The buffer holding k (fp32 scalar; 0 until the first training batch sets it)."""
INPUT_SHIFT_BUFFER = "input_shift"
"""The buffer holding t (fp32, d_in; 0 until the first training batch sets it)."""

Frame = tuple[Tensor, Tensor]
"""(k, t) of a BAE, or of each BAE of a stack: k of shape [...] (0 while unset), t of shape
[..., d_in]."""


_ADVICE = "Check the model's dtype (fp16 overflow) and the activation source."

SCALE_TOLERANCE = 3.0
"""States read as given whose mean norm is off sqrt(d_in) by more than this factor get a
warning: the coefficients' penalties weigh the square of it more or less there."""

logger = logging.getLogger(__name__)


def check_scale(x: Float[Tensor, "n d_in"]) -> float:
    """The mean norm of ``x`` over sqrt(d_in) (the scale a BAE's coefficients assume, SAELens'
    ``expected_average_only_in``), logging a warning when it is off by more than
    ``SCALE_TOLERANCE``."""
    ratio = float(x.detach().float().norm(dim=-1).mean()) / x.shape[-1] ** 0.5
    if not 1 / SCALE_TOLERANCE <= ratio <= SCALE_TOLERANCE:
        logger.warning(
            "BAE inputs have a mean norm of %.3g x sqrt(d_in), where the coefficients assume 1 "
            "(the penalties weigh %.2g x as much here): set normalize_activations="
            "'expected_average_only_in' (SAELens scales the states and folds the factor into "
            "the saved weights), or scale the states",
            ratio,
            1 / ratio**2,
        )
    return ratio


def check_activations(x: Tensor, d_in: int, hook_name: str | None, on_device: bool = False) -> None:
    """Raise a ``ValueError`` naming the problem if ``x`` is not [..., d_in] or holds NaN/Inf.

    Finite iff max |x| (one ``vector_norm``) is; ``on_device`` (a training step off the CPU, or
    any compiled one) asserts on the device instead of waiting for the host."""
    if x.shape[-1] != d_in:
        raise ValueError(
            f"BAE expects activations with last dimension d_in={d_in}, got shape "
            f"{tuple(x.shape)}. Check the hook point (and the model) this BAE was trained on: "
            f"{hook_name or 'unknown hook'}."
        )
    if not x.numel() or not x.is_floating_point():
        return
    finite = torch.linalg.vector_norm(x.detach(), float("inf")) < float("inf")
    if torch.compiler.is_compiling() or (on_device and x.device.type != "cpu"):
        torch._assert_async(finite, f"BAE received NaN/Inf activations. {_ADVICE}")
        return
    if not finite:
        n_bad = int((~torch.isfinite(x)).sum())
        raise ValueError(
            f"BAE received {n_bad} NaN/Inf values in activations of shape {tuple(x.shape)}. "
            f"{_ADVICE}"
        )


def register_input_frame(module: nn.Module, target: float | None) -> None:
    """Give a BAE its unset input frame when its config asks for one (``target`` not None)."""
    if target is not None:
        device = next(module.parameters()).device
        d_in = module.cfg.d_in  # type: ignore[union-attr]
        for name, shape in ((INPUT_SCALE_BUFFER, ()), (INPUT_SHIFT_BUFFER, (d_in,))):
            module.register_buffer(name, torch.zeros(shape, dtype=torch.float32, device=device))


def module_frame(module: nn.Module) -> Frame | None:
    """The module's (k, t) buffers; None without a frame."""
    scale = getattr(module, INPUT_SCALE_BUFFER, None)
    return None if scale is None else (scale, getattr(module, INPUT_SHIFT_BUFFER))


def frame_factor(scale: Tensor) -> Tensor:
    """k, or 1 while unset (an untrained BAE reads its inputs as given), shaped as ``scale``."""
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _factors(frame: Frame, like: Tensor) -> tuple[Tensor, Tensor]:
    """k (1 while unset) and t, shaped to broadcast over ``like``'s [..., batch, d_in]."""
    scale, shift = frame
    return frame_factor(scale)[..., None, None].to(like.dtype), shift.unsqueeze(-2).to(like.dtype)


def frame(x: Tensor, frame: Frame | None) -> Tensor:
    """``k (x + t)``: inputs [..., batch, d_in] in the frame their BAE trains in."""
    if frame is None:
        return x
    scale, shift = _factors(frame, x)
    return (x + shift) * scale


def unframe(y: Tensor, frame: Frame | None) -> Tensor:
    """``y / k - t``: reconstructions [..., batch, d_in] back in the inputs' own units."""
    if frame is None:
        return y
    scale, shift = _factors(frame, y)
    return y / scale - shift


def current_input_scale(module: nn.Module) -> Tensor | None:
    """k, or 1 while unset (an untrained BAE reads its inputs as given); None without one."""
    scale = getattr(module, INPUT_SCALE_BUFFER, None)
    return None if scale is None else frame_factor(scale)


def placement(rows: Float[Tensor, "... n d_in"]) -> tuple[Tensor, Tensor]:
    """(total variance, shift t) of states (of each set of a stack), in their dtype: the mean
    squared distance from their mean, and the vector that puts their mean at ``sqrt(variance)``
    along the unit diagonal."""
    mean = rows.mean(-2)
    variance = (rows - mean.unsqueeze(-2)).pow(2).sum(-1).mean(-1)
    return variance, variance.sqrt().unsqueeze(-1) / rows.shape[-1] ** 0.5 - mean


@torch.no_grad()
def fix_frame(frame: Frame, x: Float[Tensor, "... batch d_in"], variance_per_dim: float) -> None:
    """Set each unset k so that ``k x`` has variance ``variance_per_dim`` per dimension (total
    ``variance_per_dim * d_in``), and in the same call its shift t (``placement``); a set frame
    is kept (a resumed or continued run keeps the frame its weights were learnt for), and a
    batch without variance leaves it unset. On the device, without a host sync."""
    scale, shift = frame
    rows = x.detach().float()
    variance, fresh_shift = placement(rows)
    flat = variance <= 1e-12 * rows.pow(2).sum(-1).mean(-1)
    target = variance_per_dim * rows.shape[-1]
    fresh = torch.sqrt(target / variance.clamp_min(torch.finfo(torch.float32).tiny))
    setting = (scale <= 0) & ~flat
    scale.copy_(torch.where(setting, fresh, scale))
    shift.copy_(torch.where(setting.unsqueeze(-1), fresh_shift, shift))


def _refuse_decoder_norm_folding() -> NoReturn:
    raise ValueError(
        "A BAE cannot fold decoder norms: its codes are binary, so scaling the encoder does not "
        "scale them and the reconstruction would change. Load or use it without "
        "fold_W_dec_norm (its outputs are already exact)."
    )


class InputFrameFolds:
    """SAELens' folds of a BAE with an input frame: the frame goes into the weights first (listed
    before SAELens' classes in a BAE's bases)."""

    cfg: Any
    W_enc: nn.Parameter
    b_enc: nn.Parameter
    W_dec: nn.Parameter
    b_dec: nn.Parameter

    def fold_activation_whitening(
        self, mean: Tensor, whitening_matrix: Tensor, unwhitening_matrix: Tensor
    ) -> None:
        """SAELens' exact whitening fold, after the input frame's own."""
        self.fold_input_scale()
        super().fold_activation_whitening(mean, whitening_matrix, unwhitening_matrix)  # type: ignore[misc]

    def fold_activation_norm_scaling_factor(self, scaling_factor: float) -> None:
        """SAELens' fold of its dataset scaling factor, after the input frame's own (SAELens
        scales the encoder, which would scale the frame's shift with the input)."""
        self.fold_input_scale()
        super().fold_activation_norm_scaling_factor(scaling_factor)  # type: ignore[misc]

    @torch.no_grad()
    def fold_input_scale(self) -> None:
        """Move the input frame into the weights, exactly (k becomes 1, t 0): SAELens' whitening
        fold assumes an encoder that reads its input as given. ``k (x + t) W + b`` is
        ``x (k W) + (b + t k W)`` and ``(h W_dec + b_dec) / k - t`` is
        ``h (W_dec / k) + (b_dec / k - t)``; with ``apply_b_dec_to_input`` the encoder's
        subtracted decoder bias carries the shift, and no encoder bias moves."""
        scale = current_input_scale(self)  # type: ignore[arg-type]
        if scale is None:
            return
        shift = getattr(self, INPUT_SHIFT_BUFFER)
        self.W_enc.data *= scale.to(self.W_enc.dtype)
        self.W_dec.data /= scale.to(self.W_dec.dtype)
        self.b_dec.data = self.b_dec.data / scale.to(self.b_dec.dtype) - shift.to(self.b_dec.dtype)
        if not self.cfg.apply_b_dec_to_input:
            self.b_enc.data += (shift @ self.W_enc.data.float()).to(self.b_enc.dtype)
        getattr(self, INPUT_SCALE_BUFFER).fill_(1.0)
        shift.zero_()

    def fold_W_dec_norm(self) -> None:
        _refuse_decoder_norm_folding()

    def fold_and_get_W_dec_norm(self) -> Tensor:
        _refuse_decoder_norm_folding()
