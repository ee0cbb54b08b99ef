"""G BAEs of one config as one module: every weight and running buffer carries a leading stack
dimension, and each BAE is initialised as ``train_sae`` initialises it with its seed. Entropy
tracing needs dozens to hundreds of small BAEs (one per layer and position) on states of the
same forward passes; stacked, they are one set of ``[G, ...]`` weights, trained by
``sae_lens_bae.training.stacked``. ``unstack`` gives the G SAELens ``BAETrainingSAE`` objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor, nn

from sae_lens_bae.losses import bae_objective
from sae_lens_bae.saes.bae import BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.saes.binary import (
    RUNNING_MEAN_BUFFERS,
    apply_keeping_dtypes,
    bits_to_values,
    record_codes,
    step,
)
from sae_lens_bae.saes.resampling import resample_members
from sae_lens_bae.saes.schedule import Schedule

__all__ = ["StackedBAE"]

_PARAMS = ("W_enc", "b_enc", "W_dec", "b_dec")


class StackedBAE(nn.Module):
    """G BAEs with one config, stacked along a leading dimension of every weight, each
    initialised as its seed's, or from ``init`` (BAEs of ``cfg``'s shape, one per seed)."""

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
        if cfg.rescale_inputs_to is not None:
            raise ValueError(
                "StackedBAE trains on activations as given; scale them beforehand "
                "(entropy.normalise_scale) and leave rescale_inputs_to=None "
                f"(got {cfg.rescale_inputs_to!r})"
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
        if cfg.resample_every > 0:  # per BAE, as BAETrainingSAE keeps them
            self.register_buffer(
                "window_counts", torch.zeros(len(members), cfg.n_bits, dtype=torch.int64)
            )
            self.register_buffer("window_samples", torch.zeros((), dtype=torch.int64))

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> StackedBAE:
        """As ``BAETrainingSAE``: a cast leaves the running mean codes in fp32."""
        apply_keeping_dtypes(
            lambda: super(StackedBAE, self)._apply(fn, recurse), self._buffers, RUNNING_MEAN_BUFFERS
        )
        return self

    def _weight(self, name: str, members: Tensor | None) -> Tensor:
        """A stacked weight, or its rows for ``members`` only (gradients flow to those rows)."""
        weight = getattr(self, name)
        return weight if members is None else weight[members]

    def decode(
        self, bits: Float[Tensor, "G batch n_bits"], members: Tensor | None = None
    ) -> Float[Tensor, "G batch d_in"]:
        """Decode each BAE's bits (``members``: the stack rows they belong to; default all)."""
        values = bits_to_values(bits, self.cfg.bits)
        b_dec = self._weight("b_dec", members)
        return torch.baddbmm(b_dec.unsqueeze(1), values, self._weight("W_dec", members))

    @torch.no_grad()
    def resample(
        self, x: Float[Tensor, "G batch d_in"], members: Tensor | None = None
    ) -> list[int]:
        """``BAETrainingSAE.resample`` for every BAE of the stack (or of ``members``), each on its
        own minibatch."""
        x = x.to(self.W_enc.dtype)
        residuals = x - self.decode(step(self.hidden_pre(x, members)), members)
        b_dec = self._weight("b_dec", members)
        inputs = x - b_dec.unsqueeze(1) if self.cfg.apply_b_dec_to_input else x
        rows = range(self.n_models) if members is None else members.tolist()
        # a converged BAE keeps the counts it stopped with: only the members' rows restart
        weights = (self.W_enc.data, self.b_enc.data, self.W_dec.data)
        return resample_members(
            *weights, inputs, residuals, self.window_counts, self.window_samples, self.code_mean,
            members=rows, bits_per_feature=self.cfg.bits,
        )  # fmt: skip

    def hidden_pre(
        self, x: Float[Tensor, "G batch d_in"], members: Tensor | None = None
    ) -> Float[Tensor, "G batch n_bits"]:
        """Pre-activations of every BAE (or of the stack rows ``members``) on its own inputs."""
        n = self.n_models if members is None else len(members)
        if x.shape[0] != n or x.shape[-1] != self.cfg.d_in:
            raise ValueError(
                f"Expected activations of shape [{n}, batch, {self.cfg.d_in}], got {tuple(x.shape)}"
            )
        x = x.to(self.W_enc.dtype)
        if self.cfg.apply_b_dec_to_input:
            x = x - self._weight("b_dec", members).unsqueeze(1)
        w_enc = self._weight("W_enc", members)
        return torch.baddbmm(self._weight("b_enc", members).unsqueeze(1), x, w_enc)  # one kernel

    def losses(
        self,
        x: Float[Tensor, "G batch d_in"],
        n_training_steps: int,
        members: Tensor | None = None,
        covariance_off: Sequence[bool] | None = None,
        resample: bool = True,
    ) -> dict[str, Tensor]:
        """Per-BAE loss terms of ``bae_objective`` (each of shape [G]); resamples constant
        channels and updates the running mean codes, as one BAE's training step does.
        ``members``: train only these stack rows (``x`` holds their minibatches): the others
        cost nothing and get no gradient. ``covariance_off``: per row of ``x``, whether that
        BAE trains without the covariance term (its final phase after it converged).
        ``resample``: False on a second step at the same ``n_training_steps`` (a held schedule),
        which must not resample again."""
        cfg = self.cfg
        if self.schedule is None:
            self.schedule = cfg.schedule()
        schedule = self.schedule
        if resample and schedule.resamples_before(n_training_steps):
            self.resample(x, members)
        bits = step(self.hidden_pre(x, members), cfg.surrogate, cfg.surrogate_temperature)
        out = self.decode(bits, members)
        coefficients = cfg.coefficients()
        covariance = coefficients["covariance"] * schedule.covariance_on(n_training_steps)
        if covariance_off is not None and all(covariance_off):
            covariance = 0.0  # no member pays it: not computed at all
        terms = bae_objective(
            x,
            out,
            bits,
            entropy_coefficient=coefficients["entropy"],
            covariance_coefficient=covariance,
            entropy_on=schedule.entropy_on(n_training_steps),
            covariance_off=None if covariance_off is None else torch.tensor(covariance_off),
        )
        counting = schedule.window_counted(n_training_steps)  # none past the last resampling
        window = (self.window_counts, self.window_samples) if counting else None
        batch_mean = terms.pop("batch_mean_code")
        record_codes(self.code_mean, self.code_mean_count, bits, batch_mean, window, members)
        return terms

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
            if self.cfg.resample_every > 0:
                state["window_counts"] = self.window_counts[g]
                state["window_samples"] = self.window_samples
            sae.load_state_dict(state)
            members.append(sae)
        return members
