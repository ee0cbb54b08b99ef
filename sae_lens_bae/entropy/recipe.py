"""How each cell's BAE is trained for entropy estimation: ``EntropyRecipe`` (the registry's
``entropy`` recipe, to convergence within a step budget, seeds and restarts) and
``TRACING_RECIPE``, the LLM traces' CPU-sized default. ``entropy.cells`` trains by it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from sae_lens_bae.checks import check_ranges, ranged
from sae_lens_bae.saes.bae import BAETrainingSAEConfig
from sae_lens_bae.saes.bae_recipes import BAE_RECIPES, phase_steps
from sae_lens_bae.training.convergence import Convergence, DrainHold

__all__ = [
    "TRACING_RECIPE",
    "EntropyRecipe",
    "Loss",
    "Optimiser",
    "Phases",
    "Selection",
    "flat_fields",
    "lr_scheduler_name_for",
]


CONVERGENCE_WINDOW = 5
"""Checks in each of the two windows the convergence rule compares: a plateau of a few hundred
steps before the code drops a bit is common, so not too few."""


def lr_scheduler_name_for(lr_end: float | None) -> str:
    """SAELens' name of the learning-rate schedule after the warm-up: a cosine to ``lr_end``,
    or a constant lr without one."""
    return "constant" if lr_end is None else "cosineannealing"


_PRESET = {
    **{f.name: f.default for f in fields(BAETrainingSAEConfig)},
    **BAE_RECIPES["entropy"].fields,
}
"""The registry's ``entropy`` recipe, whose objective ``EntropyRecipe`` trains with (one rule for
both paths), at the width its coefficients are given at."""
_FRAME_TOTAL = BAE_RECIPES["entropy"].input_total_variance
"""The total variance the registry's ``entropy`` recipe frames states of any width at."""


@dataclass(frozen=True)
class Loss:
    """The objective each BAE trains with: the registry's ``entropy`` recipe (sigmoid surrogate,
    its coefficients given at d = 2048 and weighed by 2048 / d as every BAE config weighs them)."""

    objective: bool = True
    """Train with the entropy and covariance terms (False: the ablation a_e = a_c = 0)."""
    surrogate_temperature: float = ranged(_PRESET["surrogate_temperature"], above=0.0)
    """Temperature of the sigmoid surrogate gradient."""
    entropy_coefficient_2048: float = ranged(_PRESET["entropy_coefficient"], low=0.0)
    """a_e at d = 2048 (the config's ``coefficient_width``)."""
    covariance_coefficient_2048: float = ranged(_PRESET["covariance_coefficient"], low=0.0)
    """a_c at d = 2048 (the config's ``coefficient_width``)."""

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class Optimiser:
    """Adam and its learning-rate schedule (SAELens' names and scheduler)."""

    lr: float = ranged(BAE_RECIPES["entropy"].lr, above=0.0)
    """Adam learning rate of the BAEs."""
    lr_warm_up_steps: int = ranged(0, low=0)
    """Steps over which the learning rate rises linearly to ``lr`` (0: none)."""
    lr_end: float | None = None
    """After the warm-up, a cosine from ``lr`` down to this at the end of the steps (None: the
    lr stays constant)."""
    adam_beta2: float = ranged(0.999, low=0.0, below=1.0)
    """Adam's second-moment decay (SAELens' ``adam_beta2``)."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.lr_end is not None and not 0 < self.lr_end <= self.lr:
            raise ValueError(f"lr_end must be in (0, lr={self.lr}], got {self.lr_end}")

    @property
    def lr_scheduler_name(self) -> str:
        """SAELens' name of the learning-rate schedule after the warm-up."""
        return lr_scheduler_name_for(self.lr_end)


@dataclass(frozen=True)
class Phases:
    """When each term of the objective is on, and when the schedule stands still."""

    entropy_off_fraction: float = ranged(
        BAE_RECIPES["entropy"].entropy_off_fraction, low=0.0, high=1.0
    )
    """Fraction of the step budget trained without the entropy term (the config's
    ``entropy_off_steps``: this of ``steps``)."""
    covariance_off_final_fraction: float = ranged(0.0, low=0.0, below=1.0)
    """The last fraction of each BAE's training without the covariance term (the config's
    ``covariance_off_from_step``: after 1 - f of ``steps``; with a stop rule, a BAE that
    converges at step s with the term on trains f / (1 - f) s more steps without it)."""
    drain_hold: float = ranged(0.0, low=0.0)
    """While the code's entropy on the check states still falls, hold the learning rate and the
    phases where they stand, for at most this fraction of the steps more (0: never;
    ``training.DrainHold``)."""

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class Selection:
    """Which BAE a cell keeps: candidates judged by one held-out objective
    (``evaluation.held_out_objective``)."""

    restarts: int = ranged(1, low=1)
    """BAEs trained per seed, the one of lowest held-out objective kept (at ``restarts`` times
    the cost)."""
    refit_decoder: bool = True
    """Replace each BAE's decoder by its code's least-squares decoder where that is better on
    held-back states."""
    repair_rounds: int = ranged(2, low=0)
    """Rounds of repair (``entropy.repair``; 0: none): bits the rest of the code determines
    are knocked out, the BAE trains on, and the copy is kept if its held-out objective is
    lower."""

    def __post_init__(self) -> None:
        check_ranges(self)


