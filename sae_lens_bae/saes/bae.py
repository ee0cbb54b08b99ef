"""The Binary Autoencoder (BAE) as a SAELens architecture: its inference and training classes.

A BAE encodes a hidden state h0 (dim d_in) into a binary code
``h_B = step(h0 @ W_enc + b_enc)`` in {0, 1}^(bits * d_sae), with ``step(x) = 1`` for ``x >= 0``,
and decodes ``h_R @ W_dec + b_dec`` where ``h_R`` groups every ``bits`` code bits into one real
value (``h_R = h_B`` for ``bits = 1``). Training minimises

    reconstruction + a_e * H(mean code of the minibatch) + a_c * sum_{i != j} |cov(h_B)_ij|

and passes gradients through the step with a surrogate derivative (``saes.binary.SURROGATES``).
Configs: ``saes.bae_config``; the phases of training: ``saes.schedule``; the input frame:
``saes.input_scale``; folds: ``saes.bae_folds``. SAELens' parameter names and hook points are
kept, so its evals, histograms and scaling folds work unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from numpy.typing import NDArray
from sae_lens.saes.sae import (
    SAE,
    TrainCoefficientConfig,
    TrainingSAE,
    TrainStepInput,
    TrainStepOutput,
)
from torch import Tensor, nn
from typing_extensions import override

from sae_lens_bae.global_batch import GlobalBatch
from sae_lens_bae.losses import LOSS_TERMS
from sae_lens_bae.saes import binary
from sae_lens_bae.saes.bae_config import (
    ARCHITECTURE,
    BAE_RECIPES,
    DEFAULT_BATCH_SIZE,
    DEFAULT_LR,
    BAEConfig,
    BAETrainingSAEConfig,
    bae_config,
    read_cfg_json,
    validate_config_dict,
)
from sae_lens_bae.saes.bae_folds import BAEFoldsMixin
from sae_lens_bae.saes.bae_input import check_activations
from sae_lens_bae.saes.bae_step import objective_terms, stack_of, train_step
from sae_lens_bae.saes.binary import bits_to_values, step
from sae_lens_bae.saes.input_scale import (
    INPUT_SCALE_BUFFER,
    INPUT_SHIFT_BUFFER,
    frame,
    module_frame,
    register_input_scale,
    unframe_output,
)
from sae_lens_bae.saes.schedule import Schedule

__all__ = [
    "ARCHITECTURE",
    "BAE",
    "BAE_RECIPES",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_LR",
    "BAEConfig",
    "BAETrainingSAE",
    "BAETrainingSAEConfig",
    "bae_config",
    "validate_config_dict",
]


# ----------------------------------------------------------------------------- shared pieces

DENSE_FIRING_RATE = 0.5
"""A code bit firing on more than this fraction of a minibatch is dense in the step's metrics."""

_RESAMPLING_BUFFERS = ("window_counts", "window_samples")
"""Training-only buffers of a resampling BAE: dropped from the inference model, and from a
training checkpoint read as an inference model."""


def _init_bae_parameters(sae: BAE | BAETrainingSAE) -> None:
    """Encoder of width bits * d_sae with its bias, and the running mean-code buffers."""
    cfg = sae.cfg
    if cfg.bits > 1:  # bits of one feature need distinct directions
        # bit 0 of feature k keeps SAELens' init (tied to decoder row k, scaled as configured);
        # bits 1.. get random directions of the same norm, so every C starts at one scale
        tied = sae.W_enc.detach()  # [d_in, d_sae]
        w_enc = torch.empty(cfg.d_in, cfg.d_sae, cfg.bits, dtype=sae.dtype, device=sae.device)
        nn.init.kaiming_uniform_(w_enc)
        w_enc = w_enc / w_enc.norm(dim=0, keepdim=True) * tied.norm(dim=0)[:, None]
        w_enc[:, :, 0] = tied
        sae.W_enc = nn.Parameter(w_enc.reshape(cfg.d_in, cfg.n_bits).contiguous())
    sae.b_enc = nn.Parameter(torch.zeros(cfg.n_bits, dtype=sae.dtype, device=sae.device))
    sae.register_buffer(
        "code_mean", torch.zeros(cfg.n_bits, dtype=torch.float32, device=sae.device)
    )
    sae.register_buffer("code_mean_count", torch.zeros((), dtype=torch.float32, device=sae.device))
    register_input_scale(sae, cfg.rescale_inputs_to)


