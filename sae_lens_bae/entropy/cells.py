"""One BAE per set of hidden states, trained together, each set's entropy estimated.

Every entropy experiment (the synthetic benchmark, tracing by position, by number of ICL
demonstrations, the two-token benchmark) is the same step repeated over a grid of *cells*: train
a BAE on the cell's hidden states, then estimate their entropy with it. ``estimate_entropies``
does it for a whole grid at once with ``train_stacked_baes``; ``EntropyRecipe`` is how each BAE
is trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.entropy.estimate import estimate_entropy
from sae_lens_bae.evaluation import evaluate_sae
from sae_lens_bae.reports import cell
from sae_lens_bae.saes.bae import BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.training.stacked import train_stacked_baes

__all__ = [
    "CELL_COLUMNS",
    "TRACING_RECIPE",
    "CellEntropy",
    "EntropyRecipe",
    "estimate_entropies",
    "normalise_scale",
]


@dataclass(frozen=True)
class EntropyRecipe:
    """How a BAE is trained for entropy estimation.

    The defaults are the rule that estimated every r <= 32 of the synthetic benchmark exactly in
    the prototype (d = 64 and 128): sigmoid surrogate at temperature 0.3, Adam lr 2e-3, entropy off
    for the first 25% of steps, and the paper's d = 2048 coefficients (a_e = 5e-7, a_c = 1e-6)
    rescaled by 2048 / d, since the reconstruction loss is a mean over d dimensions while the
    penalties are sums over channels. ``objective=False`` is the ablation a_e = a_c = 0.
    """

    expansion: int = 4
    """d_sae / d_in of each BAE."""
    steps: int = 1000
    """Training steps of each BAE."""
    batch_size: int = 512
    """BAE minibatch (the entropy term is measured on it)."""
    lr: float = 2e-3
    """Adam learning rate of the BAEs."""
    surrogate_temperature: float = 0.3
    """Temperature of the sigmoid surrogate gradient."""
    entropy_coefficient_2048: float = 5e-7
    """a_e at d = 2048; each BAE uses a_e * 2048 / d."""
    covariance_coefficient_2048: float = 1e-6
    """a_c at d = 2048; each BAE uses a_c * 2048 / d."""
    entropy_off_fraction: float = 0.25
    """Fraction of the steps trained without the entropy term."""
    objective: bool = True
    """Train with the entropy and covariance terms (False: the ablation a_e = a_c = 0)."""
    target_squared_norm: float = 1.0
    """Each set is scaled to this mean squared norm before training."""

    def check_samples(self, n: int, what: str) -> None:
        """Fail before any model runs if a cell would hold fewer samples than one minibatch."""
        if n < self.batch_size:
            raise ValueError(
                f"{what} gives {n} hidden states per cell, fewer than one minibatch "
                f"(batch_size={self.batch_size}); use more or a smaller recipe batch_size"
            )

    def config(self, d_in: int) -> BAETrainingSAEConfig:
        scale = 2048 / d_in if self.objective else 0.0
        return BAETrainingSAEConfig(
            d_in=d_in,
            d_sae=self.expansion * d_in,
            surrogate_temperature=self.surrogate_temperature,
            entropy_coefficient=self.entropy_coefficient_2048 * scale,
            covariance_coefficient=self.covariance_coefficient_2048 * scale,
            entropy_off_fraction=self.entropy_off_fraction,
            total_training_steps=self.steps,
        )


TRACING_RECIPE = EntropyRecipe(expansion=1, steps=1000, batch_size=256, lr=4e-3)
"""The LLM-tracing default, sized for a 2-core CPU: d_sae = d_in is room enough for the few
dozen bits a set of a few thousand states can show, a batch of 256 halves the step cost, and lr
4e-3 (as in the synthetic ``cpu`` preset) converges in 1000 steps. On SmolLM2-135M's layer 15 the
two-token benchmark with it gave 1.00 / 2.42 / 3.83 / 4.93 bits for r = 1 / 2 / 4 / 8 (ceilings
1 / 2 / 4 / 7.8), with relative reconstruction error 0 / 0.1% / 17% / 27%; normalising to mean
squared norm 4 instead gave 1.0 / 3.2 / 7.5 / 9.9 at 0 / 0 / 9% / 17%."""


CELL_COLUMNS = [
    ("bits", lambda row: cell(row["bits"], ".2f")),
    ("relative error", lambda row: cell(row["relative_error"], ".4f")),
]
"""The markdown columns of a cell's estimate, for the traces' tables."""


@dataclass
class CellEntropy:
    """A cell's entropy estimate with the reconstruction quality that makes it trustworthy."""

    bits: float
    reconstruction_mse: float
    relative_error: float | None  # SSE / total variance; None when the set has no variance
    n_samples: int
    scale: float  # the factor the cell's states were multiplied by before training
    bae: BAETrainingSAE = field(repr=False)
    history: dict[str, list[float]] = field(repr=False)

    def summary(self) -> dict[str, float | int | None]:
        return {
            "bits": self.bits,
            "reconstruction_mse": self.reconstruction_mse,
            "relative_error": self.relative_error,
            "n_samples": self.n_samples,
            "scale": self.scale,
        }


