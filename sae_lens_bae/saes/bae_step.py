"""The BAE's training step, written once for one BAE and for a stack of BAEs of one config.

Every tensor of a :class:`Stack` carries the stack's leading dimensions: none for one BAE (a
SAELens ``BAETrainingSAE`` hands its own parameters and buffers, so its kernels are a single
BAE's), ``[G]`` for a ``StackedBAE``. :func:`train_step` then does what a step does, in order: fix
the input frame on the first minibatch, resample the channels that were constant through a
resampling window, encode with surrogate gradients, decode, compute ``bae_objective`` on the
global minibatch of a data-parallel group, and advance the running mean code and the window's
firing counts. The phases come from a resolved ``Schedule``; nothing here knows how long
training is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor, nn

from sae_lens_bae.global_batch import GlobalBatch
from sae_lens_bae.losses import bae_objective
from sae_lens_bae.saes.bae_config import BAETrainingSAEConfig
from sae_lens_bae.saes.binary import bits_to_values, record_codes, step
from sae_lens_bae.saes.input_scale import (
    Frame,
    fix_frame,
    frame,
    frame_factor,
    module_frame,
    unframe,
)
from sae_lens_bae.saes.resampling import resample_members
from sae_lens_bae.saes.schedule import Schedule

__all__ = [
    "Stack",
    "StepOutput",
    "affine",
    "forward_in_frame",
    "objective_terms",
    "stack_of",
    "train_step",
]


class Stack(NamedTuple):
    """The weights of one BAE or of a stack, and the buffers its step updates in place."""

    W_enc: Tensor
    """[*stack, d_in, n_bits]"""
    b_enc: Tensor
    """[*stack, n_bits]"""
    W_dec: Tensor
    """[*stack, d_sae, d_in]"""
    b_dec: Tensor
    """[*stack, d_in]"""
    code_mean: Tensor
    """[*stack, n_bits], fp32: the running mean code."""
    code_mean_count: Tensor
    """[], fp32: minibatches the running mean has seen."""
    window: tuple[Tensor, Tensor] | None
    """The resampling window's firing counts [*stack, n_bits] and samples [] (None: no
    resampling)."""
    frame: Frame | None
    """The input frame (k, t) (None: inputs read as given)."""

    def rows(self, members: Tensor | None) -> Stack:
        """The stack rows ``members`` (gradients flow back to them); all rows for None. The
        buffers stay whole: ``record_codes`` and ``resample_members`` index them in place."""
        if members is None:
            return self
        frame_rows = None
        if self.frame is not None:
            frame_rows = (self.frame[0][members], self.frame[1][members])
        return self._replace(
            W_enc=self.W_enc[members],
            b_enc=self.b_enc[members],
            W_dec=self.W_dec[members],
            b_dec=self.b_dec[members],
            frame=frame_rows,
        )


def stack_of(module: nn.Module) -> Stack:
    """A ``BAETrainingSAE``'s or a ``StackedBAE``'s parameters and buffers as a :class:`Stack`:
    what its training step reads and updates."""
    counts = getattr(module, "window_counts", None)
    window = None if counts is None else (counts, module.window_samples)
    parts = (getattr(module, name) for name in ("W_enc", "b_enc", "W_dec", "b_dec", "code_mean"))
    return Stack(*parts, module.code_mean_count, window, module_frame(module))  # type: ignore[arg-type]


class StepOutput(NamedTuple):
    """What one step computed, per member of the stack."""

    terms: dict[str, Tensor]
    """``bae_objective``'s loss and terms, each of shape [*stack]."""
    hidden_pre: Tensor
    """Pre-activations [*stack, batch, n_bits] of this process's rows."""
    bits: Tensor
    """The code [*stack, batch, n_bits] with surrogate gradients."""
    values: Tensor
    """The decoder's inputs (more-bit values) [*stack, batch, d_sae]."""
    output: Tensor
    """The reconstruction in the inputs' units [*stack, batch, d_in]."""
    global_bits: Tensor
    """The codes of the global minibatch (detached), [*stack, global batch, n_bits]."""
    mean_code: Tensor
    """The global minibatch's mean code [*stack, n_bits] (detached)."""


def affine(bias: Tensor, x: Tensor, weight: Tensor) -> Tensor:
    """``x @ weight + bias`` for one BAE (one addmm) or for each member of a stack (one baddbmm)."""
    if x.ndim == 2:
        return torch.addmm(bias, x, weight)
    return torch.baddbmm(bias.unsqueeze(-2), x, weight)


def encoder_inputs(stack: Stack, framed: Tensor, cfg: BAETrainingSAEConfig) -> Tensor:
    """What the encoder reads: the framed inputs, less the decoder bias when centring."""
    return framed - stack.b_dec.unsqueeze(-2) if cfg.apply_b_dec_to_input else framed


