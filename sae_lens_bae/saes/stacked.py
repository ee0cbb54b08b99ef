"""G BAEs of one config as one module: every weight and running buffer carries a leading stack
dimension, and each BAE is initialised as ``train_sae`` initialises it with its seed. Entropy
tracing needs dozens to hundreds of small BAEs (one per layer and position) on states of the
same forward passes; stacked, they are one set of ``[G, ...]`` weights, trained through the one
BAE step (``saes.bae_step``) by ``sae_lens_bae.training.stacked``. ``unstack`` gives the G
SAELens ``BAETrainingSAE`` objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor, nn

from sae_lens_bae.global_batch import GlobalBatch
from sae_lens_bae.saes.bae import BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.saes.bae_step import affine, encoder_inputs, stack_of, train_step
from sae_lens_bae.saes.binary import RUNNING_MEAN_BUFFERS, apply_keeping_dtypes, bits_to_values
from sae_lens_bae.saes.input_scale import (
    INPUT_SCALE_BUFFER,
    INPUT_SHIFT_BUFFER,
    frame,
    register_input_scale,
    unframe,
)
from sae_lens_bae.saes.schedule import Schedule

__all__ = ["StackedBAE"]

_PARAMS = ("W_enc", "b_enc", "W_dec", "b_dec")


class StackedBAE(nn.Module):
    """G BAEs with one config, stacked along a leading dimension of every weight, each
    initialised as its seed's, or from ``init`` (BAEs of ``cfg``'s shape, one per seed).
    ``global_batch``: the data-parallel group whose concatenated minibatches every step trains
    on, as ``BAETrainingSAE.global_batch``."""

    global_batch: GlobalBatch | None = None

    def __init__(
        self,
        cfg: BAETrainingSAEConfig,
        seeds: Sequence[int],
        init: Sequence[BAETrainingSAE] | None = None,
    ) -> None:
        super().__init__()
        if cfg.normalize_activations != "none":
            raise ValueError(
                "StackedBAE trains on activations as given; normalise them beforehand "
                f"(got normalize_activations={cfg.normalize_activations!r})"
            )
        self.cfg = cfg
        self.schedule: Schedule | None = None  # resolved by the trainer, else on the first step
        members = [] if init is None else list(init)
        if init is not None and len(members) != len(seeds):
            raise ValueError(f"{len(seeds)} seeds but {len(members)} BAEs to start from")
        for seed in seeds if init is None else ():  # as train_sae(..., seed=seed) initialises
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                members.append(BAETrainingSAE(cfg))
        for name in _PARAMS:
            stacked = torch.stack([getattr(m, name).detach() for m in members])
            setattr(self, name, nn.Parameter(stacked))
        self.register_buffer("code_mean", torch.stack([m.code_mean for m in members]))
        self.register_buffer("code_mean_count", torch.zeros(()))
        self.n_models = len(members)
        register_input_scale(self, cfg.rescale_inputs_to, stack=len(members))
        if cfg.rescale_inputs_to is not None:  # a member's own frame, if it has one set
            self.input_scale.copy_(torch.stack([m.input_scale for m in members]))
            self.input_shift.copy_(torch.stack([m.input_shift for m in members]))
        if cfg.resample_every > 0:  # per BAE, as BAETrainingSAE keeps them
            self.register_buffer(
                "window_counts", torch.zeros(len(members), cfg.n_bits, dtype=torch.int64)
            )
            self.register_buffer("window_samples", torch.zeros((), dtype=torch.int64))

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> StackedBAE:
        """As ``BAETrainingSAE``: a cast leaves the running mean codes and the frame in fp32."""
        apply_keeping_dtypes(
            lambda: super(StackedBAE, self)._apply(fn, recurse),
            self._buffers,
            (*RUNNING_MEAN_BUFFERS, INPUT_SCALE_BUFFER, INPUT_SHIFT_BUFFER),
        )
        return self

    def _check_shape(self, x: Tensor, members: Tensor | None) -> Tensor:
        n = self.n_models if members is None else len(members)
        if x.ndim != 3 or x.shape[0] != n or x.shape[-1] != self.cfg.d_in:
            raise ValueError(
                f"Expected activations of shape [{n}, batch, {self.cfg.d_in}], got {tuple(x.shape)}"
            )
        return x.to(self.W_enc.dtype)

    def hidden_pre(
        self, x: Float[Tensor, "G batch d_in"], members: Tensor | None = None
    ) -> Float[Tensor, "G batch n_bits"]:
        """Pre-activations of every BAE (or of the stack rows ``members``) on its own inputs."""
        rows = stack_of(self).rows(members)
        x = self._check_shape(x, members)
        return affine(rows.b_enc, encoder_inputs(rows, frame(x, rows.frame), self.cfg), rows.W_enc)

    def decode(
        self, bits: Float[Tensor, "G batch n_bits"], members: Tensor | None = None
    ) -> Float[Tensor, "G batch d_in"]:
        """Decode each BAE's bits (``members``: the stack rows they belong to; default all),
        in the inputs' units."""
        rows = stack_of(self).rows(members)
        return unframe(
            affine(rows.b_dec, bits_to_values(bits, self.cfg.bits), rows.W_dec), rows.frame
        )

    def losses(
        self,
        x: Float[Tensor, "G batch d_in"],
        n_training_steps: int,
        members: Tensor | None = None,
        covariance_off: Sequence[bool] | None = None,
        resample: bool = True,
    ) -> dict[str, Tensor]:
        """Per-BAE loss terms of ``bae_objective`` (each of shape [G]) after one
        ``saes.bae_step.train_step`` (which resamples constant channels and updates the running
        mean codes). ``members``: train only these stack rows (``x`` holds their minibatches):
        the others cost nothing and get no gradient. ``covariance_off``: per row of ``x``,
        whether that BAE trains without the covariance term (its final phase after it
        converged). ``resample``: False on a second step at the same ``n_training_steps`` (a
        held schedule), which must not resample again."""
        if self.schedule is None:
            self.schedule = self.cfg.schedule()
        out = train_step(
            stack_of(self), self._check_shape(x, members), self.cfg, self.schedule,
            n_training_steps, batch=self.global_batch, members=members,
            covariance_off=covariance_off, resample=resample,
        )  # fmt: skip
        return out.terms

    @torch.no_grad()
    def clip_grad_norms_(self, max_norm: float = 1.0) -> Tensor:
        """Clip each BAE's gradient to ``max_norm`` separately (as SAETrainer clips one BAE)."""
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        norms = torch.stack([g.flatten(1).pow(2).sum(1) for g in grads]).sum(0).sqrt()
        scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale.view(-1, *([1] * (g.ndim - 1))))
        return norms

    def unstack(self) -> list[BAETrainingSAE]:
        """The G BAEs as ordinary (SAELens) ``BAETrainingSAE`` objects."""
        members = []
        for g in range(self.n_models):
            sae = BAETrainingSAE(self.cfg)
            state = {name: getattr(self, name)[g] for name in _PARAMS}
            state["code_mean"] = self.code_mean[g]
            state["code_mean_count"] = self.code_mean_count
            if self.cfg.rescale_inputs_to is not None:
                state[INPUT_SCALE_BUFFER] = self.input_scale[g]
                state[INPUT_SHIFT_BUFFER] = self.input_shift[g]
            if self.cfg.resample_every > 0:
                state["window_counts"] = self.window_counts[g]
                state["window_samples"] = self.window_samples
            sae.load_state_dict(state)
            members.append(sae)
        return members
