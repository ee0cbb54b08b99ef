"""Task vectors: the direction that separates two sets of hidden states, read through features.

For a BAE the paper's recipe is h_D = mean code on the positive set - mean code on the negative
set, keep the ``top`` largest |h_D| entries, and decode them: h_D W_dec. The same recipe applies
to any SAELens SAE through its activations, so BAE and SAE vectors are built and compared the same
way; ``mean_difference`` (no features at all) is the reference they should be judged against.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.saes.input_frame import in_input_units

__all__ = ["feature_difference", "mean_difference", "task_vector"]


def _check(positive: Tensor, negative: Tensor, d_in: int | None = None) -> None:
    for name, acts in (("positive", positive), ("negative", negative)):
        if acts.ndim != 2 or acts.shape[0] == 0:
            raise ValueError(
                f"{name}_acts must be a non-empty [n, d] tensor, got {tuple(acts.shape)}"
            )
        if d_in is not None and acts.shape[1] != d_in:
            raise ValueError(
                f"{name}_acts have width {acts.shape[1]} but the SAE reads d_in = {d_in}: pass the "
                "hidden states of the hook point it was trained on"
            )
        if not torch.isfinite(acts).all():
            raise ValueError(f"{name}_acts hold NaN/Inf values")


@torch.no_grad()
def _mean_features(sae: Any, acts: Tensor, input_scale: float, batch_size: int) -> Tensor:
    total = None
    for start in range(0, acts.shape[0], batch_size):
        x = acts[start : start + batch_size].to(sae.device, sae.dtype) * input_scale
        part = sae.encode(x).double().sum(0)
        total = part if total is None else total + part
    assert total is not None
    return total / acts.shape[0]


@torch.no_grad()
def feature_difference(
    sae: Any,
    positive_acts: Float[Tensor, "n_pos d_in"],
    negative_acts: Float[Tensor, "n_neg d_in"],
    top: int | None = 256,
    *,
    input_scale: float = 1.0,
    batch_size: int = 4096,
) -> Float[Tensor, " d_sae"]:
    """h_D: mean features on the positive set minus on the negative set, all but the ``top``
    largest |h_D| entries zeroed (``top=None`` keeps all). For a BAE the features are its code."""
    _check(positive_acts, negative_acts, sae.cfg.d_in)
    if top is not None and top < 1:
        raise ValueError(f"top must be >= 1 (or None for every feature), got {top}")
    diff = _mean_features(sae, positive_acts, input_scale, batch_size) - _mean_features(
        sae, negative_acts, input_scale, batch_size
    )
    if top is not None and top < diff.numel():
        keep = diff.abs().topk(top).indices
        sparse = torch.zeros_like(diff)
        sparse[keep] = diff[keep]
        diff = sparse
    return diff.float()


@torch.no_grad()
def task_vector(
    sae: Any,
    positive_acts: Float[Tensor, "n_pos d_in"],
    negative_acts: Float[Tensor, "n_neg d_in"],
    top: int | None = 256,
    *,
    input_scale: float = 1.0,
    batch_size: int = 4096,
) -> Float[Tensor, " d_in"]:
    """The steering vector h_D W_dec in the units of the hidden states.

    ``input_scale``: the factor the SAE's training activations were multiplied by (e.g. SAELens'
    activation normalisation); states are scaled by it before encoding and the vector is divided
    by it, so the vector can be added to the model's own residual stream. The decoder bias cancels
    in the difference and is not added; a BAE's decoder is read in input units (its input frame
    folded in).
    """
    diff = feature_difference(
        sae, positive_acts, negative_acts, top, input_scale=input_scale, batch_size=batch_size
    )
    W_dec = in_input_units(sae).W_dec
    vector = diff.to(W_dec.device, W_dec.dtype) @ W_dec
    return (vector / input_scale).float().cpu()


def mean_difference(
    positive_acts: Float[Tensor, "n_pos d"], negative_acts: Float[Tensor, "n_neg d"]
) -> Float[Tensor, " d"]:
    """Mean positive state minus mean negative state: the feature-free task vector."""
    _check(positive_acts, negative_acts)
    if positive_acts.shape[1] != negative_acts.shape[1]:
        raise ValueError(
            f"positive and negative states differ in width: {positive_acts.shape[1]} vs "
            f"{negative_acts.shape[1]}"
        )
    return (positive_acts.double().mean(0) - negative_acts.double().mean(0)).float()
