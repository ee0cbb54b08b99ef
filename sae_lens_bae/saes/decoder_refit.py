"""The least-squares decoder of a trained BAE's code: ``refit_decoder``.

Once the encoder is trained the code is fixed, and the decoder that reconstructs the states best
from it is a linear regression with a closed form. Gradient training stops short of it: the
decoder chases an encoder that is still moving, under a learning rate that never reaches zero.
The code, and so every
entropy estimate read from it, is unchanged: only how much of the state the code is shown to
keep moves.

A regression overfits where it has few states per weight: with as many weights per output as
states, or for a bit that fires on a few dozen. So it is pulled towards the trained decoder
by a ridge, and judged on the training states alone: fitted on a random 80% with each ridge of
``RIDGES``, the best must beat the trained decoder on the other 20%, and only then is it fitted
with that ridge on all of them and installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.saes.binary import bits_to_values

if TYPE_CHECKING:
    from sae_lens_bae.saes.bae import BAE, BAETrainingSAE

__all__ = ["RIDGES", "DecoderRefit", "NormalEquations", "least_squares_decoder", "refit_decoder"]

JITTER = 1e-8
"""Added to the Gram matrix's diagonal, relative to its mean, whatever the ridge: a bit that
never fires (a zero column) or two that always agree (equal columns) leave the normal equations
singular without it; it moves nothing else measurably."""

RIDGES = (0.0, 1.0, 10.0, 100.0, 1000.0)
"""The ridges ``refit_decoder`` chooses from on the held-back states, in units of states (a 0/1
bit's Gram diagonal is the number of states it fires on). A ridge pulls the weights
towards the trained decoder, not towards 0: a bit that fires on a few dozen of 65536 states
gets a regression weight from those few, which can be worse than its trained one
(docs/research/synthetic-entropy.md measures both)."""


@dataclass(frozen=True)
class DecoderRefit:
    """What ``refit_decoder`` did: the validation MSE (per state and dimension, in the units the
    decoder outputs before the input frame is undone) of the trained decoder and of the best
    refitted one, its ridge, and whether it was installed (it was better on the validation
    states)."""

    applied: bool
    trained_mse: float
    refit_mse: float
    ridge: float


class NormalEquations:
    """``X^T X`` and ``X^T Y`` of ``X = [codes, 1]`` (or ``codes`` alone), in fp64, accumulated
    over row chunks: the Gram matrix is d_sae^2, so this runs where a d_sae of tens of thousands
    fits, without materialising [n, d_sae] in fp64; ``solve`` then costs one Cholesky per
    ridge."""

    def __init__(
        self,
        codes: Float[Tensor, "n d_sae"],
        targets: Float[Tensor, "n d"],
        with_bias: bool = True,
        chunk: int = 8192,
    ) -> None:
        self.with_bias, self.chunk = with_bias, chunk
        k, device = codes.shape[1] + int(with_bias), codes.device
        self.gram = torch.zeros(k, k, dtype=torch.float64, device=device)
        self.rhs = torch.zeros(k, targets.shape[1], dtype=torch.float64, device=device)
        self.add(codes, targets)

    def add(self, codes: Float[Tensor, "n d_sae"], targets: Float[Tensor, "n d"]) -> None:
        """Add more rows' sums: the equations of a set fed in pieces are those of the whole."""
        if codes.shape[0] != targets.shape[0]:
            raise ValueError(f"{codes.shape[0]} codes but {targets.shape[0]} targets")
        for start in range(0, codes.shape[0], self.chunk):
            block = codes[start : start + self.chunk].to(self.gram.device, torch.float64)
            if self.with_bias:
                block = torch.cat([block, torch.ones_like(block[:, :1])], 1)
            self.gram += block.T @ block
            self.rhs += block.T @ targets[start : start + self.chunk].to(
                self.rhs.device, torch.float64
            )

    def solve(
        self, ridge: float = 0.0, prior: Tensor | None = None
    ) -> tuple[Float[Tensor, "d_sae d"], Float[Tensor, " d"] | None]:
        """``(W, b)`` minimising ``||codes W + b - targets||^2 + ridge ||[W; b] - prior||^2``
        (``prior`` stacks W and b as the design stacks codes and 1; None: zeros)."""
        jitter = JITTER * max(float(self.gram.diagonal().mean()), 1e-30)
        rhs = self.rhs if prior is None or ridge == 0 else self.rhs + ridge * prior.double()
        for _ in range(8):  # more jitter only if fp64 still finds the system indefinite
            system = self.gram.clone()
            system.diagonal().add_(ridge + jitter)
            factor, info = torch.linalg.cholesky_ex(system)
            del system
            if int(info) == 0:
                break
            jitter *= 100
        solution = torch.cholesky_solve(rhs, factor)
        if self.with_bias:
            return solution[:-1], solution[-1]
        return solution, None


def least_squares_decoder(
    codes: Float[Tensor, "n d_sae"],
    targets: Float[Tensor, "n d"],
    with_bias: bool = True,
    ridge: float = 0.0,
    prior: Tensor | None = None,
    chunk: int = 8192,
) -> tuple[Float[Tensor, "d_sae d"], Float[Tensor, " d"] | None]:
    """``(W, b)`` minimising ``||codes W + b - targets||^2 + ridge ||[W; b] - prior||^2`` (``b``
    None without ``with_bias``), by the normal equations (``NormalEquations``)."""
    return NormalEquations(codes, targets, with_bias, chunk).solve(ridge, prior)


def _decoder_inputs_and_targets(bae: BAE | BAETrainingSAE, states: Tensor) -> tuple[Tensor, Tensor]:
    """The decoder's inputs (h_R) for ``states`` and what its output should be in the units it
    decodes to (the framed, normalised input, before centring by ``b_dec``)."""
    x = states.to(bae.W_enc.device, bae.W_enc.dtype)
    values = bits_to_values(bae.encode_bits(x), bae.cfg.bits_per_feature)
    framed = bae.process_sae_in(x)
    if bae.cfg.apply_b_dec_to_input:
        framed = framed + bae.b_dec
    return values, framed


@torch.no_grad()
def refit_decoder(
    bae: BAE | BAETrainingSAE,
    states: Float[Tensor, "n d_in"],
    validation_fraction: float = 0.2,
    seed: int = 0,
    ridges: tuple[float, ...] = RIDGES,
    chunk: int = 8192,
) -> DecoderRefit:
    """Replace ``bae``'s decoder (``W_dec``, and ``b_dec`` unless the encoder reads it:
    ``apply_b_dec_to_input``) by the least-squares decoder of its code on ``states`` (its training
    states), pulled towards the trained one by the ridge of ``ridges`` that does best on a
    random ``validation_fraction`` of them held back, if that beats the trained decoder there;
    works on a ``BAE`` or a ``BAETrainingSAE``, with or without an input frame. The encoder, and
    so the code, is not touched."""
    if not 0 < validation_fraction < 1:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    if not ridges or min(ridges) < 0:
        raise ValueError(f"ridges must be one or more values >= 0, got {ridges}")
    n = states.shape[0]
    n_val = int(round(n * validation_fraction))
    if n_val < 1 or n - n_val < 1:
        raise ValueError(f"refit_decoder needs states for both parts, got {n}")
    fit_bias = not bae.cfg.apply_b_dec_to_input
    w_trained = bae.W_dec.detach()
    b_trained = bae.b_dec.detach()
    prior = torch.cat([w_trained, b_trained[None]]) if fit_bias else w_trained
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).to(states.device)

    def blocks(rows: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
        """The code and target of ``rows``, a chunk at a time: never [n, d_sae] at once, so a
        million states refit in the memory of their own copy."""
        for start in range(0, len(rows), chunk):
            values, targets = _decoder_inputs_and_targets(bae, states[rows[start : start + chunk]])
            if not fit_bias:  # the bias stays: fit W to what is left once it is taken off
                targets = targets - b_trained
            yield values, targets

    d_out = w_trained.shape[1]

    def no_rows() -> NormalEquations:  # filled by ``add``, a chunk at a time
        empty = w_trained.new_zeros(0, w_trained.shape[0]), w_trained.new_zeros(0, d_out)
        return NormalEquations(*empty, with_bias=fit_bias, chunk=chunk)

    equations, held_back = no_rows(), no_rows()
    for values, targets in blocks(order[n_val:]):
        equations.add(values, targets)
    # every ridge's decoder, then the trained one: all scored in one pass over the held-back part
    decoders = [equations.solve(ridge, prior) for ridge in ridges]
    decoders.append((w_trained.double(), b_trained.double() if fit_bias else None))
    squared = torch.zeros(len(decoders), dtype=torch.float64, device=equations.gram.device)
    for values, targets in blocks(order[:n_val]):
        x, y = values.double(), targets.double()
        for i, (w, b) in enumerate(decoders):  # summed on the device: no sync per chunk
            squared[i] += (x @ w + (0 if b is None else b) - y).pow(2).sum()
        held_back.add(values, targets)
    errors = (squared / (n_val * d_out)).tolist()
    trained = errors.pop()
    scores = dict(zip(ridges, errors, strict=True))
    ridge = min(scores, key=scores.__getitem__)
    applied = scores[ridge] < trained
    if applied:  # the held-back fifth's sums added: the equations of all the states
        equations.gram += held_back.gram
        equations.rhs += held_back.rhs
        w, b = equations.solve(ridge, prior)
        bae.W_dec.data.copy_(w.to(bae.W_dec.dtype))
        if b is not None:
            bae.b_dec.data.copy_(b.to(bae.b_dec.dtype))
    return DecoderRefit(applied=applied, trained_mse=trained, refit_mse=scores[ridge], ridge=ridge)
