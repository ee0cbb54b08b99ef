"""One BAE per set of hidden states, trained together, each set's entropy estimated.

Every entropy experiment (the synthetic benchmark, tracing by position, by number of ICL
demonstrations, the two-token benchmark) is the same step repeated over a grid of *cells*: train
a BAE on the cell's hidden states, then estimate their entropy with it. ``estimate_entropies``
does it for a whole grid at once with ``train_stacked_baes``; ``EntropyRecipe`` is how each BAE
is trained: to convergence (``training.convergence``) within a step budget, with several seeds per
cell for error bars. Each cell reports what makes it trustworthy (``entropy.estimate``): its
reconstruction error, number of distinct states and the ceiling log2 of it, and ``reliable``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.entropy.estimate import (
    DEFAULT_MAX_RELATIVE_ERROR,
    EntropyEstimate,
    estimate_entropy,
    is_reliable,
)
from sae_lens_bae.entropy.frame import normalise_scale, placement_shift
from sae_lens_bae.evaluation import evaluate_sae, held_out_objective
from sae_lens_bae.reports import cell
from sae_lens_bae.saes.bae import BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.saes.bae_presets import BAE_PRESETS
from sae_lens_bae.training.convergence import Convergence
from sae_lens_bae.training.stacked import train_stacked_baes

__all__ = [
    "CELL_COLUMNS",
    "reliability_note",
    "TRACING_RECIPE",
    "CellEntropy",
    "EntropyRecipe",
    "estimate_entropies",
    "normalise_scale",
    "placement_shift",
]


_PRESET = BAE_PRESETS["entropy"]
"""The registry recipe that ``EntropyRecipe`` trains with (one rule for both paths)."""


@dataclass(frozen=True)
class EntropyRecipe:
    """How a BAE is trained for entropy estimation: the registry's ``entropy`` preset (sigmoid
    surrogate at T = 0.3, Adam lr 4e-3, entropy off for the first 25% of steps, the paper's
    d = 2048 coefficients a_e = 5e-7, a_c = 1e-6 rescaled by 2048 / d, since the reconstruction
    loss is a mean over d dimensions while the penalties are sums over channels), trained until
    the held-out reconstruction and entropy stop moving (``converge``), within ``steps``.

    The budget is 16000 steps: with 4000 (and lr 2e-3) Gaussian fair-bit sets of 12 bits and more
    ran out of steps before converging, over-counting by up to 10 bits; with 16000 at lr 4e-3
    every set up to r = 16 was exact on three seeds, in 5000-11600 steps but for one r = 16 set
    that used the whole budget (tables in docs/entropy.md). Easy sets stop long before.
    ``objective=False`` is the ablation a_e = a_c = 0.
    """

    expansion: int = 4
    """d_sae / d_in of each BAE (raise it if a cell's reconstruction error is too high)."""
    bits: int = 1
    """Code bits per feature (more-bit decoding: more reconstruction for the same d_sae)."""
    steps: int = 16000
    """Training steps of each BAE at most (its budget when converging)."""
    batch_size: int = 512
    """BAE minibatch (the entropy term is measured on it)."""
    lr: float = _PRESET.lr
    """Adam learning rate of the BAEs."""
    lr_warm_up_steps: int = 0
    """Steps over which the learning rate rises linearly to ``lr`` (SAELens' scheduler): at
    lr 4e-3 a code of 1024 channels on 512-dimensional states fell to a constant in its first
    100 steps without one, and recovered too slowly to read r = 256 (docs/entropy.md)."""
    lr_scheduler_name: Literal["constant", "cosineannealing"] = "constant"
    """After the warm-up: a constant lr, or a cosine down to ``lr_end`` at the end of ``steps``."""
    lr_end: float | None = None
    """The cosine's final learning rate (None: ``lr``, no decay)."""
    surrogate_temperature: float = _PRESET.surrogate_temperature
    """Temperature of the sigmoid surrogate gradient."""
    entropy_coefficient_2048: float = _PRESET.entropy_coefficient
    """a_e at d = 2048; each BAE uses a_e * 2048 / d."""
    covariance_coefficient_2048: float = _PRESET.covariance_coefficient
    """a_c at d = 2048; each BAE uses a_c * 2048 / d."""
    entropy_off_fraction: float = _PRESET.entropy_off_fraction
    """Fraction of the step budget trained without the entropy term."""
    objective: bool = True
    """Train with the entropy and covariance terms (False: the ablation a_e = a_c = 0)."""
    target_variance: float = 0.5
    """Each set is scaled to this total variance (mean squared distance from its mean) before
    training (``normalise_scale``): 0.5 is what a set of fair bits along orthonormal directions
    has at unit mean squared norm, the scale the recipe was calibrated at."""
    seeds: int = 1
    """BAEs per cell, each with its own seed: the estimate is their mean, bits_std their spread."""
    restarts: int = 1
    """BAEs trained per seed from different initialisations, of which the one with the lowest
    held-out objective (``evaluation.held_out_objective``) is kept: the objective is non-convex,
    and on a d = 512 set of 256 fair bits two runs of four read 256 bits and two stayed near 600
    at a higher objective (docs/entropy.md). Costs ``restarts`` times the training."""
    converge: bool = True
    """Stop each BAE once its held-out reconstruction and entropy are flat (else: all steps)."""
    check_every: int = 100
    """Steps between two convergence checks."""
    patience: int = 5
    """Checks per window: the mean of the last window must match the one before it (a plateau
    of a few hundred steps before the code drops a bit is common, so not too few)."""
    convergence_horizon: float = 1.0
    """The two windows' difference is extrapolated over this many times the steps trained so
    far before it is compared with the tolerance: a slow drift is not a plateau (0: compare the
    windows as they are)."""

    def __post_init__(self) -> None:
        if not 0 <= self.lr_warm_up_steps < self.steps:
            raise ValueError(
                f"lr_warm_up_steps must be in [0, steps={self.steps}), got {self.lr_warm_up_steps}"
            )
        if self.lr_end is not None and not 0 < self.lr_end <= self.lr:
            raise ValueError(f"lr_end must be in (0, lr={self.lr}], got {self.lr_end}")
        if self.seeds < 1 or self.restarts < 1:
            raise ValueError(
                f"seeds and restarts must be at least 1, got {self.seeds} and {self.restarts}"
            )

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
            bits=self.bits,
            surrogate_temperature=self.surrogate_temperature,
            entropy_coefficient=self.entropy_coefficient_2048 * scale,
            covariance_coefficient=self.covariance_coefficient_2048 * scale,
            entropy_off_fraction=self.entropy_off_fraction,
            firing_coefficient=0.0,
            resample_every=0,
            total_training_steps=self.steps,
        )

    def convergence(self) -> Convergence | None:
        """The convergence rule of this recipe, or None (train every step)."""
        if not self.converge:
            return None
        return Convergence(check_every=self.check_every, window=self.patience,
                           horizon=self.convergence_horizon)  # fmt: skip


