"""Burstiness: how surprising each code bit of a token is, given the bit's usual value.

A BAE's features are binary, so "how strongly" a feature fires is not in the code itself. The
paper measures it against a prior: burstiness = log2|h_B - prior|, with the prior the mean code.
A bit that fires where it rarely does (prior near 0) scores near log2(1) = 0, the top; a bit that
is off where it is usually on scores log2(prior); a bit at its usual value scores very negative.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.saes.protocols import BinaryEncoder

__all__ = ["PriorSource", "burstiness", "code_prior", "has_training_prior"]

PriorSource = Literal["training", "evaluation"]

_FLOOR = 2.0**-24
"""|h_B - prior| is clamped here before log2: a dead bit (prior 0) that stays off gives -24, not
-inf, so magnitudes stay finite and sortable."""


def burstiness(
    codes: Float[Tensor, "... n_bits"], prior: Float[Tensor, " n_bits"]
) -> Float[Tensor, "... n_bits"]:
    """log2|h_B - prior| elementwise (float32), floored at -24.

    Neither argument is modified or aliased: the result is a new tensor.
    """
    if codes.shape[-1] != prior.shape[-1]:
        raise ValueError(
            f"codes have {codes.shape[-1]} bits but the prior has {prior.shape[-1]}; use the "
            "prior of the BAE that produced the codes"
        )
    prior = prior.to(codes.device, torch.float32)
    return torch.log2((codes.float() - prior).abs().clamp_min(_FLOOR))


def has_training_prior(bae: Any) -> bool:
    """Whether the BAE holds a mean code from training: a training BAE whose running mean was
    updated, or a saved BAE's ``code_mean`` (all zero only when it was never updated: no trained
    code has every bit always off)."""
    code_mean = getattr(bae, "code_mean", None)
    if not isinstance(code_mean, Tensor):
        return False
    count = getattr(bae, "code_mean_count", None)
    return bool(code_mean.any()) if count is None else float(count) > 0


@torch.no_grad()
def code_prior(
    bae: BinaryEncoder,
    activations: Float[Tensor, "n d_in"] | None = None,
    source: PriorSource = "training",
    batch_size: int = 4096,
) -> Float[Tensor, " n_bits"]:
    """The prior for ``burstiness``: the BAE's running mean code from training (``"training"``,
    its ``code_mean`` buffer) or the mean code over ``activations`` (``"evaluation"``).

    Returns a copy either way, so later training cannot change a prior already handed out.
    """
    if source == "training":
        code_mean = getattr(bae, "code_mean", None)
        if not has_training_prior(bae):
            raise ValueError(
                "This BAE has no training prior (its code_mean was never updated); pass "
                "activations with source='evaluation'"
            )
        return code_mean.detach().clone().float()
    if source != "evaluation":
        raise ValueError(f"source must be 'training' or 'evaluation', got {source!r}")
    if activations is None or activations.shape[0] == 0:
        raise ValueError("source='evaluation' needs the evaluation activations")
    total = None
    for start in range(0, activations.shape[0], batch_size):
        bits = bae.encode_bits(activations[start : start + batch_size])
        part = bits.sum(0, dtype=torch.float64)
        total = part if total is None else total + part
    assert total is not None
    return (total / activations.shape[0]).float()
