"""How a BAE's weights absorb SAELens' input transforms (its input scale, a whitening), exactly,
and why decoder norms cannot be folded into a BAE's encoder."""

from __future__ import annotations

from typing import Any, NoReturn

import torch
from torch import Tensor, nn

from sae_lens_bae.saes.input_scale import INPUT_SCALE_BUFFER, current_input_scale

__all__ = ["BAEFoldsMixin"]


def _refuse_decoder_norm_folding() -> NoReturn:
    raise ValueError(
        "A BAE cannot fold decoder norms: its codes are binary, so scaling the encoder does not "
        "scale them and the reconstruction would change. Load or use it without "
        "fold_W_dec_norm (its outputs are already exact)."
    )


class BAEFoldsMixin:
    """Folds of the inference and the training BAE (before SAELens' classes in their bases)."""

    cfg: Any
    W_enc: nn.Parameter
    b_enc: nn.Parameter | None
    W_dec: nn.Parameter
    b_dec: nn.Parameter

    def fold_activation_whitening(
        self, mean: Tensor, whitening_matrix: Tensor, unwhitening_matrix: Tensor
    ) -> None:
        """SAELens' exact whitening fold; a BAE without an encoder bias reading the raw input
        has nowhere to put the mean's shift, so it is refused there (SAELens would skip it)."""
        if self.b_enc is None and not self.cfg.apply_b_dec_to_input and bool(mean.any()):
            raise ValueError(
                "This BAE has no encoder bias, so a whitening with a non-zero mean cannot be "
                "folded into it exactly; train it with encoder_bias=True or apply_b_dec_to_input"
            )
        self.fold_input_scale()
        super().fold_activation_whitening(mean, whitening_matrix, unwhitening_matrix)  # type: ignore[misc]

    @torch.no_grad()
    def fold_input_scale(self) -> None:
        """Move the input scale into the weights, exactly (it becomes 1): SAELens' whitening
        fold assumes an encoder that reads its input as given."""
        scale = current_input_scale(self)  # type: ignore[arg-type]
        if scale is not None:
            self.W_enc.data *= scale.to(self.W_enc.dtype)
            self.W_dec.data /= scale.to(self.W_dec.dtype)
            self.b_dec.data /= scale.to(self.b_dec.dtype)
            getattr(self, INPUT_SCALE_BUFFER).fill_(1.0)

    def fold_W_dec_norm(self) -> None:
        _refuse_decoder_norm_folding()

    def fold_and_get_W_dec_norm(self) -> Tensor:
        _refuse_decoder_norm_folding()
