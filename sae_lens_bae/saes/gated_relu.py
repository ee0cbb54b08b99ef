"""The paper's "Gated ReLU" SAE baseline: a ReLU whose output is kept only above a fixed gate.

f(x) = z * 1[z > threshold] with z = x W_enc + b_enc and threshold 0.5, trained with the L1
penalty of SAELens' standard SAE. This is not SAELens' ``gated`` architecture (which learns a
separate gating path); it is the standard SAE with a fixed JumpReLU-style threshold, registered
as ``gated_relu`` so it loads and trains like any SAELens architecture. The threshold is not
learned. Backward, the gate is straight-through: the gradient is the ReLU's (1 where z > 0).
With the gate's own gradient (0 below the threshold) a unit below 0.5 could never rise above
it, and at SAELens' initialisation (decoder norm 0.1, encoder its transpose) on activations
scaled to norm sqrt(d) almost every z starts below 0.5: the SAE would be dead from step 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from sae_lens.saes.standard_sae import (
    StandardSAE,
    StandardSAEConfig,
    StandardTrainingSAE,
    StandardTrainingSAEConfig,
)

__all__ = [
    "ARCHITECTURE",
    "GatedReLUSAE",
    "GatedReLUSAEConfig",
    "GatedReLUTrainingSAE",
    "GatedReLUTrainingSAEConfig",
]

ARCHITECTURE = "gated_relu"


class _GatedReLUConfig:
    """What both configs add to SAELens' standard ones: the fixed gate threshold, checked."""

    gate_threshold: float

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        if not self.gate_threshold >= 0:
            raise ValueError(
                f"gate_threshold must be >= 0 (a ReLU gate), got {self.gate_threshold}"
            )

    @classmethod
    def architecture(cls) -> str:
        return ARCHITECTURE


@dataclass
class GatedReLUSAEConfig(_GatedReLUConfig, StandardSAEConfig):
    """A standard SAE config plus the fixed gate threshold (paper: 0.5)."""

    gate_threshold: float = 0.5


@dataclass
class GatedReLUTrainingSAEConfig(_GatedReLUConfig, StandardTrainingSAEConfig):
    """The training config: L1 coefficient as in ``standard`` plus the gate threshold."""

    gate_threshold: float = 0.5


def _gated_relu(threshold: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def activation(z: torch.Tensor) -> torch.Tensor:
        relu = torch.relu(z)
        gate = (z > threshold).to(z.dtype)
        return relu * gate + (relu - relu.detach()) * (1 - gate)  # value gated, ReLU gradient

    return activation


class GatedReLUSAE(StandardSAE):
    """Inference class of ``gated_relu``."""

    cfg: Any

    def get_activation_fn(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return _gated_relu(self.cfg.gate_threshold)


class GatedReLUTrainingSAE(StandardTrainingSAE):
    """Training class of ``gated_relu``: SAELens' standard L1 training with the gated ReLU."""

    cfg: Any

    def get_activation_fn(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return _gated_relu(self.cfg.gate_threshold)
