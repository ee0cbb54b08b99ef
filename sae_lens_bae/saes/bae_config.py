"""The BAE's configs: inference and training fields, validated; strict loading of a saved
``cfg.json``; and ``bae_config``, a training config from a named recipe (``saes.bae_recipes``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from sae_lens.constants import SAE_CFG_FILENAME
from sae_lens.saes.sae import SAEConfig, SAEMetadata, TrainingSAEConfig
from typing_extensions import override

from sae_lens_bae.checks import warn_renamed
from sae_lens_bae.saes.bae_recipes import BAE_RECIPES, BAERecipe
from sae_lens_bae.saes.binary import SURROGATES
from sae_lens_bae.saes.schedule import RESAMPLE_UNTIL_FRACTION, Schedule

__all__ = [
    "ARCHITECTURE",
    "BAE_RECIPES",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_LR",
    "BAEConfig",
    "BAERecipe",
    "BAETrainingSAEConfig",
    "Schedule",
    "bae_config",
    "read_cfg_json",
    "retired_differences",
    "validate_config_dict",
]

ARCHITECTURE = "bae"
DEFAULT_LR = BAE_RECIPES["default"].lr
"""Adam learning rate of the default recipe (a trainer setting, not part of the config)."""
_RECIPE_FIELDS = (
    "surrogate_temperature",
    "entropy_coefficient",
    "covariance_coefficient",
    "resample_every",
)
"""Training fields whose default (None) resolves to the ``default`` recipe at the config's d_in."""
RETIRED_FIELDS = {
    "firing_coefficient": 0.0,
    "resample_until_fraction": RESAMPLE_UNTIL_FRACTION,
    "encoder_bias": True,
}
"""Fields a BAE config once had, with the value every BAE now has: a checkpoint that recorded
another value was trained otherwise than this version trains (see :func:`retired_differences`)."""
_ADDED_FIELDS = {"rescale_inputs_to": None}
"""Inference fields added after BAEs were first saved: a cfg.json without one loads with this
value (what those BAEs did)."""
DEFAULT_BATCH_SIZE = 512
"""Minibatch size the paper uses; the entropy objective is measured on minibatches of this size."""


def retired_differences(stored: dict[str, Any]) -> list[str]:
    """The retired fields (``RETIRED_FIELDS``) that a saved config dict recorded with another
    value than every BAE now has, where that value changed what it is or how it trained (the
    resampling horizon only matters to a BAE that resampled)."""
    differences = []
    for key, now in RETIRED_FIELDS.items():
        if key == "resample_until_fraction" and not stored.get("resample_every"):
            continue
        if stored.get(key, now) != now:
            differences.append(key)
    return differences


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _validate_bae_fields(cfg: BAEConfig | BAETrainingSAEConfig) -> None:
    _check_positive_int("d_in", cfg.d_in)
    if cfg.d_sae is None:
        cfg.d_sae = 4 * cfg.d_in
    _check_positive_int("d_sae", cfg.d_sae)
    if isinstance(cfg.bits, bool) or not isinstance(cfg.bits, int) or cfg.bits < 1:
        raise ValueError(
            f"bits must be an integer >= 1 (bits per feature for more-bit decoding), "
            f"got {cfg.bits!r}"
        )
    target = cfg.rescale_inputs_to
    if target is not None and (isinstance(target, bool) or not target > 0):
        raise ValueError(
            f"rescale_inputs_to must be a positive total variance or None, got {target!r}"
        )
    if cfg.reshape_activations != "none":
        raise ValueError("BAE does not support reshape_activations; flatten hook_z upstream")


@dataclass
class BAEConfig(SAEConfig):
    """Inference configuration of a BAE (``d_in``, the width of the hidden state, is SAELens').

    Args:
        d_sae: number of features (decoder rows). None means 4 * d_in, the paper's default.
        bits: code bits per feature (more-bit decoding); the encoder emits ``bits * d_sae`` bits.
        apply_b_dec_to_input: SAELens' input centring; False, as in the paper.
        rescale_inputs_to: the BAE reads ``k (x + t)``: one factor (its ``input_scale``
            buffer) that brings its inputs to this total variance (mean squared distance from
            their mean) and one shift (``input_shift``) that puts their mean at
            sqrt(variance) along the diagonal, both set on the first training batch, undone on
            its reconstructions: training depends on neither the states' scale nor where they
            sit (``saes.input_scale``). None: inputs as given.
    """

    d_sae: int = None  # type: ignore[assignment]  # resolved to 4 * d_in in __post_init__
    bits: int = 1
    apply_b_dec_to_input: bool = False
    rescale_inputs_to: float | None = None

    @override
    @classmethod
    def architecture(cls) -> str:
        return ARCHITECTURE

    def __post_init__(self) -> None:
        super().__post_init__()
        _validate_bae_fields(self)

    @property
    def n_bits(self) -> int:
        """Width of the binary code: ``bits * d_sae``."""
        return self.bits * self.d_sae


