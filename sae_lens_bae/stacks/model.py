"""G BAEs of one config as one module: every weight and running buffer carries a leading stack
dimension, and each BAE is initialised as ``train_sae`` initialises it with its seed. Entropy
tracing needs dozens to hundreds of small BAEs (one per layer and position) on states of the
same forward passes; stacked, they are one set of ``[G, ...]`` weights whose step is the
architecture's, the same functions a single BAE's step calls (``saes.bae_step``: its input
frame, objective and running mean code) with the stack dimension leading and batched matmuls.
``unstack`` gives the G SAELens ``BAETrainingSAE`` objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor, nn

from sae_lens_bae.outliers import register_screen_count, screen_rows
from sae_lens_bae.saes.bae import BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.saes.bae_step import (
    check_frame_set,
    encoder_inputs,
    pre_activations,
    reconstruct,
    record_code,
    step_penalties,
)
from sae_lens_bae.saes.binary import bits_to_values, step
from sae_lens_bae.saes.code_mean import RUNNING_MEAN_BUFFERS, apply_keeping_dtypes
from sae_lens_bae.saes.input_frame import (
    INPUT_SCALE_BUFFER,
    INPUT_SHIFT_BUFFER,
    Frame,
    module_frame,
)
from sae_lens_bae.saes.minibatch import LOCAL_BATCH
from sae_lens_bae.saes.objective import binary_entropy, squared_error, with_loss

__all__ = ["StackedBAE"]

_PARAMS = ("W_enc", "b_enc", "W_dec", "b_dec")


class _Rows(NamedTuple):
    """The weights (and input frames) of the stack rows that train this step."""

    W_enc: Tensor
    b_enc: Tensor
    W_dec: Tensor
    b_dec: Tensor
    frame: Frame | None


class StackedBAE(nn.Module):
    """G BAEs with one config, stacked along a leading dimension of every weight, each
    initialised as its seed's, or from ``init`` (BAEs of ``cfg``'s shape, one per seed).
    ``batch``: the data-parallel seam, as ``BAETrainingSAE.batch``."""

    batch: Any = LOCAL_BATCH
    _frame_checked = False  # whether the first step checked that every input frame is set

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
        members = self._members(cfg, seeds, init)
        for name in _PARAMS:
            setattr(
                self, name, nn.Parameter(torch.stack([getattr(m, name).detach() for m in members]))
            )
        self.register_buffer("code_mean", torch.stack([m.code_mean for m in members]))
        self.register_buffer("code_mean_count", torch.zeros(()))
        register_screen_count(self, self.W_enc.device)  # the rows its steps set aside
        self.n_models = len(members)
        if cfg.input_variance is not None:  # each member's frame (unset: zeros), stacked
            self.register_buffer(INPUT_SCALE_BUFFER, torch.stack([m.input_scale for m in members]))
            self.register_buffer(INPUT_SHIFT_BUFFER, torch.stack([m.input_shift for m in members]))

    @staticmethod
    def _members(
        cfg: BAETrainingSAEConfig, seeds: Sequence[int], init: Sequence[BAETrainingSAE] | None
    ) -> list[BAETrainingSAE]:
        """The BAEs to stack: ``init``, or each initialised as ``train_sae(seed=seed)`` does."""
        if init is not None:
            if len(init) != len(seeds):
                raise ValueError(f"{len(seeds)} seeds but {len(init)} BAEs to start from")
            return list(init)
        members = []
        for seed in seeds:
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                members.append(BAETrainingSAE(cfg))
        return members

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> StackedBAE:
        """As ``BAETrainingSAE``: a cast leaves the running mean codes and the frame in fp32."""
        apply_keeping_dtypes(
            lambda: super(StackedBAE, self)._apply(fn, recurse),
            self._buffers,
            (*RUNNING_MEAN_BUFFERS, INPUT_SCALE_BUFFER, INPUT_SHIFT_BUFFER),
        )
        return self

    def _rows(self, members: Tensor | None) -> _Rows:
        """The stack rows ``members`` (gradients flow back to them); all rows for None."""
        input_frame = module_frame(self)
        if members is None:
            return _Rows(self.W_enc, self.b_enc, self.W_dec, self.b_dec, input_frame)
        if input_frame is not None:
            input_frame = (input_frame[0][members], input_frame[1][members])
        weights = (getattr(self, name)[members] for name in _PARAMS)
        return _Rows(*weights, input_frame)

    def _check_shape(self, x: Tensor, members: Tensor | None) -> Tensor:
        n = self.n_models if members is None else len(members)
        if x.ndim != 3 or x.shape[0] != n or x.shape[-1] != self.cfg.d_in:
            raise ValueError(
                f"Expected activations of shape [{n}, batch, {self.cfg.d_in}], got {tuple(x.shape)}"
            )
        return x.to(self.W_enc.dtype)

    def _pre(self, rows: _Rows, x: Tensor) -> Tensor:
        """Pre-activations of the rows' BAEs on their inputs ``x`` (``bae_step``, as one BAE's)."""
        inputs = encoder_inputs(x, rows.frame, rows.b_dec, self.cfg.apply_b_dec_to_input)
        return pre_activations(inputs, rows.W_enc, rows.b_enc)

    def hidden_pre(
        self, x: Float[Tensor, "G batch d_in"], members: Tensor | None = None
    ) -> Float[Tensor, "G batch n_bits"]:
        """Pre-activations of every BAE (or of the stack rows ``members``) on its own inputs."""
        return self._pre(self._rows(members), self._check_shape(x, members))

    def decode(
        self, bits: Float[Tensor, "G batch n_bits"], members: Tensor | None = None
    ) -> Float[Tensor, "G batch d_in"]:
        """Each BAE's reconstruction of its bits, in the inputs' units."""
        rows = self._rows(members)
        values = bits_to_values(bits, self.cfg.bits_per_feature)
        return reconstruct(values, rows.W_dec, rows.b_dec, rows.frame)

    def losses(
        self,
        x: Float[Tensor, "G batch d_in"],
        n_training_steps: int,
        members: Tensor | None = None,
        covariance_off: Sequence[bool] | None = None,
    ) -> dict[str, Tensor]:
        """One step of every BAE (or of the stack rows ``members``, ``x`` holding their
        minibatches: the others cost nothing and get no gradient) at training step
        ``n_training_steps``: a single BAE's step (``saes.bae_step``) with the stack dimension
        leading: each member's minibatch screened for extreme rows (``outliers.screen_rows``, at
        the config's ``extreme_norm_ratio``), its ``mse_loss`` (``squared_error``), penalties
        (``step_penalties``) and ``loss``, each of shape [G], and ``batch_entropy_bits``, then
        the running mean codes. ``covariance_off``: per row of ``x``, True where that BAE trains
        without the covariance term (its final phase after it converged)."""
        n, batch = n_training_steps, self.batch
        x = self._check_shape(x, members)
        if self.cfg.extreme_norm_ratio is not None:  # each member's minibatch, as a BAE's step
            x = screen_rows(self, x, self.cfg.extreme_norm_ratio)
        if not self._frame_checked:  # set before the first step (a stack's trainer frames its sets)
            check_frame_set(module_frame(self))
            self._frame_checked = True
        rows = self._rows(members)
        bits = step(self._pre(rows, x), self.cfg.surrogate_temperature)
        values = bits_to_values(bits, self.cfg.bits_per_feature)
        output = reconstruct(values, rows.W_dec, rows.b_dec, rows.frame)
        penalties = step_penalties(
            self.cfg,
            bits,
            n,
            rows.frame,
            batch=batch,
            covariance=BAETrainingSAE.covariance_penalty,
            covariance_off=covariance_off,
        )
        terms = with_loss({"mse_loss": squared_error(output, x, batch), **penalties})
        mean = record_code(self.code_mean, self.code_mean_count, bits, batch, members)
        terms["batch_entropy_bits"] = binary_entropy(mean)
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
            state["code_mean"], state["code_mean_count"] = self.code_mean[g], self.code_mean_count
            if self.cfg.input_variance is not None:
                state[INPUT_SCALE_BUFFER] = self.input_scale[g]
                state[INPUT_SHIFT_BUFFER] = self.input_shift[g]
            sae.load_state_dict(state)
            members.append(sae)
        return members
