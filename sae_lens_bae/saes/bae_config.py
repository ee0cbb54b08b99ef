"""The BAE's configs: inference and training fields, validated; strict loading of a saved
``cfg.json``; and ``bae_config``, a training config from a named recipe (``saes.bae_presets``)."""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from sae_lens.constants import SAE_CFG_FILENAME
from sae_lens.saes.sae import SAEConfig, SAEMetadata, TrainingSAEConfig
from sae_lens.training.sae_trainer import SAETrainer
from typing_extensions import override

from sae_lens_bae.saes.bae_presets import BAE_PRESETS, BAEPreset
from sae_lens_bae.saes.binary import SURROGATES

__all__ = [
    "ARCHITECTURE",
    "BAE_PRESETS",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_LR",
    "BAEConfig",
    "BAEPreset",
    "BAETrainingSAEConfig",
    "bae_config",
    "length_of_calling_trainer",
    "read_cfg_json",
    "validate_config_dict",
]

ARCHITECTURE = "bae"
DEFAULT_LR = BAE_PRESETS["default"].lr
"""Adam learning rate of the default recipe (a trainer setting, not part of the config)."""
_RECIPE_FIELDS = (
    "surrogate_temperature",
    "entropy_coefficient",
    "covariance_coefficient",
    "firing_coefficient",
    "resample_every",
    "resample_until_fraction",
)
"""Training fields whose default (None) resolves to the ``default`` recipe at the config's d_in."""
_ADDED_FIELDS = {"rescale_inputs_to": None}
"""Inference fields added after BAEs were first saved: a cfg.json without one loads with this
value (what those BAEs did)."""
DEFAULT_BATCH_SIZE = 512
"""Minibatch size the paper uses; the entropy objective is measured on minibatches of this size."""


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
    """Inference configuration of a BAE.

    Args:
        d_in: width of the hidden state.
        d_sae: number of features (decoder rows). None means 4 * d_in, the paper's default.
        bits: code bits per feature (more-bit decoding); the encoder emits ``bits * d_sae`` bits.
        encoder_bias: whether the encoder has a bias ``b_enc`` (a firing threshold per bit).
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
    encoder_bias: bool = True
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
    """Training configuration of a BAE (inference fields as in :class:`BAEConfig`).

    Args:
        surrogate: surrogate derivative of the step, a key of :data:`SURROGATES`. Default
            ``"sigmoid"``: in the synthetic-entropy prototype (d=64, d_sae=256) the sigmoid
            surrogate recovered every r in {0..32} within 0.0004 bits while straight-through was
            30-47% off in every setting tried.
        surrogate_temperature: T of the sigmoid surrogate (1.0 is the paper's definition).
        entropy_coefficient: a_e, weight of the minibatch entropy in bits.
        covariance_coefficient: a_c, weight of the off-diagonal covariance penalty.

        These, ``firing_coefficient``, ``resample_every`` and ``resample_until_fraction``
        default to None: the ``default``
        recipe of ``saes.bae_presets``, with the coefficients scaled by 2048 / d_in, so the
        default config suits any width (``bae_config(d_in, preset="paper")`` for the paper's).
        entropy_off_steps: training steps with the entropy term off. None means
            ``entropy_off_fraction * total_training_steps``.
        entropy_off_fraction: fraction of training with the entropy term off (paper: 25%).
        covariance_off_final_fraction: the last fraction of training with the covariance term
            off (default 0: on to the end). On planted bits the term, noisy on a minibatch,
            holds each channel's threshold at the edge of its firing states, so a code that
            found every bit still flips a few % of them (docs/entropy.md, "The covariance
            term's floor"); training the last steps without it lets the reconstruction move the
            thresholds back, while the entropy term keeps the code from growing.
        total_training_steps: length of training, needed only to resolve the fraction above;
            :func:`sae_lens_bae.training.fill_training_schedule` fills it from a runner config.
        dense_threshold: firing rate above which a code bit counts as dense in the metrics.
        covariance_block_size: tile size of the covariance penalty (None: by device, at most
            2048 on CUDA and 724 elsewhere, evened out over n_bits).
        code_mean_decay: the ``code_mean`` buffer (mean code, the prior used for burstiness) is a
            running mean over the first 1 / (1 - decay) steps, then an exponential average.
        firing_coefficient: a_f, weight of the summed minibatch firing rates (the mean number of
            active bits per sample). The entropy is symmetric in p and 1 - p, so without it a
            channel parked always on costs as little as one that never fires; with it the rare
            state of every channel is its 1.
        coefficient_warm_up_steps: a_e, a_c and a_f rise linearly from 0 over these first steps
            (SAELens' coefficient warm-up), on top of ``entropy_off_steps``.
        resample_every: every this many steps, channels that were constant over those steps
            (never or always on) are re-initialised on the minibatch's worst-reconstructed samples
            (0: never). Only while ``resample_until_fraction`` of training has not passed.
        resample_until_fraction: resampling stops after this fraction of training (so the last
            resampled channels still train), or never when the length of training is unknown.
        resample_rate: a re-initialised channel fires on this fraction of the minibatch.
    """

    d_sae: int = None  # type: ignore[assignment]
    bits: int = 1
    encoder_bias: bool = True
    apply_b_dec_to_input: bool = False
    rescale_inputs_to: float | None = None
    surrogate: Literal["sigmoid", "ste"] = "sigmoid"
    surrogate_temperature: float = None  # type: ignore[assignment]  # None: the default recipe
    entropy_coefficient: float = None  # type: ignore[assignment]
    covariance_coefficient: float = None  # type: ignore[assignment]
    entropy_off_steps: int | None = None
    entropy_off_fraction: float = 0.25
    covariance_off_final_fraction: float = 0.0
    total_training_steps: int | None = None
    dense_threshold: float = 0.5
    covariance_block_size: int | None = None
    code_mean_decay: float = 0.999
    firing_coefficient: float = None  # type: ignore[assignment]
    coefficient_warm_up_steps: int = 0
    resample_every: int = None  # type: ignore[assignment]
    resample_until_fraction: float = None  # type: ignore[assignment]
    resample_rate: float = 0.05

    @override
    @classmethod
    def architecture(cls) -> str:
        return ARCHITECTURE

    def __post_init__(self) -> None:
        _validate_bae_fields(self)
        defaults = BAE_PRESETS["default"].config_fields(self.d_in)
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
            "dense_threshold": 0.0 < self.dense_threshold < 1.0,
            "code_mean_decay": 0.0 <= self.code_mean_decay < 1.0,
            "firing_coefficient": self.firing_coefficient >= 0,
            "resample_until_fraction": 0.0 <= self.resample_until_fraction <= 1.0,
            "resample_rate": 0.0 < self.resample_rate < 0.5,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                "Invalid BAE training config: "
                + ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
                + " (temperature > 0, coefficients >= 0, fractions in [0, 1], "
                "0 < dense_threshold < 1, 0 <= code_mean_decay < 1, 0 < resample_rate < 0.5)"
            )
        for name in (
            "entropy_off_steps",
            "total_training_steps",
            "covariance_block_size",
            "coefficient_warm_up_steps",
            "resample_every",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer or None, got {value!r}")
        super().__post_init__()

    @property
    def n_bits(self) -> int:
        return self.bits * self.d_sae

    def resolved_entropy_off_steps(self) -> int:
        """Number of initial steps without the entropy term; raises if it cannot be known."""
        if self.entropy_off_steps is not None:
            return self.entropy_off_steps
        if self.entropy_off_fraction == 0.0:
            return 0
        if self.total_training_steps is None:
            raise ValueError(
                "The BAE switches its entropy term on after "
                f"entropy_off_fraction={self.entropy_off_fraction} of training, but does not know "
                "how long training is (SAELens' SAETrainer tells it; this trainer did not). "
                "Set BAETrainingSAEConfig(total_training_steps=...) or (entropy_off_steps=...)."
            )
        return round(self.entropy_off_fraction * self.total_training_steps)

    def covariance_on(self, step: int) -> bool:
        """Whether the covariance term counts at training step ``step`` (0-based): off for the
        last ``covariance_off_final_fraction`` of training; raises if its length is unknown."""
        if self.covariance_off_final_fraction == 0.0:
            return True
        if self.total_training_steps is None:
            raise ValueError(
                "The BAE switches its covariance term off for the last "
                f"covariance_off_final_fraction={self.covariance_off_final_fraction} of training, "
                "but does not know how long training is. "
                "Set BAETrainingSAEConfig(total_training_steps=...)."
            )
        return step < round((1 - self.covariance_off_final_fraction) * self.total_training_steps)

    def coefficients_at(self, step: int) -> dict[str, float]:
        """a_e, a_c, a_f at training step ``step`` (0-based): SAELens' linear warm-up over
        ``coefficient_warm_up_steps`` (what ``SAETrainer`` hands the BAE), for trainers that
        schedule the coefficients themselves."""
        warm = self.coefficient_warm_up_steps
        factor = min(step / warm, 1.0) if warm > 0 else 1.0
        return {name: factor * value for name, value in self.coefficients().items()}

    def coefficients(self) -> dict[str, float]:
        """The coefficients' final values, by the names SAELens schedules them under."""
        return {
            "entropy": self.entropy_coefficient,
            "covariance": self.covariance_coefficient,
            "firing": self.firing_coefficient,
        }

    def resampling_at(self, step: int) -> bool:
        """Whether step ``step`` (0-based) ends a resampling window."""
        if self.resample_every <= 0 or (step + 1) % self.resample_every:
            return False
        if self.total_training_steps is None:
            return True
        return step < self.resample_until_fraction * self.total_training_steps

    def window_counted(self, step: int) -> bool:
        """Whether step ``step`` (0-based) counts its codes for resampling: its window ends in
        one (``resampling_at``). After the last resampling nothing reads the counts, and the
        count costs 3-4 kernel launches a step for the rest of training."""
        if self.resample_every <= 0:
            return False
        return self.resampling_at(step + (-(step + 1)) % self.resample_every)


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
    preset: str | BAEPreset = "default",
    coefficient_scale: float = 1.0,
    coefficient_warm_up_fraction: float = 0.0,
    total_training_steps: int | None = None,
    **overrides: Any,
) -> BAETrainingSAEConfig:
    """A training config from a named recipe of ``BAE_PRESETS``, or a ``BAEPreset`` of one's own
    (train it with the recipe's ``lr``). ``coefficient_scale`` multiplies a_e and a_c;
    ``coefficient_warm_up_fraction`` warms all coefficients up over that fraction of
    ``total_training_steps``; ``overrides`` replace any config field."""
    if isinstance(preset, BAEPreset):
        recipe = preset
    elif preset in BAE_PRESETS:
        recipe = BAE_PRESETS[preset]
    else:
        raise ValueError(f"unknown BAE preset {preset!r}; choose from {sorted(BAE_PRESETS)}")
    settings: dict[str, Any] = {
        **recipe.config_fields(d_in),
        "entropy_off_fraction": recipe.entropy_off_fraction,
        "total_training_steps": total_training_steps,
    }
    settings["entropy_coefficient"] *= coefficient_scale
    settings["covariance_coefficient"] *= coefficient_scale
    if coefficient_warm_up_fraction:
        if total_training_steps is None:
            raise ValueError("coefficient_warm_up_fraction needs total_training_steps")
        settings["coefficient_warm_up_steps"] = round(
            coefficient_warm_up_fraction * total_training_steps
        )
    return BAETrainingSAEConfig(d_in=d_in, d_sae=d_sae, **{**settings, **overrides})


def length_of_calling_trainer() -> int | None:
    """``total_training_steps`` of the ``SAETrainer`` whose constructor called
    ``get_coefficients`` (two frames up), if that is what called it: how a BAE learns the
    length of training, which SAELens never tells an SAE."""
    frame = inspect.currentframe()
    caller = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
    trainer = caller.f_locals.get("self") if caller is not None else None
    steps = getattr(getattr(trainer, "cfg", None), "total_training_steps", None)
    return steps if isinstance(trainer, SAETrainer) and isinstance(steps, int) else None