@dataclass
class BAETrainingSAEConfig(TrainingSAEConfig):
    """Training configuration of a BAE: the objective, and its phases as fractions of training
    (inference fields as in :class:`BAEConfig`). Whoever trains resolves the phases into steps
    once (:meth:`schedule`).

    Args:
        surrogate: surrogate derivative of the step, a key of :data:`SURROGATES`
            (docs/research/synthetic-entropy.md compares them).
        surrogate_temperature: T of the sigmoid surrogate (1.0 is the paper's definition).
        entropy_coefficient: a_e, weight of the minibatch entropy in bits.
        covariance_coefficient: a_c, weight of the off-diagonal covariance penalty.
        entropy_off_fraction: first fraction of training with the entropy term off.
        covariance_off_final_fraction: last fraction of training with the covariance term off.
        resample_every: steps between resamplings of constant channels (0: never); they stop
            after ``RESAMPLE_UNTIL_FRACTION`` of training.
        total_training_steps: length of training, which resolves the fractions; set by
            ``train_sae`` and ``fill_training_schedule`` (SAELens never tells an SAE).

    The coefficients, ``surrogate_temperature`` and the resampling fields default to None: the
    ``default`` recipe of ``saes.bae_recipes`` at this ``d_in``.
    """

    d_sae: int = None  # type: ignore[assignment]
    bits: int = 1
    apply_b_dec_to_input: bool = False
    rescale_inputs_to: float | None = None
    surrogate: Literal["sigmoid", "ste"] = "sigmoid"
    surrogate_temperature: float = None  # type: ignore[assignment]
    entropy_coefficient: float = None  # type: ignore[assignment]
    covariance_coefficient: float = None  # type: ignore[assignment]
    entropy_off_fraction: float = 0.25
    covariance_off_final_fraction: float = 0.0
    resample_every: int = None  # type: ignore[assignment]
    total_training_steps: int | None = None

    @override
    @classmethod
    def architecture(cls) -> str:
        return ARCHITECTURE

    def __post_init__(self) -> None:
        _validate_bae_fields(self)
        defaults = BAE_RECIPES["default"].config_fields(self.d_in)
        for name in _RECIPE_FIELDS:
            if getattr(self, name) is None:
                setattr(self, name, defaults[name])
        if self.surrogate not in SURROGATES:
            raise ValueError(
                f"Unknown surrogate {self.surrogate!r}; choose one of {sorted(SURROGATES)}"
            )
        checks = {
            "surrogate_temperature": self.surrogate_temperature > 0,
            "entropy_coefficient": self.entropy_coefficient >= 0,
            "covariance_coefficient": self.covariance_coefficient >= 0,
            "entropy_off_fraction": 0.0 <= self.entropy_off_fraction <= 1.0,
            "covariance_off_final_fraction": 0.0 <= self.covariance_off_final_fraction <= 1.0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                "Invalid BAE training config: "
                + ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
                + " (temperature > 0, coefficients >= 0, fractions in [0, 1])"
            )
        for name in ("total_training_steps", "resample_every"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer or None, got {value!r}")
        super().__post_init__()

    @property
    def n_bits(self) -> int:
        return self.bits * self.d_sae

    def schedule(self, total_steps: int | None = None) -> Schedule:
        """The phases in steps for a run of ``total_steps`` (default: ``total_training_steps``,
        which wins when both are set); raises where a phase needs a length that is unknown."""
        total = self.total_training_steps if self.total_training_steps is not None else total_steps
        needs = {
            "entropy_off_fraction": self.entropy_off_fraction > 0,
            "covariance_off_final_fraction": self.covariance_off_final_fraction > 0,
        }
        unknown = [name for name, needed in needs.items() if needed and total is None]
        if unknown:
            raise ValueError(
                f"The BAE's {unknown[0]}={getattr(self, unknown[0])} needs the length of "
                "training, which SAELens never tells an SAE: set BAETrainingSAEConfig("
                "total_training_steps=...), or call fill_training_schedule(runner_config) "
                "before SAELens' runner"
            )
        covariance_off = (
            None
            if total is None or self.covariance_off_final_fraction == 0.0
            else round((1 - self.covariance_off_final_fraction) * total)
        )
        return Schedule(
            total_steps=total,
            entropy_on_from=0 if total is None else round(self.entropy_off_fraction * total),
            covariance_off_from=covariance_off,
            resample_every=self.resample_every,
            # without a length, resampling never stops (nothing says when training ends)
            resample_until=None if total is None else RESAMPLE_UNTIL_FRACTION * total,
        )

    def coefficients(self) -> dict[str, float]:
        """The coefficients' values, by the names SAELens schedules them under."""
        return {
            "entropy": self.entropy_coefficient,
            "covariance": self.covariance_coefficient,
        }


def read_cfg_json(folder: str | Path) -> dict[str, Any]:
    """The ``cfg.json`` of a saved SAE folder, with an error that says what is wrong with it
    (missing, not JSON, not an object) instead of a parser's traceback."""
    path = Path(folder) / SAE_CFG_FILENAME
    if not path.is_file():
        raise FileNotFoundError(
            f"No {SAE_CFG_FILENAME} in {folder}: expected a folder written by "
            "save_inference_model / save_model"
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); save the SAE again") from e
    if not isinstance(data, dict) or "architecture" not in data:
        raise ValueError(f"{path} is not an SAE config (a JSON object with an 'architecture')")
    return data


def validate_config_dict(config_dict: dict[str, Any]) -> BAEConfig:
    """Build a :class:`BAEConfig` from a saved cfg.json dict, strictly.

    SAELens' own ``from_dict`` silently drops unknown keys and defaults missing ones; for a saved
    BAE a typo (``"bit": 2``) or a truncated file would then load a different model, so unknown
    and missing fields raise here.
    """
    if config_dict.get("architecture", ARCHITECTURE) != ARCHITECTURE:
        raise ValueError(
            f"Config is for architecture {config_dict['architecture']!r}, not {ARCHITECTURE!r}"
        )
    if config_dict.get("encoder_bias", True) is not True:
        raise ValueError(
            "This BAE was saved without an encoder bias, which every BAE of this version has; "
            "train it again"
        )
    config_dict = {k: v for k, v in config_dict.items() if k != "encoder_bias"}
    known = {f.name for f in fields(BAEConfig)}
    extra = sorted(set(config_dict) - known - {"architecture"})
    missing = sorted(known - set(config_dict) - {"metadata"} - set(_ADDED_FIELDS))
    if extra or missing:
        problems = []
        if extra:
            problems.append(f"unknown field(s) {extra}")
        if missing:
            problems.append(f"missing field(s) {missing}")
        raise ValueError(
            f"Invalid BAE config: {'; '.join(problems)}. A BAE cfg.json holds exactly "
            f"{sorted(known - {'metadata'})} plus 'architecture' and optional 'metadata'."
        )
    values = {k: v for k, v in config_dict.items() if k in known and k != "metadata"}
    cfg = BAEConfig(**values)
    if "metadata" in config_dict:
        cfg.metadata = SAEMetadata(**config_dict["metadata"])
    return cfg


def bae_config(
    d_in: int,
    d_sae: int | None = None,
    *,
    recipe: str | BAERecipe = "default",
    coefficient_scale: float = 1.0,
    total_training_steps: int | None = None,
    preset: str | BAERecipe | None = None,
    **overrides: Any,
) -> BAETrainingSAEConfig:
    """A training config from a named recipe of ``BAE_RECIPES``, or a ``BAERecipe`` of one's own
    (train it with the recipe's ``lr``). ``coefficient_scale`` multiplies a_e and a_c;
    ``overrides`` replace any config field. ``preset`` is ``recipe``'s old name."""
    if preset is not None:
        warn_renamed("bae_config(recipe=...)", "recipe=")
        recipe = preset
    if not isinstance(recipe, BAERecipe):
        if recipe not in BAE_RECIPES:
            raise ValueError(f"unknown BAE recipe {recipe!r}; choose from {sorted(BAE_RECIPES)}")
        recipe = BAE_RECIPES[recipe]
    settings: dict[str, Any] = {
        **recipe.config_fields(d_in),
        "entropy_off_fraction": recipe.entropy_off_fraction,
        "total_training_steps": total_training_steps,
    }
    settings["entropy_coefficient"] *= coefficient_scale
    settings["covariance_coefficient"] *= coefficient_scale
    return BAETrainingSAEConfig(d_in=d_in, d_sae=d_sae, **{**settings, **overrides})