TRACING_RECIPE = EntropyRecipe(expansion=1, steps=1500, batch_size=256, lr=4e-3, seeds=3)
"""The LLM-tracing default, sized for a 2-core CPU: d_sae = d_in is room enough for the few
dozen bits a set of a few thousand states can show, a batch of 256 halves the step cost, lr 4e-3
(as in the synthetic ``cpu`` preset), at most 1500 steps, and 3 seeds per cell for error bars.
With 1000 steps and one seed, on SmolLM2-135M's layer 15 the two-token benchmark gave 1.00 /
2.42 / 3.83 / 4.93 bits for r = 1 / 2 / 4 / 8 (ceilings 1 / 2 / 4 / 7.8), with relative
reconstruction error 0 / 0.1% / 17% / 27%."""


CELL_COLUMNS = [
    ("bits", lambda row: cell(row["bits"], ".2f")),
    ("± seeds", lambda row: cell(row.get("bits_std"), ".2f")),
    ("ceiling", lambda row: cell(row.get("ceiling_bits"), ".2f")),
    ("excess", lambda row: cell(row.get("excess_bits"), ".2f")),
    ("relative error", lambda row: cell(row["relative_error"], ".4f")),
    ("typical error", lambda row: cell(row.get("typical_relative_error"), ".4f")),
    ("reliable", lambda row: "yes" if row.get("reliable") else "NO"),
    ("steps", lambda row: cell(row.get("steps"))),
]
"""The markdown columns of a cell's estimate, for the traces' tables."""


