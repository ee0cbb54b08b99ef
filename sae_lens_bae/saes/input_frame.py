"""A training BAE's input frame: a constant factor k and shift t, fixed on the training set
before the first step (``fix_frame_from_set``; a stack on each of its sets), that bring its
inputs to the variance per dimension its recipe was calibrated at (``input_variance``) and put
their mean at ``sqrt(variance)`` along the unit diagonal: the encoder reads ``k (x + t)`` and the
decoder's output is divided by k and has t subtracted.

Why: the BAE's penalties weigh against a squared error that grows with the states' scale, and
its initial hyperplanes pass through the origin, so training depends on where the states sit and
how they spread; in the frame, states of any scale and place train as the recipe's own did
(docs/entropy.md). Both are fixed once: the weights are learnt for them. The saved BAE has them
folded into its weights (``fold_frame``); readers of a training BAE's weights use
``in_input_units``. Also here: the checks of a BAE's inputs (width, finiteness, scale).
"""

from __future__ import annotations

import copy
import dataclasses
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
    "fix_frame_from_set",
    "frame_sample",
    "fold_frame",
    "frame",
    "frame_factor",
    "in_input_units",
    "module_frame",
    "placement",
    "register_input_frame",
    "unframe",
    "weights_in_input_units",
]

INPUT_SCALE_BUFFER = "input_scale"
"""The buffer holding k (fp32 scalar; 0 until the training set fixes it)."""
INPUT_SHIFT_BUFFER = "input_shift"
"""The buffer holding t (fp32, d_in; 0 until the training set fixes it)."""

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
    is kept (a resumed or continued run keeps the frame its weights were learnt for), and a set
    without variance gets the identity (k 1, t 0: nothing to scale or place). On the device,
    without a host sync."""
    scale, shift = frame
    rows = x.detach().float()
    variance, fresh_shift = placement(rows)
    flat = variance <= 1e-12 * rows.pow(2).sum(-1).mean(-1)
    target = variance_per_dim * rows.shape[-1]
    fresh = torch.where(flat, 1.0, torch.sqrt(target / variance.clamp_min(1e-30)))
    fresh_shift = torch.where(flat.unsqueeze(-1), 0.0, fresh_shift)
    setting = scale <= 0
    scale.copy_(torch.where(setting, fresh, scale))
    shift.copy_(torch.where(setting.unsqueeze(-1), fresh_shift, shift))


@torch.no_grad()
def fix_frame_from_set(bae: Any, rows: Float[Tensor, "n d_in"], max_rows: int, seed: int) -> None:
    """Fix an unset input frame of ``bae`` on a seeded sample of up to ``max_rows`` of a whole
    (screened) training set before the first step, as SAELens estimates its own scale over many
    minibatches; a BAE without a frame, or with one set, is left."""
    input_frame = module_frame(bae)
    if input_frame is not None:
        rows = frame_sample(rows, max_rows, seed).to(input_frame[0].device)
        fix_frame(input_frame, rows, bae.cfg.input_variance)


def frame_sample(rows: Float[Tensor, "n d_in"], max_rows: int, seed: int) -> Tensor:
    """The rows ``fix_frame_from_set`` estimates a frame on: all of them, or a seeded sample of
    ``max_rows``."""
    if rows.shape[0] <= max_rows:
        return rows
    generator = torch.Generator().manual_seed(seed)
    return rows[torch.randperm(rows.shape[0], generator=generator)[:max_rows]]


def _refuse_decoder_norm_folding() -> NoReturn:
    raise ValueError(
        "A BAE cannot fold decoder norms: its codes are binary, so scaling the encoder does not "
        "scale them and the reconstruction would change. Load or use it without "
        "fold_W_dec_norm (its outputs are already exact)."
    )


def fold_frame(
    weights: dict[str, Tensor], frame: Frame, apply_b_dec_to_input: bool
) -> dict[str, Tensor]:
    """``W_enc``, ``b_enc``, ``W_dec``, ``b_dec`` with an input frame folded in (new tensors),
    exactly: ``k (x + t) W + b`` is ``x (k W) + (b + t k W)`` and ``(h W_dec + b_dec) / k - t``
    is ``h (W_dec / k) + (b_dec / k - t)``; with ``apply_b_dec_to_input`` the encoder's
    subtracted decoder bias carries the shift, and no encoder bias moves. An unset k (0) is 1."""
    scale, shift = frame_factor(frame[0]), frame[1]
    W_enc, b_enc, W_dec, b_dec = (weights[name] for name in ("W_enc", "b_enc", "W_dec", "b_dec"))
    W_enc = W_enc * scale.to(W_enc.dtype)
    if not apply_b_dec_to_input:
        b_enc = b_enc + (shift.float() @ W_enc.float()).to(b_enc.dtype)
    return {
        "W_enc": W_enc,
        "b_enc": b_enc,
        "W_dec": W_dec / scale.to(W_dec.dtype),
        "b_dec": b_dec / scale.to(b_dec.dtype) - shift.to(b_dec.dtype),
    }


def weights_in_input_units(bae: Any) -> dict[str, Tensor]:
    """``W_enc``, ``b_enc``, ``W_dec``, ``b_dec`` of a BAE in the units of its inputs: its input
    frame folded in (``fold_frame``; new tensors, the BAE unchanged), or its own weights
    (detached) without one."""
    weights = {name: getattr(bae, name).detach() for name in ("W_enc", "b_enc", "W_dec", "b_dec")}
    input_frame = module_frame(bae)
    if input_frame is None:
        return weights
    return fold_frame(weights, input_frame, bae.cfg.apply_b_dec_to_input)


def in_input_units(bae: Any) -> Any:
    """The BAE itself when it has no input frame; else a copy with the frame folded into its
    weights and dropped: what a reader of weights (decoder statistics, a logit lens, SAEBench)
    needs, in the units of the states it reads."""
    if current_input_scale(bae) is None:
        return bae
    folded = copy.deepcopy(bae)
    folded.fold_input_scale()
    return folded


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
        """Move the input frame into the weights in place (``weights_in_input_units``) and drop
        it: the BAE is then one that reads its inputs as given (``input_variance`` None), as
        SAELens sets ``normalize_activations`` to "none" when it folds its scaling. SAELens'
        folds assume an encoder that reads its input as given."""
        if current_input_scale(self) is None:  # type: ignore[arg-type]
            return
        for name, value in weights_in_input_units(self).items():
            getattr(self, name).data = value
        for name in (INPUT_SCALE_BUFFER, INPUT_SHIFT_BUFFER):
            delattr(self, name)
        self.cfg = dataclasses.replace(self.cfg, input_variance=None)

    def fold_W_dec_norm(self) -> None:
        _refuse_decoder_norm_folding()

    def fold_and_get_W_dec_norm(self) -> Tensor:
        _refuse_decoder_norm_folding()
