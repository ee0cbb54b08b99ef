"""The Binary Autoencoder (BAE) as a SAELens architecture: configs, inference and training class.

A BAE encodes a hidden state h0 (dim d_in) into a binary code
``h_B = step(h0 @ W_enc + b_enc)`` in {0, 1}^(bits * d_sae), with ``step(x) = 1`` for ``x >= 0``,
and decodes ``h_R @ W_dec + b_dec`` where ``h_R`` groups every ``bits`` code bits into one real
value (``h_R = h_B`` for ``bits = 1``). Training minimises

    reconstruction + a_e * H(mean code of the minibatch) + a_c * sum_{i != j} |cov(h_B)_ij|

and passes gradients through the step with a surrogate derivative (see :data:`SURROGATES`).

SAELens' parameter names (``W_enc``, ``W_dec``, ``b_enc``, ``b_dec``) and hook points are kept, so
its evals, histograms and scaling folds work unchanged. Two SAELens behaviours differ on purpose:

* ``apply_b_dec_to_input`` defaults to False: the paper's encoder sees the raw hidden state.
* ``fold_W_dec_norm`` is refused: codes are binary, so decoder norms cannot move into the encoder
  without changing the reconstruction.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, NoReturn

import torch
from jaxtyping import Float
from numpy.typing import NDArray
from sae_lens.constants import SAE_CFG_FILENAME
from sae_lens.saes.sae import (
    SAE,
    SAEConfig,
    SAEMetadata,
    TrainCoefficientConfig,
    TrainingSAE,
    TrainingSAEConfig,
    TrainStepInput,
    TrainStepOutput,
)
from torch import Tensor, nn
from typing_extensions import override

from sae_lens_bae.losses import covariance_penalty, minibatch_entropy, reconstruction_loss

__all__ = [
    "SHORT_RUN_LR",
    "short_run_config",
    "BAE",
    "BAEConfig",
    "BAETrainingSAE",
    "BAETrainingSAEConfig",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_LR",
    "SURROGATES",
    "bits_to_values",
    "step",
    "validate_config_dict",
]

ARCHITECTURE = "bae"
DEFAULT_LR = 5e-4
"""Adam learning rate the paper uses for BAEs (trainer-level setting, not part of the config)."""
DEFAULT_BATCH_SIZE = 512
"""Minibatch size the paper uses; the entropy objective is measured on minibatches of this size."""


# ----------------------------------------------------------------------------- step + surrogates


def _sigmoid_surrogate(x: Tensor, temperature: float) -> Tensor:
    s = torch.sigmoid(x / temperature)
    return s * (1.0 - s) / temperature


def _straight_through(x: Tensor, temperature: float) -> Tensor:  # noqa: ARG001
    return torch.ones_like(x)


SURROGATES: dict[str, Callable[[Tensor, float], Tensor]] = {
    "sigmoid": _sigmoid_surrogate,
    "ste": _straight_through,
}
"""Surrogate derivatives of the step, by name.