class _BAEMixin(BAEFoldsMixin):
    """Weights, encoding, decoding, validation and folding shared by the inference and the
    training BAE (listed first in their bases, so ``super()`` reaches SAELens' classes)."""

    cfg: BAEConfig | BAETrainingSAEConfig
    W_enc: nn.Parameter
    b_enc: nn.Parameter
    code_mean: Tensor
    code_mean_count: Tensor
    W_dec: nn.Parameter
    b_dec: nn.Parameter
    hook_sae_acts_pre: Callable[[Tensor], Tensor]
    hook_sae_acts_post: Callable[[Tensor], Tensor]
    hook_sae_recons: Callable[[Tensor], Tensor]
    hook_sae_input: Callable[[Tensor], Tensor]
    run_time_activation_norm_fn_in: Callable[[Tensor], Tensor]
    run_time_activation_norm_fn_out: Callable[[Tensor], Tensor]

    def initialize_weights(self) -> None:
        super().initialize_weights()  # type: ignore[misc]  # SAE's or TrainingSAE's
        _init_bae_parameters(self)  # type: ignore[arg-type]

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Any:
        """``.to(dtype)``/``.half()`` cast parameters only: running means and scale keep fp32."""
        binary.apply_keeping_dtypes(
            lambda: super(_BAEMixin, self)._apply(fn, recurse),  # type: ignore[misc]
            self._buffers,  # type: ignore[attr-defined]
            (*binary.RUNNING_MEAN_BUFFERS, INPUT_SCALE_BUFFER, INPUT_SHIFT_BUFFER),
        )
        return self

    def decode(self, feature_acts: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_in"]:
        # h W_dec + b_dec as one addmm (a small BAE's GPU step costs its kernel launches)
        sae_out = F.linear(feature_acts, self.W_dec.t(), self.b_dec)
        sae_out = self.hook_sae_recons(unframe_output(self, sae_out))  # type: ignore[arg-type]
        return self.run_time_activation_norm_fn_out(sae_out)

    def read_inputs(self, sae_in: Tensor) -> Tensor:
        """SAELens' input processing (dtype, reshape, input hook, run-time normalisation): the
        inputs as the BAE reads them, before its input frame and centring."""
        check_activations(
            sae_in,
            self.cfg.d_in,
            self.cfg.metadata.hook_name,
            on_device=isinstance(self, TrainingSAE),
        )
        # the dtype SAELens' "x.to(cfg dtype) - b_dec" gives (a BAE cast with .double() keeps
        # cfg.dtype "float32"), with no kernel where it is the input's already
        dtype = torch.promote_types(self.dtype, self.b_dec.dtype)  # type: ignore[attr-defined]
        sae_in = self.reshape_fn_in(sae_in.to(dtype))  # type: ignore[attr-defined]
        return self.run_time_activation_norm_fn_in(self.hook_sae_input(sae_in))

    def process_sae_in(self, sae_in: Tensor) -> Tensor:
        """What the encoder reads: the inputs in the BAE's frame (if any: k (x + t)), less the
        decoder bias when centring."""
        x = frame(self.read_inputs(sae_in), module_frame(self))
        return x - self.b_dec if self.cfg.apply_b_dec_to_input else x

    def hidden_pre(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... n_bits"]:
        """Encoder pre-activations of every code bit (their sign is the code)."""
        pre = F.linear(self.process_sae_in(x), self.W_enc.t(), self.b_enc)  # one addmm with b_enc
        return self.hook_sae_acts_pre(pre)

    @torch.no_grad()
    def encode_bits(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... n_bits"]:
        """The binary code h_B in {0, 1}^(bits * d_sae)."""
        return step(self.hidden_pre(x))

    @property
    def prior(self) -> Float[Tensor, " n_bits"]:
        """Mean code seen in training (the burstiness prior); a copy, so callers cannot alias it."""
        return self.code_mean.clone()

    def _bae_histograms(self) -> dict[str, NDArray[Any]]:
        return {
            "weights/code_mean": self.code_mean.detach().cpu().numpy(),
            "weights/b_e": self.b_enc.detach().float().cpu().numpy(),
        }


# ----------------------------------------------------------------------------- inference


class BAE(_BAEMixin, SAE[BAEConfig]):
    """Inference BAE. ``encode`` returns the decoder inputs h_R (= the binary code when
    ``bits = 1``); :meth:`encode_bits` returns the full binary code."""

    b_enc: nn.Parameter

    @override
    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        bits = step(self.hidden_pre(x))
        return self.hook_sae_acts_post(bits_to_values(bits, self.cfg.bits))

    @classmethod
    def load_from_disk(
        cls, path: str | Path, device: str = "cpu", dtype: str | None = None, **kwargs: Any
    ) -> BAE:
        """Load a saved BAE, checking its cfg.json strictly (unknown or missing fields raise)."""
        validate_config_dict(read_cfg_json(path))
        return super().load_from_disk(path, device=device, dtype=dtype, **kwargs)

    @override
    def process_state_dict_for_loading(self, state_dict: dict[str, Any]) -> None:
        super().process_state_dict_for_loading(state_dict)
        for name in _RESAMPLING_BUFFERS:  # a training checkpoint read as an inference model
            state_dict.pop(name, None)

    def log_histograms(self) -> dict[str, NDArray[Any]]:
        return self._bae_histograms()


# ----------------------------------------------------------------------------- training


class BAETrainingSAE(_BAEMixin, TrainingSAE[BAETrainingSAEConfig]):
    """Training BAE: the step passes gradients through the configured surrogate and follows a
    :class:`Schedule` resolved once (:meth:`resolve_schedule`) from the length of training.

    ``global_batch`` (set by ``sae_lens_bae.training.distributed``) makes every step's loss the
    one of the ranks' concatenated minibatch, and its output (but ``hidden_pre``) that batch's."""

    b_enc: nn.Parameter
    global_batch: GlobalBatch | None = None
    schedule: Schedule | None = None

    @override
    def initialize_weights(self) -> None:
        super().initialize_weights()
        if self.cfg.resample_every > 0:  # which channels were constant since the last resampling
            for name in _RESAMPLING_BUFFERS:
                shape = (self.cfg.n_bits,) if name == "window_counts" else ()
                zeros = torch.zeros(shape, dtype=torch.int64, device=self.device)
                self.register_buffer(name, zeros)

    def resolve_schedule(self, total_steps: int | None = None) -> Schedule:
        """Fix the phases of training in steps, for a run of ``total_steps`` (the config's
        ``total_training_steps`` wins when set): the seam through which a trainer tells the BAE
        how long it trains, called once before the first step."""
        self.schedule = self.cfg.schedule(total_steps)
        return self.schedule

    @override
    def get_coefficients(self) -> dict[str, float | TrainCoefficientConfig]:
        """The coefficients SAELens schedules. SAELens' ``SAETrainer`` asks for them once, when
        it is built: the schedule is resolved then, so a length that is needed and unknown is
        refused before any data is read."""
        if self.schedule is None:
            self.resolve_schedule()
        return dict(self.cfg.coefficients())

    @override
    def process_state_dict_for_saving_inference(self, state_dict: dict[str, Any]) -> None:
        super().process_state_dict_for_saving_inference(state_dict)
        for name in _RESAMPLING_BUFFERS:  # training state, not part of the inference model
            state_dict.pop(name, None)

    @override
    def encode_with_hidden_pre(self, x: Tensor) -> tuple[Tensor, Tensor]:
        pre = self.hidden_pre(x)
        bits = step(pre, self.cfg.surrogate, self.cfg.surrogate_temperature)
        return self.hook_sae_acts_post(bits_to_values(bits, self.cfg.bits)), pre

    def objective(
        self, sae_in: Tensor, sae_out: Tensor, bits: Tensor, coefficients: dict[str, float]
    ) -> dict[str, Tensor]:
        """The loss terms (``saes.bae_step.objective_terms``) of a reconstruction, as at the end
        of training: every term on."""
        return objective_terms(*self._rows(sae_in, sae_out, bits), coefficients, module_frame(self))

    @staticmethod
    def _rows(sae_in: Tensor, sae_out: Tensor, bits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Inputs, reconstructions and codes as rows."""
        d_in = sae_in.shape[-1]
        return sae_in.reshape(-1, d_in), sae_out.reshape(-1, d_in), bits.reshape(-1, bits.shape[-1])

    @override
    def calculate_aux_loss(
        self,
        step_input: TrainStepInput,
        feature_acts: Tensor,  # noqa: ARG002
        hidden_pre: Tensor,
        sae_out: Tensor,
    ) -> dict[str, Tensor]:
        """Not called by this BAE's own step; SAELens' generic step gets the BAE's penalties."""
        schedule, n = self.schedule or self.resolve_schedule(), step_input.n_training_steps
        bits = step(hidden_pre, self.cfg.surrogate, self.cfg.surrogate_temperature)
        terms = objective_terms(
            *self._rows(step_input.sae_in, sae_out, bits), step_input.coefficients,
            module_frame(self),
            entropy_on=schedule.entropy_on(n), covariance_on=schedule.covariance_on(n),
        )  # fmt: skip
        return {name: terms[name] for name in LOSS_TERMS if name != "reconstruction_loss"}

    @override
    def training_forward_pass(self, step_input: TrainStepInput) -> TrainStepOutput:
        """``saes.bae_step.train_step`` on this BAE: reconstruction (mean over batch and d_in) +
        entropy + covariance, each logged; first, at the end of a resampling window, the
        constant channels are resampled."""
        sae_in = step_input.sae_in
        x = self.read_inputs(sae_in)
        x = x.reshape(-1, x.shape[-1])
        batch = self.global_batch or GlobalBatch.local()
        out = train_step(
            stack_of(self), x, self.cfg, self.schedule or self.resolve_schedule(),
            step_input.n_training_steps, coefficients=step_input.coefficients, batch=batch,
        )  # fmt: skip
        losses = dict(out.terms)
        loss, entropy_bits = losses.pop("loss"), losses.pop("batch_entropy_bits")
        batch_mean = out.mean_code
        feature_acts = self.hook_sae_acts_post(out.values)
        sae_out = self.run_time_activation_norm_fn_out(self.hook_sae_recons(out.output))
        if batch.world > 1:  # the output covers the global minibatch too (firing statistics)
            sae_in, sae_out = batch.gather(sae_in), batch.gather(sae_out.detach())
            feature_acts = bits_to_values(out.global_bits, self.cfg.bits)
        dead_mask = step_input.dead_neuron_mask

        def dead_fraction() -> float:
            # SAELens' window-based mask when training under SAETrainer, else this batch.
            if dead_mask is not None:
                return dead_mask.float().mean().item()
            return (batch_mean == 0).float().mean().item()

        return TrainStepOutput(
            sae_in=sae_in,
            sae_out=sae_out,
            feature_acts=feature_acts,
            hidden_pre=self.hook_sae_acts_pre(out.hidden_pre),
            loss=loss,
            losses=losses,
            metrics={
                "batch_entropy_bits": entropy_bits,
                "dead_fraction": dead_fraction,
                "dense_fraction": lambda: (batch_mean > DENSE_FIRING_RATE).float().mean().item(),
            },
        )

    def log_histograms(self) -> dict[str, NDArray[Any]]:
        return {**super().log_histograms(), **self._bae_histograms()}