def reliability_note(rows: Sequence[dict], name: Callable[[dict], str]) -> str:
    """A trace's verdict in words: how many cells are reliable, which are not and why, and a
    warning when most are not. ``name`` says which cell a row is (e.g. "layer 15, position 4")."""
    bad = [row for row in rows if not row.get("reliable", True)]
    lines = [f"{len(rows) - len(bad)} of {len(rows)} cells are reliable (relative "
             f"reconstruction error <= {DEFAULT_MAX_RELATIVE_ERROR:.0%} in total and for the "
             "typical state, estimate within "
             "log2 of the number of distinct states and, where the sample resolves the codes, "
             "within 5% of their joint entropy)."]  # fmt: skip
    for row in bad:
        reasons = []
        if row["relative_error"] is not None and row["relative_error"] > DEFAULT_MAX_RELATIVE_ERROR:
            reasons.append(f"relative error {row['relative_error']:.2f}")
        typical = row.get("typical_relative_error")
        if typical is not None and typical > DEFAULT_MAX_RELATIVE_ERROR:
            reasons.append(f"typical state's error {typical:.2f}")
        if row["bits"] > row.get("ceiling_bits", float("inf")) + 1e-6:
            reasons.append(
                f"estimate {row['bits']:.1f} bits, over its ceiling {row['ceiling_bits']:.1f}"
            )
        if row.get("excess_bits") is not None and not is_reliable(
            row["bits"], float("inf"), None, row["excess_bits"]
        ):
            reasons.append(f"dependent channels: {row['excess_bits']:.1f} bits over the "
                           "code's joint entropy")  # fmt: skip
        lines.append(f"- unreliable: {name(row)}: {', '.join(reasons) or 'see the table'}")
    if len(bad) * 2 > len(rows):
        lines.append("\nMost cells are unreliable: their BAEs do not reconstruct the states (or "
                     "code them with dependent bits), so these curves are not the states' "
                     "entropy. Widen the BAEs (--expansion), add bits (--bits) or train longer "
                     "(--steps) until the cells are reliable.")  # fmt: skip
    return "\n".join(lines) + "\n"


