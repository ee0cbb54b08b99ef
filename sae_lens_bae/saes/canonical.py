"""The canonical form of a BAE: every code bit's rare state is its 1, an exact
reparametrisation.

A bit that is on for most tokens says something when it is *off*. Flipping it (negate its
encoder column and bias, negate its decoder row and add the row to the decoder bias) changes no
reconstruction and no burstiness, but makes "fires" mean "is in its informative state" for every
bit, so that firing frequencies, records and dense counts read the same way as an SAE's.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

__all__ = ["canonicalise", "flipped_bits"]


def flipped_bits(prior: Float[Tensor, " n_bits"]) -> Bool[Tensor, " n_bits"]:
    """The bits whose usual state is 1 (mean code above 1/2): the ones canonicalising flips."""
    return prior > 0.5


@torch.no_grad()
def canonicalise(bae: Any, prior: Float[Tensor, " n_bits"] | None = None) -> Any:
    """A copy of ``bae`` whose bits with ``prior`` > 1/2 are flipped (``prior``: default the
    BAE's training mean code). The copy decodes every input to the same output (up to float
    rounding, and inputs whose pre-activation is exactly 0) and has prior ``min(p, 1 - p)``.

    Flipping bit j replaces h_j by 1 - h_j: pre-activation z_j -> -z_j (encoder column and
    bias negated; with ``apply_b_dec_to_input`` the bias also absorbs the decoder-bias shift), and
    h_j W_dec[j] = W_dec[j] - (1 - h_j) W_dec[j] (decoder row negated, added to ``b_dec``).
    """
    if bae.cfg.bits_per_feature != 1:
        raise ValueError(
            "canonicalise needs one bit per feature: a more-bit feature's bits share one decoder "
            "row, so a single bit cannot be flipped exactly"
        )
    prior = (bae.code_mean if prior is None else prior).detach().float().to(bae.W_enc.device)
    if prior.shape != (bae.cfg.n_bits,):
        raise ValueError(
            f"prior has shape {tuple(prior.shape)}, the BAE has {bae.cfg.n_bits} code bits"
        )
    flip = flipped_bits(prior)
    out = copy.deepcopy(bae)
    sign = torch.where(flip, -1.0, 1.0).to(bae.W_enc.dtype)
    shift = bae.W_dec[flip].sum(0)  # b_dec' = b_dec + sum of the flipped rows
    out.b_dec.add_(shift)
    out.W_dec.mul_(sign[:, None])
    out.W_enc.mul_(sign)
    if bae.cfg.apply_b_dec_to_input:  # the encoder reads x - b_dec: keep its pre-activations
        out.b_enc.add_(shift @ bae.W_enc)
    out.b_enc.mul_(sign)
    out.code_mean.copy_(torch.where(flip, 1.0 - bae.code_mean, bae.code_mean))
    return out
