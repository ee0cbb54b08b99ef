"""The Binary Autoencoder (BAE) as a SAELens architecture: configs, inference and training classes.

A BAE encodes a hidden state h0 (dim d_in) into a binary code
``h_B = step(h0 @ W_enc + b_enc)`` in {0, 1}^n_bits, with ``step(x) = 1`` for ``x >= 0``,
and decodes ``h_R @ W_dec + b_dec`` where ``h_R`` groups every ``bits_per_feature`` code bits into
one feature value (``h_R = h_B`` for ``bits_per_feature = 1``). Training minimises

    mse_loss + (a_e * H(mean code of the minibatch) + a_c * sum_{i != j} |cov(h_B)_ij|) / k^2

(``mse_loss`` SAELens', in the inputs' units; k the input frame's factor, 1 without one) with
gradients through the step from a sigmoid surrogate derivative (``saes.binary``). The training
step is SAELens' own: the penalties come through ``calculate_aux_loss`` (``saes.objective``),
around it the input frame and the running mean code (the burstiness prior). SAELens' parameter
names and hook points are kept, so its evals, histograms and splicing work unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from numpy.typing import NDArray
from sae_lens.saes.sae import (
    SAE,
    SAEConfig,
    TrainCoefficientConfig,
    TrainingSAE,
    TrainingSAEConfig,
    TrainStepInput,
    TrainStepOutput,
)
from torch import Tensor, nn
from typing_extensions import override

from sae_lens_bae.checks import is_count, refuse_fields
from sae_lens_bae.outliers import NORM_RATIO, register_screen_count, screen_step
from sae_lens_bae.saes.bae_step import (
    check_frame_set,
    encoder_inputs,
    phase_coefficients,
    pre_activations,
    reconstruct,
    record_code,
    step_penalties,
)
from sae_lens_bae.saes.binary import DENSE_FREQUENCY, bits_to_values, step
from sae_lens_bae.saes.code_mean import RUNNING_MEAN_BUFFERS, apply_keeping_dtypes
from sae_lens_bae.saes.input_frame import (
    INPUT_SCALE_BUFFER,
    INPUT_SHIFT_BUFFER,
    InputFrameFolds,
    check_activations,
    check_scale,
    fold_frame,
    module_frame,
    register_input_frame,
)
from sae_lens_bae.saes.loading import StrictLoading
from sae_lens_bae.saes.minibatch import LOCAL_BATCH
from sae_lens_bae.saes.objective import binary_entropy, covariance_penalty, frame_weight

__all__ = [
    "ARCHITECTURE",
    "BAE",
    "BAEConfig",
    "BAETrainingSAE",
    "BAETrainingSAEConfig",
]

ARCHITECTURE = "bae"


# ----------------------------------------------------------------------------- configs


def _check_inference_fields(cfg: BAEConfig | BAETrainingSAEConfig) -> None:
    refuse_fields(
        cfg,
        {
            "d_in": (is_count(cfg.d_in, 1), "a positive integer"),
            "d_sae": (is_count(cfg.d_sae, 1), "a positive integer"),
            "bits_per_feature": (is_count(cfg.bits_per_feature, 1), "an integer >= 1"),
            "reshape_activations": (cfg.reshape_activations == "none", "flatten hook_z upstream"),
        },
    )


def _above_one(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 1


@dataclass
class BAEConfig(StrictLoading, SAEConfig):
    """Inference configuration of a BAE (``d_in``, ``d_sae``: SAELens'). Read from a cfg.json
    strictly (``saes.loading.StrictLoading``) by the BAE's loaders (``BAE.load_from_disk``,
    ``load_sae``)."""

    bits_per_feature: int = 1
    """Code bits per feature (more-bit decoding): the encoder emits ``n_bits =
    bits_per_feature * d_sae`` bits."""
    apply_b_dec_to_input: bool = False
    """SAELens' input centring; off, as in the paper."""

    @override
    @classmethod
    def architecture(cls) -> str:
        return ARCHITECTURE

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_inference_fields(self)

    @property
    def n_bits(self) -> int:
        """Width of the binary code: ``bits_per_feature * d_sae``."""
        return self.bits_per_feature * self.d_sae


