"""The maths of a BAE's training step as functions of tensors, for one BAE or a stack of them:
what the encoder reads, its pre-activations, the reconstruction, the check that an input frame
is set, the coefficients of the step's phase, the code's penalties and the record of the
running mean code.

One BAE's weights are ``W [d, n]`` and ``b [n]``, its inputs ``[..., batch, d_in]`` and its frame
``(k [], t [d_in])``; a stack of G BAEs (``stacks.StackedBAE``) is the same with a leading
dimension on each: ``W [G, d, n]``, ``b [G, n]``, inputs ``[G, batch, d_in]``, frame
``(k [G], t [G, d_in])``. An input frame of None reads the inputs as given. ``BAETrainingSAE``
(SAELens' step) and ``StackedBAE.losses`` both call these, so the two steps are one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from sae_lens_bae.saes.code_mean import update_running_mean
from sae_lens_bae.saes.input_frame import Frame, frame, unframe
from sae_lens_bae.saes.objective import CovariancePenalty, code_counts, code_penalties, frame_weight

__all__ = [
    "affine",
    "encoder_inputs",
    "check_frame_set",
    "phase_coefficients",
    "pre_activations",
    "reconstruct",
    "record_code",
    "step_penalties",
]


def _over_rows(bias: Tensor) -> Tensor:
    """A bias ``[..., n]`` shaped to add to each row of ``[..., batch, n]``: one BAE's as it is
    (its inputs may have any leading dimensions), a stack's ``[G, 1, n]``."""
    return bias if bias.ndim == 1 else bias.unsqueeze(-2)


def affine(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``x @ weight + bias`` in one kernel: addmm for one BAE (``weight [d, n]``), baddbmm for a
    stack (``weight [G, d, n]``, ``x [G, batch, d]``)."""
    if weight.ndim == 2:
        return F.linear(x, weight.t(), bias)
    if weight.ndim == 3:
        return torch.baddbmm(bias.unsqueeze(-2), x, weight)
    return torch.matmul(x, weight) + _over_rows(bias)  # more than one stack dimension


def encoder_inputs(
    x: Tensor, input_frame: Frame | None, b_dec: Tensor, apply_b_dec_to_input: bool
) -> Tensor:
    """What the encoder reads: ``k (x + t)`` (``x`` itself without a frame), less ``b_dec`` when
    centring (SAELens' ``apply_b_dec_to_input``)."""
    x = frame(x, input_frame)
    return x - _over_rows(b_dec) if apply_b_dec_to_input else x


def pre_activations(inputs: Tensor, W_enc: Tensor, b_enc: Tensor) -> Tensor:
    """``inputs W_enc + b_enc`` of :func:`encoder_inputs`: every code bit's pre-activation."""
    return affine(inputs, W_enc, b_enc)


def reconstruct(values: Tensor, W_dec: Tensor, b_dec: Tensor, input_frame: Frame | None) -> Tensor:
    """``values W_dec + b_dec`` out of the frame: in the inputs' own units (in the frame's for
    ``input_frame`` None)."""
    return unframe(affine(values, W_dec, b_dec), input_frame)


def check_frame_set(input_frame: Frame | None) -> None:
    """Refuse a step with an unset input frame (k 0): a frame is estimated on the training set
    before the first step (``input_frame.fix_frame_from_set``, a stack's sets), as SAELens
    estimates its own scale, never on one minibatch inside the step. One wait for the device."""
    if input_frame is not None and not bool((input_frame[0] > 0).all()):
        raise ValueError(
            "This BAE's input frame (input_variance) is unset: it is estimated on the training "
            "set before the first step, which train_sae on a tensor or cache and a stack of BAEs "
            "do; in SAELens' runners or on a stream set input_variance=None and "
            "normalize_activations='expected_average_only_in'"
        )


class _StepConfig(Protocol):
    """A BAE's training config as a step reads it: its coefficients and whether each term counts
    at a step (``BAETrainingSAEConfig.coefficients``, ``entropy_on``, ``covariance_on``)."""

    def coefficients(self) -> dict[str, float]: ...

    def entropy_on(self, step: int) -> bool: ...

    def covariance_on(self, step: int) -> bool: ...


def phase_coefficients(cfg: _StepConfig, n: int) -> dict[str, float]:
    """a_e and a_c (``cfg.coefficients()``, by SAELens' names) as step ``n`` applies them: each 0
    in the phase of training that has its term off. Every phase a step reads is read here."""
    coefficients = cfg.coefficients()
    return {
        "entropy": coefficients["entropy"] * cfg.entropy_on(n),
        "covariance": coefficients["covariance"] * cfg.covariance_on(n),
    }


def step_penalties(
    cfg: _StepConfig,
    bits: Tensor,
    n: int,
    input_frame: Frame | None,
    *,
    batch: Any,
    covariance: CovariancePenalty,
    covariance_off: Sequence[bool] | None = None,
) -> dict[str, Tensor]:
    """The code's terms of step ``n`` (``objective.code_penalties``: the entropy of the (global)
    minibatch's mean code and the summed |off-diagonal covariance|) for codes
    ``[..., batch, n_bits]``, at :func:`phase_coefficients`, each divided by its frame's k^2
    (``objective.frame_weight``: the coefficients weigh the penalties against the squared error
    in the frame's units, ``mse_loss`` is in the inputs'). ``covariance_off``: per leading index
    of a stack, True where that BAE trains without the covariance term."""
    coefficients = phase_coefficients(cfg, n)
    off = None
    if covariance_off is not None:
        if all(covariance_off):  # no member pays: not computed
            coefficients["covariance"] = 0.0
        off = torch.tensor(list(covariance_off), device=bits.device)
    return code_penalties(
        bits,
        entropy_coefficient=coefficients["entropy"],
        covariance_coefficient=coefficients["covariance"],
        weight=frame_weight(input_frame),
        covariance_off=off,
        batch=batch,
        covariance=covariance,
    )


@torch.no_grad()
def record_code(
    code_mean: Tensor,
    code_mean_count: Tensor,
    code: Tensor,
    batch: Any,
    members: Tensor | None = None,
) -> Tensor:
    """The (global) minibatch's mean code ``[..., n_bits]`` of codes ``[..., batch, n_bits]``,
    after moving the running mean code towards it (``code_mean.update_running_mean``); a stack's
    ``members``: the rows that trained (the others keep theirs; the shared count advances
    once)."""
    mean = code_counts(code, batch) / (batch.world * code.shape[-2])
    rows = code_mean if members is None else code_mean[members]
    update_running_mean(rows, code_mean_count, mean)
    if members is not None:  # an indexed copy: written back
        code_mean[members] = rows
    return mean