@dataclass
class CellEntropy:
    """A cell's entropy estimate with what makes it trustworthy: the mean over its seeds' BAEs,
    their spread, the bootstrap spread over states, reconstruction, ceiling, reliability."""

    bits: float
    bits_std: float | None  # over seeds; None with one seed
    bits_per_seed: list[float]
    reconstruction_mse: float
    relative_error: float | None  # SSE / total variance, mean over seeds; None without variance
    typical_relative_error: float | None  # the median state's, mean over seeds (see estimate)
    n_samples: int
    n_distinct: int
    ceiling_bits: float
    code_bits: float
    bootstrap_std: float | None
    reliable: bool
    excess_bits: float | None  # over the codes' joint entropy, mean over seeds (see estimate)
    steps: int  # the most steps any of its BAEs trained
    scale: float  # the factor the cell's states were multiplied by before training ...
    shift: Tensor = field(repr=False)  # ... after this vector was added: (x + shift) * scale
    bae: BAETrainingSAE = field(repr=False)
    history: dict[str, list[float]] = field(repr=False)
    restart_objectives: list[list[float]] | None = None  # per seed, each restart's held-out
    # objective (the lowest was kept); None without restarts
    restart_bits: list[list[float]] | None = None  # per seed, each restart's estimate

    def summary(self) -> dict[str, float | int | bool | list[float] | None]:
        return {
            "bits": self.bits,
            "bits_std": self.bits_std,
            "bits_per_seed": self.bits_per_seed,
            "reconstruction_mse": self.reconstruction_mse,
            "relative_error": self.relative_error,
            "typical_relative_error": self.typical_relative_error,
            "n_samples": self.n_samples,
            "n_distinct": self.n_distinct,
            "ceiling_bits": self.ceiling_bits,
            "code_bits": self.code_bits,
            "bootstrap_std": self.bootstrap_std,
            "reliable": self.reliable,
            "excess_bits": self.excess_bits,
            "steps": self.steps,
            "scale": self.scale,
            "restart_objectives": self.restart_objectives,
            "restart_bits": self.restart_bits,
        }


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _cell(
    estimates: list[EntropyEstimate],
    evaluations: list[dict],
    steps: list[int],
    bae: BAETrainingSAE,
    history: dict[str, list[float]],
    frame: tuple[float, Tensor],
    max_relative_error: float,
    restart_objectives: list[list[float]] | None = None,
    restart_bits: list[list[float]] | None = None,
) -> CellEntropy:
    """One cell from its seeds' estimates (the first seed's BAE and bootstrap are kept)."""
    bits = [e.bits for e in estimates]
    first = estimates[0]
    relative_error = _mean([e.relative_error for e in estimates])
    typical_error = _mean([e.typical_relative_error for e in estimates])
    mean_bits = sum(bits) / len(bits)
    excess = _mean([e.excess_bits for e in estimates])
    reliable = is_reliable(mean_bits, first.ceiling_bits, relative_error, excess,
                           max_relative_error, typical_error)  # fmt: skip
    return CellEntropy(
        bits=mean_bits,
        bits_std=float(torch.tensor(bits).std()) if len(bits) > 1 else None,
        bits_per_seed=bits,
        reconstruction_mse=sum(e["reconstruction_loss"] for e in evaluations) / len(evaluations),
        relative_error=relative_error,
        typical_relative_error=typical_error,
        n_samples=first.n_samples,
        n_distinct=first.n_distinct,
        ceiling_bits=first.ceiling_bits,
        code_bits=first.code_bits,
        bootstrap_std=first.bootstrap_std,
        reliable=reliable,
        excess_bits=excess,
        steps=max(steps),
        scale=frame[0],
        shift=frame[1],
        bae=bae,
        history=history,
        restart_objectives=restart_objectives,
        restart_bits=restart_bits,
    )


RESTART_SEED_STRIDE = 100_000
"""Restart q of seed s of a set with base seed b trains with seed b + 1000 s + 100000 q (restart
0 is the seed a recipe without restarts uses)."""


def _best_restart(
    baes: Sequence[BAETrainingSAE], states: Tensor, batch_size: int, first: int, restarts: int
) -> tuple[int, list[float] | None, list[float] | None]:
    """The index, among ``baes[first : first + restarts]``, of the lowest held-out objective,
    their objectives and their estimates in bits (None without restarts: nothing to choose)."""
    if restarts == 1:
        return first, None, None
    candidates = range(first, first + restarts)
    costs = [held_out_objective(baes[g], states, batch_size) for g in candidates]
    bits = [estimate_entropy(baes[g], states).bits for g in candidates]
    return first + min(range(restarts), key=costs.__getitem__), costs, bits