@dataclass
class BAETrainingSAEConfig(StrictLoading, TrainingSAEConfig):
    """Training configuration of a BAE: the inference fields of :class:`BAEConfig`, the objective,
    and its phases in training steps, as SAELens gives its own (``lr_warm_up_steps``). The
    objective's defaults are the ``default`` recipe's (``saes.bae_recipes``, which says how it was
    chosen); its phase, entropy off for the first quarter of training, is a fraction that
    ``bae_config(..., training_steps=N)`` resolves into ``entropy_off_steps``."""

    bits_per_feature: int = 1
    """Code bits per feature (more-bit decoding): the encoder emits ``n_bits =
    bits_per_feature * d_sae`` bits."""
    apply_b_dec_to_input: bool = False
    """SAELens' input centring; off, as in the paper."""
    input_variance: float | None = None
    """Variance per input dimension an input frame ``k (x + t)`` brings the inputs to while
    training (the ``entropy`` recipe's; ``saes.input_frame``), fixed on the training set before
    the first step by ``train_sae`` or a stack, undone on the outputs and folded into the saved
    BAE's weights; None: inputs as given, at the scale the coefficients assume (mean norm
    sqrt(d_in)), as SAELens' runners need."""
    surrogate_temperature: float = 1.0
    """T of the step's surrogate derivative d/dx sigmoid(x / T) (1.0 is the paper's
    definition)."""
    entropy_coefficient: float = 5e-7
    """a_e, weight of the minibatch entropy in bits against the squared error per element of
    states at mean norm sqrt(d_in) (SAELens' ``expected_average_only_in``; with an input frame,
    in its units), at ``coefficient_width``."""
    covariance_coefficient: float = 8e-6
    """a_c, weight of the summed |off-diagonal covariance|, as ``entropy_coefficient``."""
    coefficient_width: int | None = 2048
    """d_in the coefficients are given at: at d_in they weigh a * coefficient_width / d_in
    against the squared error per element (the penalties are sums over bits). None: as given."""
    entropy_off_steps: int = 0
    """First training steps with the entropy term off (0: on from the first step)."""
    covariance_off_from_step: int | None = None
    """First training step without the covariance term; None: on to the end."""
    extreme_norm_ratio: float | None = NORM_RATIO
    """A training state whose norm is above this many times its minibatch's median norm is
    replaced by the median-norm state (``sae_lens_bae.outliers``); None keeps every state."""

    @override
    @classmethod
    def architecture(cls) -> str:
        return ARCHITECTURE

    def __post_init__(self) -> None:
        _check_inference_fields(self)
        target = self.input_variance
        positive = not isinstance(target, bool) and target is not None and target > 0
        width, ratio = self.coefficient_width, self.extreme_norm_ratio
        covariance_off = self.covariance_off_from_step
        refuse_fields(
            self,
            {
                "input_variance": (target is None or positive, "a positive variance or None"),
                "normalize_activations": (
                    target is None or self.normalize_activations == "none",
                    "none with an input frame, which scales the inputs itself (input_variance="
                    "None reads them as given)",
                ),
                "surrogate_temperature": (self.surrogate_temperature > 0, "above 0"),
                "entropy_coefficient": (self.entropy_coefficient >= 0, "at least 0"),
                "covariance_coefficient": (self.covariance_coefficient >= 0, "at least 0"),
                "coefficient_width": (width is None or is_count(width, 1), "a width or None"),
                "extreme_norm_ratio": (ratio is None or _above_one(ratio), "above 1 or None"),
                "entropy_off_steps": (is_count(self.entropy_off_steps, 0), "steps, at least 0"),
                "covariance_off_from_step": (
                    covariance_off is None or is_count(covariance_off, 0),
                    "a step, at least 0, or None",
                ),
            },
        )
        super().__post_init__()

    @property
    def n_bits(self) -> int:
        """Width of the binary code: ``bits_per_feature * d_sae``."""
        return self.bits_per_feature * self.d_sae

    def __str__(self) -> str:
        return f"{self!r}, training at d_in {self.d_in} with {self.coefficients()}"

    def coefficients(self) -> dict[str, float]:
        """a_e and a_c against ``mse_loss`` in the frame's units (the fields' weights times d_in)
        by SAELens' names; the step divides them by k^2 (``mse_loss`` is in the inputs' units)."""
        scale = float(self.d_in if self.coefficient_width is None else self.coefficient_width)
        return {
            "entropy": self.entropy_coefficient * scale,
            "covariance": self.covariance_coefficient * scale,
        }

    def entropy_on(self, step: int) -> bool:
        """Whether the entropy term counts at training step ``step`` (0-based)."""
        return step >= self.entropy_off_steps

    def covariance_on(self, step: int) -> bool:
        """Whether the covariance term counts at training step ``step`` (0-based)."""
        return self.covariance_off_from_step is None or step < self.covariance_off_from_step


# ----------------------------------------------------------------------------- the model


