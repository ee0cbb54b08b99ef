"""How a BAE's weights absorb SAELens' input transforms (its input frame, a whitening), exactly,
and why decoder norms cannot be folded into a BAE's encoder."""

from __future__ import annotations

from typing import Any, NoReturn

import torch
from torch import Tensor, nn

from sae_lens_bae.saes.input_scale import (
    INPUT_SCALE_BUFFER,
    INPUT_SHIFT_BUFFER,
    InputFrameMixin,
    current_input_scale,
)

__all__ = ["BAEFoldsMixin"]


def _refuse_decoder_norm_folding() -> NoReturn:
    raise ValueError(
        "A BAE cannot fold decoder norms: its codes are binary, so scaling the encoder does not "
        "scale them and the reconstruction would change. Load or use it without "
        "fold_W_dec_norm (its outputs are already exact)."
    )


class BAEFoldsMixin(InputFrameMixin):
    """Folds of the inference and the training BAE (before SAELens' classes in their bases)."""

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