def estimate_entropies(
    sets: Sequence[Float[Tensor, "n d"]],
    recipe: EntropyRecipe | None = None,
    *,
    eval_sets: Sequence[Float[Tensor, "m d"]] | None = None,
    seeds: Sequence[int] | None = None,
    normalise: bool = True,
    bootstrap: int = 20,
    max_relative_error: float = DEFAULT_MAX_RELATIVE_ERROR,
    device: str = "cpu",
    progress: bool = True,
) -> list[CellEntropy]:
    """Train ``recipe.seeds`` BAEs per set (all stacked, see ``train_stacked_baes``; with
    ``recipe.restarts`` > 1, that many per seed, keeping the one of lowest held-out objective)
    and estimate each set's entropy with them: the mean over seeds, with their spread, a
    bootstrap spread over states (``bootstrap`` replicates, first seed), the reconstruction
    error, the ceiling and ``reliable`` (``entropy.estimate.is_reliable`` on the seeds' means:
    relative error, in total and for the typical state, at most ``max_relative_error``, within
    the ceiling, no excess over the codes' joint entropy).

    Estimates and reconstruction are measured on ``eval_sets`` when given (held-out samples of the
    same distributions), else on the training sets themselves: the entropy *of that set* is the
    question there; convergence is checked on the same states. ``normalise`` moves each set to
    where the recipe was calibrated (``entropy.frame``: mean ``sqrt(variance)`` along the
    diagonal, ``placement_shift``) and scales it to the recipe's ``target_variance``
    (``normalise_scale``); a cell reads ``(states + shift) * scale`` (evaluation sets get their
    training set's shift and factor), so a translated set gives the same estimate. ``seeds``: a
    base seed per set (default its index); seed s of a set is
    its base + 1000 s.
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
    base = list(range(len(sets))) if seeds is None else list(seeds)
    if len(base) != len(sets):
        raise ValueError(f"{len(sets)} sets but {len(base)} seeds")
    scales = [normalise_scale(s, recipe.target_variance) if normalise else 1.0 for s in sets]
    shifts = [placement_shift(s) if normalise else torch.zeros(d_in) for s in sets]
    scaled = [(s.float() + t) * k for s, t, k in zip(sets, shifts, scales, strict=True)]
    held_out = [(s.float() + t) * k for s, t, k in zip(eval_sets, shifts, scales, strict=True)]
    replicas = [(r, q) for r in range(recipe.seeds) for q in range(recipe.restarts)]
    training = train_stacked_baes(
        [x for x in scaled for _ in replicas],
        recipe.config(d_in),
        training_samples=recipe.steps * recipe.batch_size,
        seeds=[b + 1000 * r + RESTART_SEED_STRIDE * q for b in base for r, q in replicas],
        batch_size=recipe.batch_size,
        lr=recipe.lr,
        device=device,
        progress=progress,
        convergence=recipe.convergence(),
        check_sets=[x for x in held_out for _ in replicas],
        lr_warm_up_steps=recipe.lr_warm_up_steps,
        lr_scheduler_name=recipe.lr_scheduler_name,
        lr_end=recipe.lr_end,
    )
    cells = []
    for index, (states, k, t) in enumerate(zip(held_out, scales, shifts, strict=True)):
        states = states.to(device)
        chosen = [
            _best_restart(training.baes, states, recipe.batch_size,
                          (index * recipe.seeds + r) * recipe.restarts, recipe.restarts)
            for r in range(recipe.seeds)
        ]  # fmt: skip
        members = [g for g, _, _ in chosen]
        objectives = [costs for _, costs, _ in chosen if costs is not None] or None
        restart_bits = [bits for _, _, bits in chosen if bits is not None] or None
        estimates = [
            estimate_entropy(
                training.baes[g],
                states,
                bootstrap=bootstrap if g == members[0] else 0,
                seed=base[index],
                max_relative_error=max_relative_error,
            )
            for g in members
        ]
        evaluations = [evaluate_sae(training.baes[g], states) for g in members]
        first = members[0]
        cells.append(_cell(estimates, evaluations, [training.steps[g] for g in members],
                           training.baes[first], training.histories[first], (k, t),
                           max_relative_error, objectives, restart_bits))  # fmt: skip
    return cells