class _BAEMixin(InputFrameFolds):
    """Weights, encoding, decoding and folds of the inference and the training BAE (first in
    their bases, so ``super()`` reaches SAELens' classes)."""

    cfg: BAEConfig | BAETrainingSAEConfig
    W_enc: nn.Parameter
    b_enc: nn.Parameter
    W_dec: nn.Parameter
    b_dec: nn.Parameter
    code_mean: Tensor
    hook_sae_acts_pre: Callable[[Tensor], Tensor]
    hook_sae_acts_post: Callable[[Tensor], Tensor]
    hook_sae_recons: Callable[[Tensor], Tensor]
    hook_sae_input: Callable[[Tensor], Tensor]
    run_time_activation_norm_fn_in: Callable[[Tensor], Tensor]
    run_time_activation_norm_fn_out: Callable[[Tensor], Tensor]

    def initialize_weights(self) -> None:
        """SAELens' init, an encoder of width ``n_bits`` with a zero bias, and the mean code (the
        burstiness prior, fp32)."""
        super().initialize_weights()  # type: ignore[misc]  # SAE's or TrainingSAE's
        cfg, device = self.cfg, self.W_dec.device
        if cfg.bits_per_feature > 1:  # bits of one feature need distinct directions
            # bit 0 of feature k keeps SAELens' init (tied to decoder row k); bits 1.. get random
            # directions of the same norm, so every bit starts at one scale
            tied = self.W_enc.detach()  # [d_in, d_sae]
            w_enc = torch.empty(
                cfg.d_in, cfg.d_sae, cfg.bits_per_feature, dtype=tied.dtype, device=device
            )
            nn.init.kaiming_uniform_(w_enc)
            w_enc = w_enc / w_enc.norm(dim=0, keepdim=True) * tied.norm(dim=0)[:, None]
            w_enc[:, :, 0] = tied
            self.W_enc = nn.Parameter(w_enc.reshape(cfg.d_in, cfg.n_bits).contiguous())
        self.b_enc = nn.Parameter(torch.zeros(cfg.n_bits, dtype=self.W_dec.dtype, device=device))
        self.register_buffer("code_mean", torch.zeros(cfg.n_bits, device=device))  # type: ignore[attr-defined]

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Any:
        """``.to(dtype)``/``.half()`` cast parameters only: running means and the frame keep fp32
        (in bf16 the update count stalls at 256)."""
        apply_keeping_dtypes(
            lambda: super(_BAEMixin, self)._apply(fn, recurse),  # type: ignore[misc]
            self._buffers,  # type: ignore[attr-defined]
            (*RUNNING_MEAN_BUFFERS, INPUT_SCALE_BUFFER, INPUT_SHIFT_BUFFER),
        )
        return self

    def read_inputs(self, sae_in: Tensor, hooked: bool = True) -> Tensor:
        """SAELens' input processing (dtype, reshape, input hook unless not ``hooked``, run-time
        normalisation), after checking the inputs' width and finiteness."""
        training = isinstance(self, TrainingSAE)
        check_activations(sae_in, self.cfg.d_in, self.cfg.metadata.hook_name, on_device=training)
        dtype = torch.promote_types(self.dtype, self.b_dec.dtype)  # type: ignore[attr-defined]
        sae_in = self.reshape_fn_in(sae_in.to(dtype))  # type: ignore[attr-defined]
        return self.run_time_activation_norm_fn_in(
            self.hook_sae_input(sae_in) if hooked else sae_in
        )

    def encoder_inputs(self, x: Tensor) -> Tensor:
        """What the encoder reads (``bae_step.encoder_inputs``): ``k (x + t)`` (with a frame),
        less ``b_dec`` when centring."""
        input_frame = module_frame(self)  # type: ignore[arg-type]
        return encoder_inputs(x, input_frame, self.b_dec, self.cfg.apply_b_dec_to_input)

    def reconstruct(self, values: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_in"]:
        """``h_R W_dec + b_dec`` (one addmm), out of the frame (``bae_step.reconstruct``)."""
        return reconstruct(values, self.W_dec, self.b_dec, module_frame(self))  # type: ignore[arg-type]

    def process_sae_in(self, sae_in: Tensor) -> Tensor:
        """SAELens' input processing, then :meth:`encoder_inputs`."""
        return self.encoder_inputs(self.read_inputs(sae_in))

    def pre_activations(self, inputs: Tensor) -> Tensor:
        """``inputs W_enc + b_enc`` of :meth:`encoder_inputs` (one addmm)."""
        return pre_activations(inputs, self.W_enc, self.b_enc)

    def hidden_pre(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... n_bits"]:
        """Encoder pre-activations of every code bit (their sign is the code)."""
        return self.hook_sae_acts_pre(self.pre_activations(self.process_sae_in(x)))

    def decode(self, feature_acts: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_in"]:
        """:meth:`reconstruct` through SAELens' output hooks."""
        sae_out = self.reconstruct(feature_acts)
        return self.run_time_activation_norm_fn_out(self.hook_sae_recons(sae_out))

    @torch.no_grad()
    def encode_bits(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... n_bits"]:
        """The binary code h_B in {0, 1}^n_bits (``n_bits = bits_per_feature * d_sae``)."""
        return step(self.hidden_pre(x))

    @property
    def prior(self) -> Float[Tensor, " n_bits"]:
        """Mean code seen in training (the burstiness prior); a copy."""
        return self.code_mean.clone()

    def _bae_histograms(self) -> dict[str, NDArray[Any]]:
        return {
            "weights/code_mean": self.code_mean.detach().cpu().numpy(),
            "weights/b_e": self.b_enc.detach().float().cpu().numpy(),
        }


def _to_inference_state(state_dict: dict[str, Any], apply_b_dec_to_input: bool) -> None:
    """A training BAE's state dict made the inference BAE's, in place: its input frame folded
    into the weights (``saes.input_frame.fold_frame``, exact up to rounding), the frame buffers
    and the running mean's count dropped. What saving an inference BAE and reading a training
    checkpoint as one both do."""
    scale = state_dict.pop(INPUT_SCALE_BUFFER, None)
    shift = state_dict.pop(INPUT_SHIFT_BUFFER, None)
    state_dict.pop("code_mean_count", None)
    if scale is not None and shift is not None:
        state_dict.update(fold_frame(state_dict, (scale, shift), apply_b_dec_to_input))


class BAE(_BAEMixin, SAE[BAEConfig]):
    """Inference BAE. ``encode`` returns the decoder inputs h_R (the binary code when
    ``bits_per_feature = 1``); :meth:`encode_bits` the full binary code."""

    @override
    @classmethod
    def get_sae_config_class_for_architecture(cls, architecture: str) -> type[SAEConfig]:
        """:class:`BAEConfig`, whose ``from_dict`` reads a cfg.json strictly, for a BAE's: what
        ``BAE.load_from_disk``, ``BAE.from_dict`` and ``BAE.from_pretrained`` build. SAELens' own
        ``SAE`` builds every architecture's config with its lenient ``SAEConfig.from_dict``."""
        if architecture == ARCHITECTURE:
            return BAEConfig
        return super().get_sae_config_class_for_architecture(architecture)

    @override
    def process_state_dict_for_loading(self, state_dict: dict[str, Any]) -> None:
        """A training checkpoint's state read as the inference BAE saves it
        (:func:`_to_inference_state`)."""
        _to_inference_state(state_dict, self.cfg.apply_b_dec_to_input)

    @override
    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        return self.hook_sae_acts_post(
            bits_to_values(step(self.hidden_pre(x)), self.cfg.bits_per_feature)
        )

    def log_histograms(self) -> dict[str, NDArray[Any]]:
        return self._bae_histograms()


class BAETrainingSAE(_BAEMixin, TrainingSAE[BAETrainingSAEConfig]):
    """Training BAE. Its step is SAELens' ``training_forward_pass`` (``mse_loss``, then the
    code's penalties through :meth:`calculate_aux_loss`), after the input frame, before the
    running mean code of its output.
    Seams: ``batch`` (this process, unless ``sae_lens_bae.parallel`` sets its ranks' global
    minibatch) and ``covariance_penalty`` (the plain maths; the package plugs in the kernels')."""

    batch: Any = LOCAL_BATCH
    covariance_penalty = staticmethod(covariance_penalty)  # the plain maths (see the seams)
    _inputs_checked = False  # whether the first step checked the frame or the inputs' scale

    code_mean_count: Tensor

    def initialize_weights(self) -> None:
        """The BAE's weights and prior, then what only training needs: the running mean code's
        count, the unset input frame when configured, and the count of the rows its steps set
        aside as extreme. The saved inference BAE has none of them (its weights are in input
        units: :meth:`process_state_dict_for_saving_inference`)."""
        super().initialize_weights()
        device = self.W_dec.device
        self.register_buffer("code_mean_count", torch.zeros((), device=device))
        register_input_frame(self, self.cfg.input_variance)
        register_screen_count(self, device)

    @override
    def process_state_dict_for_saving_inference(self, state_dict: dict[str, Any]) -> None:
        """The inference BAE's state (:func:`_to_inference_state`), so the saved BAE is
        ``step(x W_enc + b_enc) W_dec + b_dec`` on raw inputs with its prior ``code_mean``."""
        super().process_state_dict_for_saving_inference(state_dict)
        _to_inference_state(state_dict, self.cfg.apply_b_dec_to_input)

    @override
    def get_coefficients(self) -> dict[str, float | TrainCoefficientConfig]:
        """None for SAELens' schedulers, as a TopK SAE has none: a_e and a_c are the config's,
        each off in its phase (``entropy_off_steps``, ``covariance_off_from_step``), which a
        linear warm-up cannot give. The step logs the weights it applied
        (``metrics/<name>_coefficient_applied``)."""
        return {}

    @override
    def encode_with_hidden_pre(self, x: Tensor) -> tuple[Tensor, Tensor]:
        pre = self.hidden_pre(x)
        bits = step(pre, self.cfg.surrogate_temperature)
        return self.hook_sae_acts_post(bits_to_values(bits, self.cfg.bits_per_feature)), pre

    @override
    def calculate_aux_loss(
        self, step_input: TrainStepInput, feature_acts: Tensor, hidden_pre: Tensor, sae_out: Tensor
    ) -> dict[str, Tensor]:
        """The entropy and covariance terms (``bae_step.step_penalties``) of the step's code,
        each off in its phase (the config's ``entropy_on``/``covariance_on``), divided by the
        frame's k^2."""
        del sae_out  # SAELens' signature; the penalties read the code only
        if self.cfg.bits_per_feature == 1:  # the code itself, with its surrogate gradient
            bits = feature_acts
        else:
            bits = step(hidden_pre, self.cfg.surrogate_temperature)
        return step_penalties(
            self.cfg,
            bits.reshape(-1, bits.shape[-1]),
            step_input.n_training_steps,
            module_frame(self),  # type: ignore[arg-type]
            batch=self.batch,
            covariance=self.covariance_penalty,
        )

    @override
    def training_forward_pass(self, step_input: TrainStepInput) -> TrainStepOutput:
        """SAELens' step on the screened minibatch; then the code's record."""
        n = step_input.n_training_steps
        step_input = screen_step(self, step_input)  # extreme states (sae_lens_bae.outliers)
        self._check_inputs_once(step_input.sae_in)
        output = super().training_forward_pass(step_input)
        code = output.feature_acts if self.cfg.bits_per_feature == 1 else (output.hidden_pre >= 0)
        mean = record_code(
            self.code_mean, self.code_mean_count, code.reshape(-1, code.shape[-1]), self.batch
        )

        # counts over this (global) minibatch, named for what they count: SAELens' own
        # sparsity/dead_features counts latents that never fired over its window
        rare = lambda: torch.minimum(mean, 1.0 - mean)  # noqa: E731  (each bit's, when logged)

        def applied(name: str) -> float:
            """The weight a penalty was applied with (:meth:`calculate_aux_loss`): the config's
            coefficient as its phase has it, times the frame's 1/k^2."""
            weight = frame_weight(module_frame(self))  # type: ignore[arg-type]
            coefficient = phase_coefficients(self.cfg, n)[name]
            return coefficient * (1.0 if weight is None else weight.item())

        output.metrics.update(
            batch_entropy_bits=lambda: binary_entropy(mean).item(),
            constant_bits_in_minibatch_fraction=lambda: (rare() == 0).float().mean().item(),
            dense_bits_in_minibatch_fraction=lambda: (
                (rare() > DENSE_FREQUENCY).float().mean().item()
            ),
            entropy_coefficient_applied=lambda: applied("entropy"),
            covariance_coefficient_applied=lambda: applied("covariance"),
        )
        return output

    @torch.no_grad()
    def _check_inputs_once(self, sae_in: Tensor) -> None:
        """On the first step taken: an input frame must be set (``bae_step.check_frame_set``);
        without one, the scale of the minibatch (read without the input hook: the step calls it)
        is checked against the one the coefficients assume. A compiled step leaves it out (a host
        read in a graph)."""
        if self._inputs_checked or torch.compiler.is_compiling():
            return
        input_frame = module_frame(self)  # type: ignore[arg-type]
        check_frame_set(input_frame)
        if input_frame is None:
            check_scale(self.read_inputs(sae_in, hooked=False).reshape(-1, self.cfg.d_in))
        self._inputs_checked = True

    def log_histograms(self) -> dict[str, NDArray[Any]]:
        return {**super().log_histograms(), **self._bae_histograms()}
