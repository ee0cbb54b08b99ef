"""When a latent is active: an SAE latent that fires, a BAE bit in its rare state. The one
definition every count of ``features.statistics`` and every common magnitude of
``features.records`` reads."""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

__all__ = ["latent_activity", "rarity"]


def rarity(p: Float[Tensor, " bits"]) -> Float[Tensor, " bits"]:
    """A bit's firing frequency from its mean code p: the frequency of its rare state."""
    return torch.minimum(p, 1.0 - p)


@torch.no_grad()
def latent_activity(
    sae: Any, x: Float[Tensor, "n d_in"], majority: Bool[Tensor, " bits"] | None = None
) -> Bool[Tensor, "n latents"]:
    """Which latents are active on each row of ``x``: an SAE latent that fires; a BAE bit whose
    bit differs from ``majority`` (its usual value, ``mean code > 1/2`` on the tokens read)."""
    if hasattr(sae, "encode_bits"):
        if majority is None:
            raise ValueError("a BAE's activity needs each bit's usual value (majority=p > 0.5)")
        return (sae.encode_bits(x) > 0) != majority.to(x.device)
    return sae.encode(x) != 0