def forward_in_frame(
    stack: Stack, framed: Tensor, cfg: BAETrainingSAEConfig, surrogate: bool = False
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(pre-activations, code, decoder inputs, reconstruction) of framed inputs, the
    reconstruction in the frame; with ``surrogate``, gradients pass through the code."""
    hidden_pre = affine(stack.b_enc, encoder_inputs(stack, framed, cfg), stack.W_enc)
    if surrogate:
        bits = step(hidden_pre, cfg.surrogate, cfg.surrogate_temperature)
    else:
        bits = step(hidden_pre)
    values = bits_to_values(bits, cfg.bits)
    return hidden_pre, bits, values, affine(stack.b_dec, values, stack.W_dec)


def objective_terms(
    x: Tensor,
    output: Tensor,
    bits: Tensor,
    coefficients: dict[str, float],
    input_frame: Frame | None,
    *,
    entropy_on: bool = True,
    covariance_on: bool = True,
    **objective: object,
) -> dict[str, Tensor]:
    """``bae_objective`` with these coefficients, of inputs and reconstructions in the inputs'
    units, the reconstruction error measured in the units of the input frame's k (if any), so
    that a recipe holds at any input scale."""
    if input_frame is not None:
        scale = frame_factor(input_frame[0])[..., None, None]
        x, output = x * scale, output * scale
    return bae_objective(
        x,
        output,
        bits,
        entropy_coefficient=coefficients["entropy"],
        covariance_coefficient=coefficients["covariance"] * covariance_on,
        entropy_on=entropy_on,
        **objective,  # type: ignore[arg-type]
    )


def _fix_frames(input_frame: Frame, x: Tensor, target: float, members: Tensor | None) -> None:
    """``fix_frame`` for every member (or the rows ``members``, written back)."""
    if members is None:
        fix_frame(input_frame, x, target)
        return
    rows = (input_frame[0][members], input_frame[1][members])
    fix_frame(rows, x, target)
    input_frame[0][members], input_frame[1][members] = rows


@torch.no_grad()
def _resample(
    stack: Stack, x: Tensor, cfg: BAETrainingSAEConfig, members: Tensor | None
) -> list[int]:
    """Resample each member's constant channels on its global minibatch (``resample_members``)."""
    rows = stack.rows(members)
    framed = frame(x, rows.frame)
    inputs = encoder_inputs(rows, framed, cfg)
    residuals = x - unframe(forward_in_frame(rows, framed, cfg)[3], rows.frame)
    if rows.frame is not None:  # decoder rows live in the framed units
        residuals = residuals * frame_factor(rows.frame[0])[..., None, None]
    single = x.ndim == 2  # one BAE: a stack of one for resample_members
    lead = (lambda t: t[None]) if single else (lambda t: t)
    window = stack.window
    assert window is not None  # resampling is scheduled only with a window
    ids = [0] if single else (range(x.shape[0]) if members is None else members.tolist())
    return resample_members(
        lead(stack.W_enc.data), lead(stack.b_enc.data), lead(stack.W_dec.data),
        lead(inputs), lead(residuals), lead(window[0]), window[1], lead(stack.code_mean),
        members=list(ids), bits_per_feature=cfg.bits,
    )  # fmt: skip


def train_step(
    stack: Stack,
    x: Float[Tensor, "*stack batch d_in"],
    cfg: BAETrainingSAEConfig,
    schedule: Schedule,
    n: int,
    *,
    coefficients: dict[str, float] | None = None,
    batch: GlobalBatch | None = None,
    members: Tensor | None = None,
    covariance_off: Sequence[bool] | None = None,
    resample: bool = True,
) -> StepOutput:
    """One training step of the BAE (or of every BAE of the stack) at schedule step ``n``.

    ``x``: each member's minibatch, in the dtype of the weights. ``coefficients``: the
    objective's (default the config's). ``batch``: the data-parallel group whose concatenated
    minibatch the step trains on (default this process alone). ``members``: the stack rows that
    train (``x`` holds their minibatches; the others cost nothing and get no gradient).
    ``covariance_off``: per row of ``x``, True where that BAE trains without the covariance term
    (its final phase after it converged). ``resample``: False for a second step at the same
    ``n`` (a held schedule), which must not resample again.
    """
    batch = batch or GlobalBatch.local()
    coefficients = cfg.coefficients() if coefficients is None else coefficients
    # what this step does, read from the schedule once
    resampling = resample and schedule.resamples_before(n)
    entropy_on, covariance_on = schedule.entropy_on(n), schedule.covariance_on(n)
    counting = schedule.window_counted(n)  # no counts past the last resampling
    # every rank frames from the first global batch; later only if that had no variance
    framing = stack.frame is not None and (n == 0 or batch.world == 1)
    if framing or resampling:
        global_x = batch.gather(x)
        if framing and stack.frame is not None and cfg.rescale_inputs_to is not None:
            _fix_frames(stack.frame, global_x, cfg.rescale_inputs_to, members)
        if resampling:
            _resample(stack, global_x, cfg, members)
    rows = stack.rows(members)
    framed = frame(x, rows.frame)
    hidden_pre, bits, values, reconstruction = forward_in_frame(rows, framed, cfg, surrogate=True)
    global_bits = batch.gather(bits, codes=True)  # one gather for the covariance and the counts
    off = None if covariance_off is None else torch.tensor(covariance_off, device=x.device)
    no_member_pays = covariance_off is not None and all(covariance_off)  # then not computed
    output = unframe(reconstruction, rows.frame)
    terms = objective_terms(
        x,
        output,
        bits,
        coefficients,
        rows.frame,
        entropy_on=entropy_on,
        covariance_on=covariance_on and not no_member_pays,
        batch=batch,
        global_bits=global_bits,
        covariance_off=off,
    )
    mean_code = terms.pop("batch_mean_code")
    window = stack.window if counting else None
    lead = (lambda t: t[None]) if x.ndim == 2 else (lambda t: t)  # one BAE: a stack of one
    if window is not None:
        window = (lead(window[0]), window[1])
    codes = global_bits.detach()
    code_mean, count = lead(stack.code_mean), stack.code_mean_count
    record_codes(code_mean, count, lead(codes), lead(mean_code), window, members)
    return StepOutput(terms, hidden_pre, bits, values, output, codes, mean_code)
