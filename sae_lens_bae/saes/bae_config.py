"""The BAE's configs: inference and training fields, validated; strict loading of a saved
``cfg.json``; and the recipes (learning rate, coefficients) a BAE is trained with."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from sae_lens.saes.sae import SAEConfig, SAEMetadata, TrainingSAEConfig
from typing_extensions import override

from sae_lens_bae.saes.binary import SURROGATES

__all__ = [
    "ARCHITECTURE",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_LR",
    "SHORT_RUN_LR",
    "BAEConfig",
    "BAETrainingSAEConfig",
    "short_run_config",
    "validate_config_dict",
]

ARCHITECTURE = "bae"
DEFAULT_LR = 5e-4
"""Adam learning rate the paper uses for BAEs (trainer-level setting, not part of the config)."""
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
    """

    d_sae: int = None  # type: ignore[assignment]  # resolved to 4 * d_in in __post_init__
    bits: int = 1
    encoder_bias: bool = True
    apply_b_dec_to_input: bool = False

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
        entropy_off_steps: training steps with the entropy term off. None means
            ``entropy_off_fraction * total_training_steps``.
        entropy_off_fraction: fraction of training with the entropy term off (paper: 25%).
        total_training_steps: length of training, needed only to resolve the fraction above;
            :func:`sae_lens_bae.training.fill_training_schedule` fills it from a runner config.
        dense_threshold: firing rate above which a code bit counts as dense in the metrics.
        covariance_block_size: tile size of the covariance penalty (None: min(n_bits, 2048)).
        code_mean_decay: the ``code_mean`` buffer (mean code, the prior used for burstiness) is a
            running mean over the first 1 / (1 - decay) steps, then an exponential average.
    """

    d_sae: int = None  # type: ignore[assignment]
    bits: int = 1
    encoder_bias: bool = True
    apply_b_dec_to_input: bool = False
    surrogate: Literal["sigmoid", "ste"] = "sigmoid"
    surrogate_temperature: float = 1.0
    entropy_coefficient: float = 1e-7
    covariance_coefficient: float = 1e-7
    entropy_off_steps: int | None = None
    entropy_off_fraction: float = 0.25
    total_training_steps: int | None = None
    dense_threshold: float = 0.5
    covariance_block_size: int | None = None
    code_mean_decay: float = 0.999

    @override
    @classmethod
    def architecture(cls) -> str:
        return ARCHITECTURE

    def __post_init__(self) -> None:
        _validate_bae_fields(self)
        if self.surrogate not in SURROGATES:
            raise ValueError(
                f"Unknown surrogate {self.surrogate!r}; choose one of {sorted(SURROGATES)}"
            )
        checks = {
            "surrogate_temperature": self.surrogate_temperature > 0,
            "entropy_coefficient": self.entropy_coefficient >= 0,
            "covariance_coefficient": self.covariance_coefficient >= 0,
            "entropy_off_fraction": 0.0 <= self.entropy_off_fraction <= 1.0,
            "dense_threshold": 0.0 < self.dense_threshold < 1.0,
            "code_mean_decay": 0.0 <= self.code_mean_decay < 1.0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                "Invalid BAE training config: "
                + ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
                + " (temperature > 0, coefficients >= 0, fractions in [0, 1], "
                "0 < dense_threshold < 1, 0 <= code_mean_decay < 1)"
            )
        for name in ("entropy_off_steps", "total_training_steps", "covariance_block_size"):
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
                "how long training is. Set BAETrainingSAEConfig(entropy_off_steps=...) or "
                "(total_training_steps=...), or call "
                "sae_lens_bae.training.fill_training_schedule(runner_or_trainer_config) "
                "before building the runner or trainer."
            )
        return round(self.entropy_off_fraction * self.total_training_steps)


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
    missing = sorted(known - set(config_dict) - {"metadata"})
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


SHORT_RUN_LR = 2e-3
"""Adam learning rate of ``short_run_config``: 1000-2000 steps instead of the paper's 100 epochs."""


def short_run_config(d_in: int, d_sae: int | None = None, **overrides: Any) -> BAETrainingSAEConfig:
    """A BAE config for short runs (a thousand or two steps, train with lr ``SHORT_RUN_LR``).

    The paper's defaults (T = 1, a_e = a_c = 1e-7, lr 5e-4) need its long schedule. The prototype's
    rule for short training: sigmoid surrogate at T = 0.3 and the paper's d = 2048 coefficients
    (a_e = 5e-7, a_c = 1e-6) rescaled by 2048 / d_in, since the reconstruction loss is a mean over
    d_in while the penalties are sums over channels. ``overrides`` replace any field.
    """
    settings: dict[str, Any] = {
        "surrogate_temperature": 0.3,
        "entropy_coefficient": 5e-7 * 2048 / d_in,
        "covariance_coefficient": 1e-6 * 2048 / d_in,
        **overrides,
    }
    return BAETrainingSAEConfig(d_in=d_in, d_sae=d_sae, **settings)