def normalise_scale(states: Float[Tensor, "n d"], target_squared_norm: float = 1.0) -> float:
    """The factor that brings the mean squared norm of ``states`` to ``target_squared_norm``.

    Entropy is unchanged by scaling, but a BAE's training is not: the penalties weigh against a
    reconstruction error that grows with the states' scale, and the surrogate's gradient shrinks
    as pre-activations grow. One target for every cell makes cells of different layers (whose
    norms differ by orders of magnitude) comparable. The states are not centred: the set's
    common component keeps most of it on one side of the encoder's hyperplanes, which is what
    lets channels be constant (0 bits); centred, every channel starts splitting the set in half.
    """
    mean_square = states.float().pow(2).sum(-1).mean().item()
    return (target_squared_norm / mean_square) ** 0.5 if mean_square > 0 else 1.0


def estimate_entropies(
    sets: Sequence[Float[Tensor, "n d"]],
    recipe: EntropyRecipe | None = None,
    *,
    eval_sets: Sequence[Float[Tensor, "m d"]] | None = None,
    seeds: Sequence[int] | None = None,
    normalise: bool = True,
    device: str = "cpu",
    progress: bool = True,
) -> list[CellEntropy]:
    """Train one BAE per set (all stacked, see ``train_stacked_baes``) and estimate each set's
    entropy with its BAE.

    Estimates and reconstruction are measured on ``eval_sets`` when given (held-out samples of the
    same distributions), else on the training sets themselves: the entropy *of that set* is the
    question there. ``normalise`` scales each set to the recipe's ``target_squared_norm`` first
    (see ``normalise_scale``; evaluation sets get their training set's factor).
    """
    recipe = recipe or EntropyRecipe()
    if not sets:
        raise ValueError("estimate_entropies needs at least one set of states")
    d_in = sets[0].shape[-1]
    for index, states in enumerate(sets):
        if states.ndim != 2 or states.shape[-1] != d_in:
            raise ValueError(
                f"Every set must be [n, {d_in}] (the first set's width); set {index} is "
                f"{tuple(states.shape)}"
            )
        if not torch.isfinite(states).all():
            raise ValueError(f"Set {index} holds NaN/Inf states; drop or fix them first")
    eval_sets = list(sets) if eval_sets is None else list(eval_sets)
    if len(eval_sets) != len(sets):
        raise ValueError(f"{len(sets)} training sets but {len(eval_sets)} evaluation sets")
    scales = [normalise_scale(s, recipe.target_squared_norm) if normalise else 1.0 for s in sets]
    baes, histories = train_stacked_baes(
        [s.float() * k for s, k in zip(sets, scales, strict=True)],
        recipe.config(d_in),
        training_samples=recipe.steps * recipe.batch_size,
        seeds=seeds,
        batch_size=recipe.batch_size,
        lr=recipe.lr,
        device=device,
        progress=progress,
    )
    cells = []
    for bae, history, states, k in zip(baes, histories, eval_sets, scales, strict=True):
        states = (states.float() * k).to(device)
        evaluation = evaluate_sae(bae, states)
        explained = evaluation["explained_variance"]
        cells.append(
            CellEntropy(
                bits=estimate_entropy(bae, states).bits,
                reconstruction_mse=evaluation["reconstruction_loss"],
                relative_error=None if explained is None else 1.0 - explained,
                n_samples=states.shape[0],
                scale=k,
                bae=bae,
                history=history,
            )
        )
    return cells
