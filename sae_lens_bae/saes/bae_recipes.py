"""Named BAE training recipes: the coefficients, surrogate temperature, resampling and learning
rate a BAE trains with; ``default`` is what ``BAETrainingSAEConfig(d_in=...)`` resolves to.

Coefficients are given at d = 2048 and used as a * 2048 / d_in (``scale_with_d``): the
reconstruction loss is a mean over d_in while the entropy and covariance terms are sums
over channels, so a fixed coefficient would weigh the penalties d_in times more at a small width
than at a large one. How ``default`` was chosen, with the table of every recipe tried, is in
``docs/research/feature-study.md`` (``bae bench recipes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sae_lens_bae.checks import warn_renamed

__all__ = ["BAE_RECIPES", "BAERecipe", "RecipeName"]

RecipeName = Literal["default", "short_run", "entropy", "paper"]
"""The names of ``BAE_RECIPES`` (for configs and CLIs that pick one)."""


@dataclass(frozen=True)
class BAERecipe:
    """One recipe: config values (coefficients at d = 2048) and the trainer's Adam lr."""

    lr: float
    surrogate_temperature: float
    entropy_coefficient: float
    covariance_coefficient: float
    entropy_off_fraction: float = 0.25
    resample_every: int = 0
    scale_with_d: bool = True
    rescale_inputs_to: float | None = None
    """The total variance the recipe was calibrated at, which the BAE then scales (and places)
    its inputs to (``saes.input_scale``); None: inputs as given."""

    def config_fields(self, d_in: int) -> dict[str, float | int | None]:
        """The config fields this recipe sets for states of width ``d_in``: coefficients,
        surrogate temperature, resampling (those a config left at None resolves to) and the
        input scale."""
        return {
            **self.coefficients(d_in),
            "surrogate_temperature": self.surrogate_temperature,
            "resample_every": self.resample_every,
            "rescale_inputs_to": self.rescale_inputs_to,
        }

    def coefficients(self, d_in: int) -> dict[str, float]:
        """a_e, a_c, a_f for a BAE reading states of width ``d_in``."""
        scale = 2048 / d_in if self.scale_with_d else 1.0
        return {
            "entropy_coefficient": self.entropy_coefficient * scale,
            "covariance_coefficient": self.covariance_coefficient * scale,
        }


BAE_RECIPES: dict[RecipeName, BAERecipe] = {
    # the short-run entropy coefficient with 8x its covariance coefficient, the paper's
    # surrogate temperature, and near-constant channels resampled every 125 steps until 95% of
    # training (docs/research/code-notes.md)
    "default": BAERecipe(
        lr=2e-3,
        surrogate_temperature=1.0,
        entropy_coefficient=5e-7,
        covariance_coefficient=8e-6,
        resample_every=125,
    ),
    # 0.1's short-run rule (the prototype's, tuned on the synthetic benchmark at d = 64 and 128;
    # the coefficients EntropyRecipe uses)
    "short_run": BAERecipe(
        lr=2e-3, surrogate_temperature=0.3, entropy_coefficient=5e-7, covariance_coefficient=1e-6
    ),
    # entropy estimation through the registry: the short-run coefficients and temperature at
    # EntropyRecipe's lr, no resampling (a resampled channel is a random one: it adds entropy).
    # Calibrated on fair-bit sets at unit mean squared norm, a total variance of 0.5; the BAE
    # is not scale- or translation-invariant, so it scales and places its inputs there itself
    # (saes.input_scale, as every BAE of EntropyRecipe does): states of any scale and mean do
    "entropy": BAERecipe(
        lr=4e-3,
        surrogate_temperature=0.3,
        entropy_coefficient=5e-7,
        covariance_coefficient=1e-6,
        rescale_inputs_to=0.5,
    ),
    # the paper: a_e = a_c = 1e-7 whatever d, sigmoid surrogate at T = 1, Adam lr 5e-4, 100 epochs
    "paper": BAERecipe(
        lr=5e-4,
        surrogate_temperature=1.0,
        entropy_coefficient=1e-7,
        covariance_coefficient=1e-7,
        scale_with_d=False,
    ),
}
"""Every named recipe; ``bae_config(d_in, recipe=name)`` builds a config from one."""

_OLD_NAMES = {"BAE_PRESETS": "BAE_RECIPES", "BAEPreset": "BAERecipe", "PresetName": "RecipeName"}


def __getattr__(name: str) -> Any:
    """The old names of this module's contents, for one release."""
    if name in _OLD_NAMES:
        warn_renamed(name, _OLD_NAMES[name])
        return globals()[_OLD_NAMES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
