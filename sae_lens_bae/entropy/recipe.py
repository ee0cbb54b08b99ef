"""How each cell's BAE is trained for entropy estimation: ``EntropyRecipe`` (the registry's
``entropy`` preset, to convergence within a step budget, seeds and restarts) and
``TRACING_RECIPE``, the LLM traces' CPU-sized default. ``entropy.cells`` trains by it."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from typing import Any

from sae_lens_bae.saes.bae import BAETrainingSAEConfig
from sae_lens_bae.saes.bae_presets import BAE_PRESETS
from sae_lens_bae.training.convergence import Convergence, DrainHold

__all__ = ["FIXED_FIELDS", "TRACING_RECIPE", "EntropyRecipe", "lr_scheduler_name_for"]


CONVERGENCE_WINDOW = 5
"""Checks in each of the two windows the convergence rule compares: a plateau of a few hundred
steps before the code drops a bit is common, so not too few."""

FIXED_FIELDS = {
    "encoder_bias": True,
    "patience": CONVERGENCE_WINDOW,
    "convergence_horizon": Convergence.horizon,
}
"""Fields a recipe once had, with the values every recipe now trains with (a record written
with them at these values was trained as a recipe trains now)."""


def lr_scheduler_name_for(lr_end: float | None) -> str:
    """SAELens' name of the learning-rate schedule after the warm-up: a cosine to ``lr_end``,
    or a constant lr without one."""
    return "constant" if lr_end is None else "cosineannealing"


_PRESET = BAE_PRESETS["entropy"]
"""The registry recipe that ``EntropyRecipe`` trains with (one rule for both paths)."""


@dataclass(frozen=True)
class EntropyRecipe:
    """How a BAE is trained for entropy estimation: the registry's ``entropy`` preset (sigmoid
    surrogate at T = 0.3, Adam lr 4e-3, entropy off for the first 25% of steps, the paper's
    d = 2048 coefficients a_e = 5e-7, a_c = 1e-6 rescaled by 2048 / d, since the reconstruction
    loss is a mean over d dimensions while the penalties are sums over channels), trained until
    the held-out reconstruction and entropy stop moving (``converge``), within ``steps``.
    ``objective=False`` is the ablation a_e = a_c = 0. Why each default:
    docs/research/entropy-recipe.md.
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
    """Steps over which the learning rate rises linearly to ``lr`` (SAELens' scheduler): a
    large code can fall to a constant in its first steps without one."""
    lr_end: float | None = None
    """After the warm-up, a cosine from ``lr`` down to this at the end of ``steps`` (None: the lr
    stays constant)."""
    adam_beta2: float = 0.999
    """Adam's second-moment decay (SAELens' ``adam_beta2``). Adam divides each step by the root
    of this running mean of squared gradients, so a weight whose gradient was near zero for a
    while (a channel whose states sat far from its threshold) steps further than the lr when a
    steady gradient starts; a shorter memory bounds that jump."""
    surrogate_temperature: float = _PRESET.surrogate_temperature
    """Temperature of the sigmoid surrogate gradient."""
    entropy_coefficient_2048: float = _PRESET.entropy_coefficient
    """a_e at d = 2048; each BAE uses a_e * 2048 / d."""
    covariance_coefficient_2048: float = _PRESET.covariance_coefficient
    """a_c at d = 2048; each BAE uses a_c * 2048 / d."""
    entropy_off_fraction: float = _PRESET.entropy_off_fraction
    """Fraction of the step budget trained without the entropy term."""
    covariance_off_final_fraction: float = 0.0
    """The last fraction of each BAE's training without the covariance term: of the budget with
    ``converge=False``; with the rule, a BAE that converges at step s with the term on trains
    f / (1 - f) s more steps without it (within the budget), then stops. The term, noisy on a
    minibatch, holds each threshold at the edge of its firing states; without it the
    reconstruction moves them back."""
    drain_hold: float = 0.0
    """While the code's entropy on the check states still falls (by more than a bit per 500
    steps), hold the learning-rate schedule and the final phase where they stand and train on,
    for at most this fraction of ``steps`` more (0: never hold; ``training.DrainHold``). A code
    that over-codes drains to r once the learning rate summed over the steps reaches a budget
    that grows with the set: a cosine that decays first leaves it undrained."""
    refit_decoder: bool = True
    """After training, replace each BAE's decoder by the least-squares decoder of its code on
    its training states (a ridge towards the trained decoder, chosen on a fifth of them held
    back), when that is better there (``saes.decoder_refit``): the code and the estimate are
    unchanged, the reconstruction error that judges them is the code's, not that of a decoder
    training left short."""
    repair_rounds: int = 2
    """Rounds of repair after training (``entropy.repair``; 0: none): a BAE whose code has
    channels that the rest of it determines on its training states (bits the sum counts twice,
    which the covariance term cannot see: a 3-in-4 code) loses them, keeps its least-squares
    decoder of the code that is left or else trains on for at most a quarter of ``steps`` at
    the final lr, and is replaced if its held-out objective is lower; never for
    ``objective=False`` (``repairs``)."""
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
    and runs from other starts end in minima of other cost. Costs ``restarts`` times the
    training."""
    converge: bool = True
    """Stop each BAE once its held-out reconstruction and entropy are flat (else: all steps)."""
    check_every: int = 100
    """Steps between two convergence checks."""

    def __post_init__(self) -> None:
        if not 0 <= self.lr_warm_up_steps < self.steps:
            raise ValueError(
                f"lr_warm_up_steps must be in [0, steps={self.steps}), got {self.lr_warm_up_steps}"
            )
        if self.lr_end is not None and not 0 < self.lr_end <= self.lr:
            raise ValueError(f"lr_end must be in (0, lr={self.lr}], got {self.lr_end}")
        if not 0 <= self.adam_beta2 < 1:
            raise ValueError(f"adam_beta2 must be in [0, 1), got {self.adam_beta2}")
        if self.repair_rounds < 0:
            raise ValueError(f"repair_rounds must be at least 0, got {self.repair_rounds}")
        if self.drain_hold < 0:
            raise ValueError(f"drain_hold must be at least 0, got {self.drain_hold}")
        if self.seeds < 1 or self.restarts < 1:
            raise ValueError(
                f"seeds and restarts must be at least 1, got {self.seeds} and {self.restarts}"
            )

    @classmethod
    def paper(cls, d_in: int, **changes: Any) -> EntropyRecipe:
        """The synthetic ``paper`` preset's recipe for states of dimension ``d_in``: 45000 steps
        (no convergence stop), a 1000-step warm-up, a cosine from lr 4e-3 sqrt(512 / d_in) to a
        tenth of it, Adam's beta2 at 0.99, T = 0.15, entropy off for the first 5% and the
        covariance term off for the last 10%, 2x, and the schedule held while the code still
        drains (``drain_hold`` 1: at most 45000 held steps more); ``changes`` replace fields
        (e.g. ``restarts``). An ``lr`` given without ``lr_end`` keeps the cosine's ratio: it ends
        at a tenth of it.

        Where the default's shorter constant-lr run settles in a redundant code, this one finds
        planted bits, at 2-10 times the cost (docs/research/entropy-recipe.md)."""
        lr_scale = (512 / d_in) ** 0.5  # Adam's step against a bit's margin grows as sqrt(d)
        recipe = cls(
            steps=45000,
            lr=4e-3 * lr_scale,
            lr_warm_up_steps=1000,
            entropy_off_fraction=0.05,
            lr_end=4e-4 * lr_scale,
            surrogate_temperature=0.15,
            adam_beta2=0.99,
            converge=False,
            covariance_off_final_fraction=0.1,
            drain_hold=1.0,
            expansion=2,
        )
        if "lr" in changes and "lr_end" not in changes:  # else a lower lr would end above lr_end
            changes = {**changes, "lr_end": changes["lr"] / 10}
        return replace(recipe, **changes)

    @classmethod
    def based_on(cls, base: str, d_in: int, **changes: Any) -> EntropyRecipe:
        """The recipe a command line's ``--recipe-base`` names, with ``changes``: ``"default"``
        is ``EntropyRecipe`` with them, ``"paper"`` is ``paper(d_in, **changes)`` (an lr alone
        moves the cosine's end with it). Raises ValueError on another base or a bad change."""
        if base == "paper":
            return cls.paper(d_in, **changes)
        if base == "default":
            return cls(**changes)
        raise ValueError(f"the recipe base is 'default' or 'paper', got {base!r}")

    @staticmethod
    def changes_from_json(text: str) -> dict[str, Any]:
        """``'{"lr": 2e-3}'`` -> the field changes it names, for ``replace``: what a command line
        takes to try a variant of a recipe. Raises ValueError on bad JSON or unknown fields."""
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"bad JSON ({error})") from None
        known = {field.name for field in fields(EntropyRecipe)}
        if not isinstance(values, dict) or set(values) - known:
            unknown = sorted(set(values) - known) if isinstance(values, dict) else values
            raise ValueError(f"not EntropyRecipe fields: {unknown}")
        return values

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
            covariance_off_final_fraction=self.covariance_off_final_fraction,
            firing_coefficient=0.0,
            resample_every=0,
            total_training_steps=self.steps,
        )

    @property
    def lr_scheduler_name(self) -> str:
        """SAELens' name of the learning-rate schedule after the warm-up."""
        return lr_scheduler_name_for(self.lr_end)

    @property
    def repairs(self) -> bool:
        """Whether BAEs trained by this recipe are repaired: the ablation without the objective
        never is (no entropy term to judge a repair by)."""
        return self.repair_rounds > 0 and self.objective

    def drain_rule(self) -> DrainHold | None:
        """The drain hold of this recipe, or None (the schedule never stands still)."""
        if self.drain_hold == 0:
            return None
        return DrainHold(extra=self.drain_hold, check_every=self.check_every)

    def convergence(self) -> Convergence | None:
        """The convergence rule of this recipe, or None (train every step)."""
        if not self.converge:
            return None
        return Convergence(check_every=self.check_every, window=CONVERGENCE_WINDOW)


TRACING_RECIPE = EntropyRecipe(expansion=1, steps=1500, batch_size=256, lr=4e-3, seeds=3)
"""The LLM-tracing default, sized for a 2-core CPU: d_sae = d_in is room enough for the few
dozen bits a set of a few thousand states can show, a batch of 256 halves the step cost, lr 4e-3
(as in the synthetic ``cpu`` preset), at most 1500 steps, and 3 seeds per cell for error bars."""