_GROUPS = {"loss": Loss, "optimiser": Optimiser, "phases": Phases, "selection": Selection}
"""The recipe's parts; their field names are unique, so a flat name says which part it is in."""


@dataclass(frozen=True)
class EntropyRecipe:
    """How a BAE is trained for entropy estimation: its width and budget, the objective
    (``Loss``), Adam and its schedule (``Optimiser``, ``Phases``), the stop rule
    (``training.Convergence``) and which candidate a cell keeps (``Selection``). :meth:`of`
    builds one from flat field names (``EntropyRecipe.of(steps=4000, lr=2e-3)``), as the
    command line and ``--variant`` JSON name them. Why each default:
    docs/research/entropy-recipe.md.
    """

    expansion: int = ranged(4, low=1)
    """d_sae / d_in of each BAE (raise it if a cell's reconstruction error is too high)."""
    bits_per_feature: int = ranged(1, low=1)
    """Code bits per feature (more-bit decoding: more reconstruction for the same d_sae)."""
    steps: int = ranged(16000, low=1)
    """Training steps of each BAE at most (its budget when converging)."""
    batch_size: int = ranged(512, low=1)
    """BAE minibatch (the entropy term is measured on it)."""
    seeds: int = ranged(1, low=1)
    """BAEs per cell, each with its own seed: the estimate is their mean, bits_std their spread."""
    converge: bool = True
    """Stop each BAE once its held-out reconstruction and entropy are flat (else: all steps)."""
    loss: Loss = Loss()
    """The objective."""
    optimiser: Optimiser = Optimiser()
    """Adam and its learning-rate schedule."""
    phases: Phases = Phases()
    """When each term is on; the drain hold."""
    selection: Selection = Selection()
    """Restarts, decoder refit and repair."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if not 0 <= self.optimiser.lr_warm_up_steps < self.steps:
            raise ValueError(
                f"lr_warm_up_steps must be in [0, steps={self.steps}), got "
                f"{self.optimiser.lr_warm_up_steps}"
            )

    @classmethod
    def of(cls, **flat: Any) -> EntropyRecipe:
        """The default recipe with fields changed by their flat names (``lr=2e-3``)."""
        return cls().changed(**flat)

    def changed(self, **flat: Any) -> EntropyRecipe:
        """This recipe with fields changed by their flat names; raises ValueError on a name no
        part of the recipe has."""
        unknown = sorted(set(flat) - set(flat_fields()))
        if unknown:
            raise ValueError(f"not EntropyRecipe fields: {unknown}")
        top = {k: v for k, v in flat.items() if flat_fields()[k] is None}
        for group in _GROUPS:
            mine = {k: v for k, v in flat.items() if flat_fields()[k] == group}
            if mine:
                top[group] = replace(getattr(self, group), **mine)
        return replace(self, **top)

    def record(self) -> dict[str, Any]:
        """The recipe as one flat dict of JSON values (what run folders record)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _GROUPS}
        for group in _GROUPS:
            out.update(asdict(getattr(self, group)))
        return out

    @classmethod
    def long_run(cls, d_in: int, **changes: Any) -> EntropyRecipe:
        """The synthetic ``gpu`` grid's recipe for states of dimension ``d_in``: 45000 steps
        (no convergence stop), a 1000-step warm-up, a cosine from lr 4e-3 sqrt(512 / d_in) to a
        tenth of it, Adam's beta2 at 0.99, T = 0.15, entropy off for the first 5% and the
        covariance term off for the last 10%, 2x, and the schedule held while the code still
        drains (``drain_hold`` 1: at most 45000 held steps more); ``changes`` replace fields by
        their flat names (e.g. ``restarts``). An ``lr`` given without ``lr_end`` keeps the
        cosine's ratio: it ends at a tenth of it.

        For codes the default's shorter constant-lr run leaves redundant, at a higher cost
        (docs/research/entropy-recipe.md measures both)."""
        lr_scale = (512 / d_in) ** 0.5  # Adam's step against a bit's margin grows as sqrt(d)
        recipe = cls(
            expansion=2,
            steps=45000,
            loss=Loss(surrogate_temperature=0.15),
            optimiser=Optimiser(4e-3 * lr_scale, 1000, 4e-4 * lr_scale, adam_beta2=0.99),
            phases=Phases(0.05, covariance_off_final_fraction=0.1, drain_hold=1.0),
            converge=False,
        )
        if "lr" in changes and "lr_end" not in changes:  # else a lower lr would end above lr_end
            changes = {**changes, "lr_end": changes["lr"] / 10}
        return recipe.changed(**changes)

    @classmethod
    def based_on(cls, base: str, d_in: int, **changes: Any) -> EntropyRecipe:
        """The recipe a command line's ``--recipe-base`` names, with ``changes`` (flat names):
        ``"default"`` is ``EntropyRecipe.of(**changes)``, ``"long_run"`` is ``long_run(d_in,
        **changes)`` (an lr alone moves the cosine's end with it). Raises ValueError on another
        base or a bad change."""
        if base == "long_run":
            return cls.long_run(d_in, **changes)
        if base == "default":
            return cls.of(**changes)
        raise ValueError(f"the recipe base is 'default' or 'long_run', got {base!r}")

    @staticmethod
    def changes_from_json(text: str) -> dict[str, Any]:
        """``'{"lr": 2e-3}'`` -> the flat field changes it names, for :meth:`changed`: what a
        command line takes to try a variant of a recipe. Raises ValueError on bad JSON or
        unknown fields."""
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"bad JSON ({error})") from None
        if not isinstance(values, dict) or set(values) - set(flat_fields()):
            unknown = (
                sorted(set(values) - set(flat_fields())) if isinstance(values, dict) else values
            )
            raise ValueError(f"not EntropyRecipe fields: {unknown}")
        return values

    def check_samples(self, n: int, what: str) -> None:
        """Fail before any model runs if a cell would hold fewer samples than one minibatch."""
        if n < self.batch_size:
            raise ValueError(
                f"{what} gives {n} hidden states per cell, fewer than one minibatch "
                f"(batch_size={self.batch_size}); use more or a smaller recipe batch_size"
            )

    def config(self, d_in: int, framed: bool = True) -> BAETrainingSAEConfig:
        """The training config of each BAE of this recipe on states of dimension ``d_in``;
        ``framed``: each BAE brings its states to where the recipe was calibrated (the registry
        ``entropy`` recipe's input frame, ``saes.input_frame``), else reads them as given. Its
        ``Phases`` are resolved into steps of a run of ``steps``."""
        scale = 1.0 if self.loss.objective else 0.0
        return BAETrainingSAEConfig(
            d_in=d_in,
            input_variance=_FRAME_TOTAL / d_in if framed else None,
            d_sae=self.expansion * d_in,
            bits_per_feature=self.bits_per_feature,
            surrogate_temperature=self.loss.surrogate_temperature,
            entropy_coefficient=self.loss.entropy_coefficient_2048 * scale,
            covariance_coefficient=self.loss.covariance_coefficient_2048 * scale,
            coefficient_width=2048,
            **phase_steps(
                self.steps,
                self.phases.entropy_off_fraction,
                self.phases.covariance_off_final_fraction,
            ),
        )

    def convergence(self) -> Convergence | None:
        """The stop rule, checked every ``CHECK_EVERY`` steps, or None (train every step)."""
        return Convergence(window=CONVERGENCE_WINDOW) if self.converge else None

    @property
    def repairs(self) -> bool:
        """Whether BAEs trained by this recipe are repaired: the ablation without the objective
        never is (no entropy term to judge a repair by)."""
        return self.selection.repair_rounds > 0 and self.loss.objective

    def drain_rule(self) -> DrainHold | None:
        """The drain hold of this recipe, or None (the schedule never stands still)."""
        if self.phases.drain_hold == 0:
            return None
        return DrainHold(extra=self.phases.drain_hold)


def flat_fields() -> dict[str, str | None]:
    """Every flat field name of a recipe -> the part that holds it (None: the recipe itself)."""
    out: dict[str, str | None] = {
        f.name: None for f in fields(EntropyRecipe) if f.name not in _GROUPS
    }
    for group, kind in _GROUPS.items():
        out.update({f.name: group for f in fields(kind)})
    return out


TRACING_RECIPE = EntropyRecipe.of(expansion=1, steps=1500, batch_size=256, lr=4e-3, seeds=3)
"""The LLM-tracing default, sized for a 2-core CPU: d_sae = d_in is room enough for the few
dozen bits a set of a few thousand states can show, a batch of 256 halves the step cost, lr 4e-3
(as in the synthetic ``cpu`` grid), at most 1500 steps, and 3 seeds per cell for error bars."""
