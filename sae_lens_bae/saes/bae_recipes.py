"""Named BAE training recipes, as data: the config fields each sets beyond
:class:`BAETrainingSAEConfig`'s defaults (which are the ``default`` recipe's objective), its
phases as fractions of training and the Adam learning rate it trains with. ``bae_config(d_in,
recipe=name, training_steps=N)`` builds a config from one, its phases resolved into steps of a
run of N. How ``default`` was chosen, every piece against the paper's bare equations, is in
``docs/research/ablation.md``; the ``entropy`` recipe's evidence in
``docs/research/entropy-recipe.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sae_lens_bae.checks import is_count
from sae_lens_bae.saes.bae import BAETrainingSAEConfig

__all__ = [
    "BAE_RECIPES",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_LR",
    "BAERecipe",
    "RecipeName",
    "bae_config",
    "phase_steps",
]

RecipeName = Literal["default", "short_run", "entropy", "paper"]
"""The names of ``BAE_RECIPES`` (for configs and CLIs that pick one)."""

DEFAULT_BATCH_SIZE = 512
"""Minibatch size of the paper: the entropy objective is measured on minibatches of this size."""


@dataclass(frozen=True)
class BAERecipe:
    """One recipe: the trainer's Adam learning rate, the config fields it sets and its phases as
    fractions of training (``bae_config`` resolves them into steps)."""

    lr: float
    """Adam learning rate it trains with."""
    fields: dict[str, Any] = field(default_factory=dict)
    """Config fields it sets beyond :class:`BAETrainingSAEConfig`'s defaults."""
    input_total_variance: float | None = None
    """Total variance its input frame brings states of any width to (``input_variance`` is
    this / d_in); None: ``fields``' or the default's variance per dimension."""
    entropy_off_fraction: float = 0.25
    """First fraction of training with the entropy term off (``entropy_off_steps`` of a run)."""
    covariance_off_final_fraction: float = 0.0
    """Last fraction of training with the covariance term off (``covariance_off_from_step``)."""

    def __post_init__(self) -> None:
        for name in ("entropy_off_fraction", "covariance_off_final_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"BAERecipe {name} must be in [0, 1], got {getattr(self, name)}")


BAE_RECIPES: dict[RecipeName, BAERecipe] = {
    # the config's defaults with the entropy term off for the first quarter of training (every
    # recipe's phase unless it says otherwise): the paper's equations, the short-run entropy
    # coefficient and a covariance coefficient 16x it, the paper's surrogate temperature, inputs
    # as given (at mean norm sqrt(d_in))
    "default": BAERecipe(lr=2e-3),
    # short runs on small d, on states as given (docs/training.md's recipe table says where
    # each recipe comes from)
    "short_run": BAERecipe(
        lr=2e-3,
        fields={
            "surrogate_temperature": 0.3,
            "covariance_coefficient": 1e-6,
        },
    ),
    # entropy estimation: the short-run coefficients at EntropyRecipe's lr, inputs framed at the
    # total variance of the fair-bit sets it was calibrated on, whatever their width
    "entropy": BAERecipe(
        lr=4e-3,
        fields={"surrogate_temperature": 0.3, "covariance_coefficient": 1e-6},
        input_total_variance=0.5,
    ),
    # the paper: a_e = a_c = 1e-7 whatever d, sigmoid surrogate at T = 1, states as given, Adam
    # lr 5e-4
    "paper": BAERecipe(
        lr=5e-4,
        fields={
            "entropy_coefficient": 1e-7,
            "covariance_coefficient": 1e-7,
            "coefficient_width": None,
        },
    ),
}
"""Every named recipe."""

DEFAULT_LR = BAE_RECIPES["default"].lr
"""Adam learning rate of the default recipe (a trainer setting, not part of the config)."""


def phase_steps(
    training_steps: int, entropy_off_fraction: float, covariance_off_final_fraction: float = 0.0
) -> dict[str, int | None]:
    """Phases given as fractions of a run of ``training_steps`` steps, in the config's steps:
    ``entropy_off_steps`` (``round(entropy_off_fraction * training_steps)``) and
    ``covariance_off_from_step`` (``round((1 - covariance_off_final_fraction) *
    training_steps)``; None for a fraction of 0)."""
    if not is_count(training_steps, 0):
        raise ValueError(f"training_steps must be an integer of at least 0, got {training_steps!r}")
    final = covariance_off_final_fraction
    return {
        "entropy_off_steps": round(entropy_off_fraction * training_steps),
        "covariance_off_from_step": None if final == 0 else round((1 - final) * training_steps),
    }


def bae_config(
    d_in: int,
    d_sae: int | None = None,
    *,
    recipe: str | BAERecipe = "default",
    coefficient_scale: float = 1.0,
    training_steps: int | None = None,
    **overrides: Any,
) -> BAETrainingSAEConfig:
    """A training config from a named recipe of ``BAE_RECIPES`` or a ``BAERecipe`` of one's own
    (train it with the recipe's ``lr``): ``d_sae`` 4 * d_in unless given (the paper's),
    ``coefficient_scale`` multiplies a_e and a_c, and ``overrides`` replace any config field.

    ``training_steps``, the length of the run, resolves the recipe's phases (fractions of
    training) into the config's ``entropy_off_steps`` and ``covariance_off_from_step``
    (:func:`phase_steps`; the default recipe: entropy off for ``round(0.25 * training_steps)``
    steps). Without it they are not applied: the config keeps its defaults (both terms on from
    the first step to the last), or the steps ``overrides`` give."""
    if not isinstance(recipe, BAERecipe):
        if recipe not in BAE_RECIPES:
            raise ValueError(f"unknown BAE recipe {recipe!r}; choose from {sorted(BAE_RECIPES)}")
        recipe = BAE_RECIPES[recipe]  # type: ignore[index]
    settings = {"d_in": d_in, "d_sae": 4 * d_in if d_sae is None else d_sae, **recipe.fields}
    if training_steps is not None:
        fractions = (recipe.entropy_off_fraction, recipe.covariance_off_final_fraction)
        settings.update(phase_steps(training_steps, *fractions))
    if recipe.input_total_variance is not None:
        settings["input_variance"] = recipe.input_total_variance / d_in
    defaults = BAETrainingSAEConfig.__dataclass_fields__
    for name in ("entropy_coefficient", "covariance_coefficient"):
        settings[name] = settings.get(name, defaults[name].default) * coefficient_scale
    return BAETrainingSAEConfig(**{**settings, **overrides})