``sigmoid``: d/dx sigmoid(x / T), i.e. ``sigmoid(x/T)(1 - sigmoid(x/T)) / T`` (the paper's
definition is T = 1). ``ste``: straight-through, derivative 1.
"""


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, surrogate: str, temperature: float) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        ctx.surrogate, ctx.temperature = surrogate, temperature
        return (x >= 0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        return grad_out * SURROGATES[ctx.surrogate](x, ctx.temperature), None, None


def step(
    x: Float[Tensor, "..."], surrogate: str | None = None, temperature: float = 1.0
) -> Float[Tensor, "..."]:
    """Heaviside step (1 where ``x >= 0``) in ``x``'s dtype.

    With ``surrogate`` set, gradients pass through with that surrogate derivative; without, the
    result is a constant for autograd (inference).
    """
    if surrogate is None:
        return (x >= 0).to(x.dtype)
    if surrogate not in SURROGATES:
        raise ValueError(f"Unknown surrogate {surrogate!r}; choose one of {sorted(SURROGATES)}")
    return _Step.apply(x, surrogate, temperature)  # type: ignore[no-any-return]


def bits_to_values(
    bits: Float[Tensor, "... n_bits"], n_bits_per_value: int
) -> Float[Tensor, "... n_values"]:
    """More-bit decoding: each group of C bits becomes sum_j 2^j b_j / (2^C - 1) in [0, 1].

    Bit j of feature k sits at index ``k * C + j`` (j = 0 is the least significant bit).
    """
    if n_bits_per_value == 1:
        return bits
    if bits.shape[-1] % n_bits_per_value:
        raise ValueError(f"{bits.shape[-1]} bits do not split into groups of {n_bits_per_value}")
    weights = 2.0 ** torch.arange(n_bits_per_value, device=bits.device, dtype=bits.dtype)
    weights = weights / (2**n_bits_per_value - 1)
    grouped = bits.unflatten(-1, (-1, n_bits_per_value))
    return grouped @ weights


# ----------------------------------------------------------------------------- configs


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


# ----------------------------------------------------------------------------- shared pieces


def _init_bae_parameters(sae: BAE | BAETrainingSAE) -> None:
    """Encoder of width bits * d_sae, optional encoder bias, and the running mean-code buffers."""
    cfg = sae.cfg
    if cfg.bits > 1:  # bits of one feature need distinct directions: no tied init
        w_enc = torch.empty(cfg.d_in, cfg.n_bits, dtype=sae.dtype, device=sae.device)
        nn.init.kaiming_uniform_(w_enc)
        sae.W_enc = nn.Parameter(w_enc)
    if cfg.encoder_bias:
        sae.b_enc = nn.Parameter(torch.zeros(cfg.n_bits, dtype=sae.dtype, device=sae.device))
    else:
        sae.register_parameter("b_enc", None)
    sae.register_buffer(
        "code_mean", torch.zeros(cfg.n_bits, dtype=torch.float32, device=sae.device)
    )
    sae.register_buffer("code_mean_count", torch.zeros((), dtype=torch.float32, device=sae.device))


@torch.no_grad()
def update_running_mean(mean: Tensor, count: Tensor, batch_mean: Tensor, decay: float) -> None:
    """In place: the exact running mean for the first 1/(1-decay) updates, then an exponential
    average with weight 1 - decay. Tensor arithmetic only: a GPU step never waits for the host."""
    count += 1
    mean.lerp_(batch_mean, torch.clamp(count.reciprocal(), min=1.0 - decay))


def _refuse_decoder_norm_folding() -> NoReturn:
    raise ValueError(
        "A BAE cannot fold decoder norms: its codes are binary, so scaling the encoder does not "
        "scale them and the reconstruction would change. Load or use it without "
        "fold_W_dec_norm (its outputs are already exact)."
    )


class _BAEMixin:
    """Weights, encoding, decoding, validation and folding shared by the inference and the
    training BAE (listed first in their bases, so ``super()`` reaches SAELens' classes)."""

    cfg: BAEConfig | BAETrainingSAEConfig
    W_enc: nn.Parameter
    b_enc: nn.Parameter | None
    code_mean: Tensor
    code_mean_count: Tensor
    W_dec: nn.Parameter
    b_dec: nn.Parameter
    hook_sae_acts_pre: Callable[[Tensor], Tensor]
    hook_sae_acts_post: Callable[[Tensor], Tensor]
    hook_sae_recons: Callable[[Tensor], Tensor]
    run_time_activation_norm_fn_out: Callable[[Tensor], Tensor]

    def initialize_weights(self) -> None:
        super().initialize_weights()  # type: ignore[misc]  # SAE's or TrainingSAE's
        _init_bae_parameters(self)  # type: ignore[arg-type]

    def decode(self, feature_acts: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_in"]:
        sae_out = self.hook_sae_recons(feature_acts @ self.W_dec + self.b_dec)
        return self.run_time_activation_norm_fn_out(sae_out)

    def _check_input(self, x: Tensor) -> None:
        if x.shape[-1] != self.cfg.d_in:
            raise ValueError(
                f"BAE expects activations with last dimension d_in={self.cfg.d_in}, got shape "
                f"{tuple(x.shape)}. Check the hook point (and the model) this BAE was trained on: "
                f"{self.cfg.metadata.hook_name or 'unknown hook'}."
            )
        if not torch.isfinite(x).all():
            n_bad = int((~torch.isfinite(x)).sum())
            raise ValueError(
                f"BAE received {n_bad} NaN/Inf values in activations of shape {tuple(x.shape)}. "
                "Check the model's dtype (fp16 overflow) and the activation source."
            )

    def process_sae_in(self, sae_in: Tensor) -> Tensor:
        self._check_input(sae_in)
        return SAE.process_sae_in(self, sae_in)  # type: ignore[arg-type]

    def hidden_pre(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... n_bits"]:
        """Encoder pre-activations of every code bit (their sign is the code)."""
        pre = self.process_sae_in(x) @ self.W_enc
        if self.b_enc is not None:
            pre = pre + self.b_enc
        return self.hook_sae_acts_pre(pre)

    @torch.no_grad()
    def encode_bits(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... n_bits"]:
        """The binary code h_B in {0, 1}^(bits * d_sae)."""
        return step(self.hidden_pre(x))

    @property
    def prior(self) -> Float[Tensor, " n_bits"]:
        """Mean code seen in training (the burstiness prior); a copy, so callers cannot alias it."""
        return self.code_mean.clone()

    def _update_code_mean(self, bits: Tensor) -> None:
        batch_mean = bits.detach().reshape(-1, bits.shape[-1]).float().mean(0)
        update_running_mean(
            self.code_mean, self.code_mean_count, batch_mean, self.cfg.code_mean_decay
        )

    def fold_W_dec_norm(self) -> None:
        _refuse_decoder_norm_folding()

    def fold_and_get_W_dec_norm(self) -> Tensor:
        _refuse_decoder_norm_folding()

    def _bae_histograms(self) -> dict[str, NDArray[Any]]:
        out = {"weights/code_mean": self.code_mean.detach().cpu().numpy()}
        if self.b_enc is not None:
            out["weights/b_e"] = self.b_enc.detach().float().cpu().numpy()
        return out


# ----------------------------------------------------------------------------- inference


class BAE(_BAEMixin, SAE[BAEConfig]):
    """Inference BAE. ``encode`` returns the decoder inputs h_R (= the binary code when
    ``bits = 1``); :meth:`encode_bits` returns the full binary code."""

    b_enc: nn.Parameter | None

    @override
    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        bits = step(self.hidden_pre(x))
        return self.hook_sae_acts_post(bits_to_values(bits, self.cfg.bits))

    @classmethod
    def load_from_disk(  # type: ignore[override]
        cls, path: str | Path, device: str = "cpu", dtype: str | None = None, **kwargs: Any
    ) -> BAE:
        """Load a saved BAE, checking its cfg.json strictly (unknown or missing fields raise)."""
        cfg_path = Path(path) / SAE_CFG_FILENAME
        if not cfg_path.is_file():
            raise FileNotFoundError(
                f"No {SAE_CFG_FILENAME} in {path}: expected a folder written by "
                "save_inference_model / save_model"
            )
        validate_config_dict(json.loads(cfg_path.read_text()))
        return super().load_from_disk(path, device=device, dtype=dtype, **kwargs)  # type: ignore[return-value]

    def log_histograms(self) -> dict[str, NDArray[Any]]:
        return self._bae_histograms()


# ----------------------------------------------------------------------------- training


class BAETrainingSAE(_BAEMixin, TrainingSAE[BAETrainingSAEConfig]):
    """Training BAE: the step passes gradients through the configured surrogate."""

    b_enc: nn.Parameter | None

    @override
    def get_coefficients(self) -> dict[str, float | TrainCoefficientConfig]:
        return {
            "entropy": self.cfg.entropy_coefficient,
            "covariance": self.cfg.covariance_coefficient,
        }

    def encode_bits_with_grad(self, x: Float[Tensor, "... d_in"]) -> tuple[Tensor, Tensor]:
        """(bits, pre-activations), with surrogate gradients through the bits."""
        pre = self.hidden_pre(x)
        return step(pre, self.cfg.surrogate, self.cfg.surrogate_temperature), pre

    @override
    def encode_with_hidden_pre(self, x: Tensor) -> tuple[Tensor, Tensor]:
        bits, pre = self.encode_bits_with_grad(x)
        return self.hook_sae_acts_post(bits_to_values(bits, self.cfg.bits)), pre

    @override
    def calculate_aux_loss(
        self,
        step_input: TrainStepInput,
        feature_acts: Tensor,  # noqa: ARG002
        hidden_pre: Tensor,
        sae_out: Tensor,  # noqa: ARG002
    ) -> dict[str, Tensor]:
        bits = step(hidden_pre, self.cfg.surrogate, self.cfg.surrogate_temperature)
        return self._aux_losses(bits, step_input)[0]

    def _aux_losses(
        self, bits: Tensor, step_input: TrainStepInput
    ) -> tuple[dict[str, Tensor], Tensor]:
        flat = bits.reshape(-1, bits.shape[-1])
        entropy_bits = minibatch_entropy(flat)
        zero = entropy_bits.new_zeros(())
        if step_input.n_training_steps >= self.cfg.resolved_entropy_off_steps():
            entropy_loss = step_input.coefficients["entropy"] * entropy_bits
        else:
            entropy_loss = zero
        a_c = step_input.coefficients["covariance"]
        covariance_loss = (
            a_c * covariance_penalty(flat, self.cfg.covariance_block_size) if a_c > 0 else zero
        )
        return {"entropy_loss": entropy_loss, "covariance_loss": covariance_loss}, entropy_bits

    @override
    def training_forward_pass(self, step_input: TrainStepInput) -> TrainStepOutput:
        """Reconstruction (mean over batch and d_in) + entropy + covariance, each logged."""
        sae_in = step_input.sae_in
        bits, hidden_pre = self.encode_bits_with_grad(sae_in)
        feature_acts = self.hook_sae_acts_post(bits_to_values(bits, self.cfg.bits))
        sae_out = self.decode(feature_acts)
        aux, entropy_bits = self._aux_losses(bits, step_input)
        losses = {"reconstruction_loss": reconstruction_loss(sae_out, sae_in), **aux}
        self._update_code_mean(bits)
        flat_bits = bits.detach().reshape(-1, bits.shape[-1])
        dead_mask = step_input.dead_neuron_mask
        threshold = self.cfg.dense_threshold

        def dead_fraction() -> float:
            # SAELens' window-based mask when training under SAETrainer, else this batch.
            if dead_mask is not None:
                return dead_mask.float().mean().item()
            return (flat_bits.sum(0) == 0).float().mean().item()

        return TrainStepOutput(
            sae_in=sae_in,
            sae_out=sae_out,
            feature_acts=feature_acts,
            hidden_pre=hidden_pre,
            loss=sum(losses.values()),  # type: ignore[arg-type]
            losses=losses,
            metrics={
                "batch_entropy_bits": entropy_bits.detach(),
                "dead_fraction": dead_fraction,
                "dense_fraction": lambda: (flat_bits.mean(0) > threshold).float().mean().item(),
            },
        )

    def log_histograms(self) -> dict[str, NDArray[Any]]:
        return {**super().log_histograms(), **self._bae_histograms()}


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
