"""Named BAE training recipes, as data: the config fields each sets beyond
:class:`BAETrainingSAEConfig`'s defaults (which are the ``default`` recipe) and the Adam learning
rate it trains with. ``bae_config(d_in, recipe=name)`` builds a config from one. How ``default``
was chosen, every piece against the paper's bare equations, is in ``docs/research/ablation.md``;
the ``entropy`` recipe's evidence in ``docs/research/entropy-recipe.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sae_lens_bae.saes.bae import BAETrainingSAEConfig

__all__ = [
    "BAE_RECIPES",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_LR",
    "BAERecipe",
    "RecipeName",
    "bae_config",
]

RecipeName = Literal["default", "short_run", "entropy", "paper"]
"""The names of ``BAE_RECIPES`` (for configs and CLIs that pick one)."""

DEFAULT_BATCH_SIZE = 512
"""Minibatch size of the paper: the entropy objective is measured on minibatches of this size."""


@dataclass(frozen=True)
class BAERecipe:
    """One recipe: the trainer's Adam learning rate and the config fields it sets."""

    lr: float
    """Adam learning rate it trains with."""
    fields: dict[str, Any] = field(default_factory=dict)
    """Config fields it sets beyond :class:`BAETrainingSAEConfig`'s defaults."""
    input_total_variance: float | None = None
    """Total variance its input frame brings states of any width to (``input_variance`` is
    this / d_in); None: ``fields``' or the default's variance per dimension."""


BAE_RECIPES: dict[RecipeName, BAERecipe] = {
    # the config's defaults: the paper's equations with the entropy term off for the first
    # quarter, the short-run entropy coefficient and a covariance coefficient 16x it, the
    # paper's surrogate temperature, inputs as given (at mean norm sqrt(d_in))
    "default": BAERecipe(lr=2e-3),
    # the short-run rule, tuned on the synthetic benchmark at d = 64 and 128 on states as given
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


def bae_config(
    d_in: int,
    d_sae: int | None = None,
    *,
    recipe: str | BAERecipe = "default",
    coefficient_scale: float = 1.0,
    **overrides: Any,
) -> BAETrainingSAEConfig:
    """A training config from a named recipe of ``BAE_RECIPES`` or a ``BAERecipe`` of one's own
    (train it with the recipe's ``lr``): ``d_sae`` 4 * d_in unless given (the paper's),
    ``coefficient_scale`` multiplies a_e and a_c, and ``overrides`` replace any config field."""
    if not isinstance(recipe, BAERecipe):
        if recipe not in BAE_RECIPES:
            raise ValueError(f"unknown BAE recipe {recipe!r}; choose from {sorted(BAE_RECIPES)}")
        recipe = BAE_RECIPES[recipe]  # type: ignore[index]
    settings = {"d_in": d_in, "d_sae": 4 * d_in if d_sae is None else d_sae, **recipe.fields}
    if recipe.input_total_variance is not None:
        settings["input_variance"] = recipe.input_total_variance / d_in
    defaults = BAETrainingSAEConfig.__dataclass_fields__
    for name in ("entropy_coefficient", "covariance_coefficient"):
        settings[name] = settings.get(name, defaults[name].default) * coefficient_scale
    return BAETrainingSAEConfig(**{**settings, **overrides})
