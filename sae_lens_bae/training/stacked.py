"""Many small BAEs trained as one stacked module.

Entropy tracing needs dozens to hundreds of small BAEs (one per layer and position) on states of
the same forward passes; stacked, they are one set of ``[G, ...]`` weights. The result equals G
separate ``train_sae`` runs with the same seeds and data order: each BAE is initialised as
``train_sae`` initialises it, sees its own minibatches and minibatch statistics, and has its
gradient clipped to norm 1 on its own, as SAELens' ``SAETrainer`` does (Adam is elementwise, so
one optimiser over stacked weights updates each BAE as its own would).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import NamedTuple

import torch
from jaxtyping import Float
from sae_lens.training.optim import get_lr_scheduler
from torch import Tensor, nn
from tqdm.auto import trange

from sae_lens_bae.losses import bae_objective, binary_entropy, total_loss
from sae_lens_bae.saes.bae import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_LR,
    BAETrainingSAE,
    BAETrainingSAEConfig,
)
from sae_lens_bae.saes.binary import (
    RUNNING_MEAN_BUFFERS,
    apply_keeping_dtypes,
    bits_to_values,
    record_codes,
    step,
)
from sae_lens_bae.saes.resampling import resample_members
from sae_lens_bae.saes.schedule import Schedule
from sae_lens_bae.training.convergence import Convergence, ConvergenceMonitor, DrainHold
from sae_lens_bae.training.deferred import LossHistory, progress_bits, sets_on_device
from sae_lens_bae.training.trainer import activation_batches

__all__ = ["StackedBAE", "StackedTraining", "train_stacked_baes"]

_PARAMS = ("W_enc", "b_enc", "W_dec", "b_dec")
_DRAIN_CHECK_ROWS = 8192
"""Check states a drain hold reads (without a convergence rule): a code's entropy on them moves
by well under a bit between checks; checking a large set whole costs more than the steps."""


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
            tensors = [getattr(m, name) for m in members]
            if tensors[0] is None:
                self.register_parameter(name, None)
            else:
                setattr(self, name, nn.Parameter(torch.stack([t.detach() for t in tensors])))
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
        b_enc = None if self.b_enc is None else self.b_enc.data
        return resample_members(
            self.W_enc.data, b_enc, self.W_dec.data, inputs, residuals, self.window_counts,
            self.window_samples, self.code_mean, members=rows, bits_per_feature=self.cfg.bits,
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
        if self.b_enc is None:
            return torch.bmm(x, w_enc)
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
        )
        if covariance > 0 and covariance_off is not None and any(covariance_off):
            off = torch.tensor(list(covariance_off), device=x.device)
            terms["covariance_loss"] = terms["covariance_loss"].masked_fill(off, 0.0)
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
            state = {
                name: getattr(self, name)[g] for name in _PARAMS if getattr(self, name) is not None
            }
            state["code_mean"] = self.code_mean[g]
            state["code_mean_count"] = self.code_mean_count
            if self.cfg.resample_every > 0:
                state["window_counts"] = self.window_counts[g]
                state["window_samples"] = self.window_samples
            sae.load_state_dict(state)
            members.append(sae)
        return members


class StackedTraining(NamedTuple):
    """What ``train_stacked_baes`` returns: the BAEs, their loss histories, and the steps each
    trained (fewer than the budget for a BAE that converged)."""

    baes: list[BAETrainingSAE]
    histories: list[dict[str, list[float]]]
    steps: list[int]


@torch.no_grad()
def _check(
    model: StackedBAE, states: Tensor, members: Tensor | None = None
) -> tuple[list[float], list[float]]:
    """Relative reconstruction error (SSE / sum of squares) and code entropy in bits of each
    stacked BAE (or of the rows ``members``) on its own check states [G, m, d]."""
    bits = step(model.hidden_pre(states, members))
    out = model.decode(bits, members)
    sse = (out - states.to(out.dtype)).double().pow(2).sum(dim=(1, 2))
    squares = states.double().pow(2).sum(dim=(1, 2)).clamp_min(1e-30)
    entropy = binary_entropy(bits.float().mean(1))
    return (sse / squares).tolist(), entropy.tolist()


def train_stacked_baes(
    activations: Float[Tensor, "G n d_in"] | Sequence[Float[Tensor, "n d_in"]],
    cfg: BAETrainingSAEConfig,
    *,
    training_samples: int,
    seeds: Sequence[int] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    lr: float = DEFAULT_LR,
    device: str = "cpu",
    progress: bool = True,
    convergence: Convergence | None = None,
    check_sets: Sequence[Float[Tensor, "m d_in"]] | None = None,
    lr_warm_up_steps: int = 0,
    lr_scheduler_name: str = "constant",
    lr_end: float | None = None,
    adam_beta2: float = 0.999,
    drain_hold: DrainHold | None = None,
    init: Sequence[BAETrainingSAE] | None = None,
) -> StackedTraining:
    """Train one BAE per activation set, all at once; returns the BAEs, per-BAE histories and
    the steps each trained.

    BAE ``g`` trains on ``activations[g]`` in reshuffled epochs with seed ``seeds[g]`` (default
    ``g``), exactly as ``train_sae(activations[g], cfg, seed=seeds[g], ...)`` would, for
    ``training_samples`` at most. With ``convergence``, each BAE is checked on ``check_sets[g]``
    (default: its own set; the first rows, as many for every BAE) and stops updating once it has
    converged; training ends when all have (``sae_lens_bae.training.convergence``). A converged
    BAE drops out of the stacked matmuls, so a stack costs what its unconverged members cost.
    With ``cfg.covariance_off_final_fraction`` f > 0, a BAE that converges at step s with the
    covariance term still on trains f / (1 - f) s more steps without it (within the budget),
    so the last fraction f of its training is without the term, as in a run of the full budget.
    ``lr_warm_up_steps``, ``lr_scheduler_name``, ``lr_end``: SAELens' learning-rate schedule
    (as ``train_sae`` passes them): a linear warm-up, then constant or ``"cosineannealing"``
    down to ``lr_end`` (default: ``lr``) at the end of the budget. ``adam_beta2``: Adam's
    second-moment decay, under SAELens' name (beta1 is its 0.9). ``drain_hold``: while the
    code entropy of any training BAE on its check states still falls (``DrainHold``), the
    schedule (learning rate and the step its phases read) stands still, for at most
    ``drain_hold.extra`` times the budget in held steps; ``steps`` then counts them too.
    ``init``: BAEs to train on from, one per set; ``seeds`` then only order the minibatches.
    """
    sets = list(activations)
    seeds = list(range(len(sets))) if seeds is None else list(seeds)
    if len(seeds) != len(sets):
        raise ValueError(f"{len(sets)} activation sets but {len(seeds)} seeds")
    n_steps = training_samples // batch_size
    if cfg.total_training_steps is None:
        cfg = replace(cfg, total_training_steps=n_steps)
    model = StackedBAE(cfg, seeds, init).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, adam_beta2))
    scheduler = get_lr_scheduler(
        lr_scheduler_name,
        optimizer,
        training_steps=n_steps,
        lr=lr,
        warm_up_steps=lr_warm_up_steps,
        decay_steps=0,
        lr_end=lr if lr_end is None else lr_end,
        num_cycles=1,
    )
    # no wait for the device a step: minibatches gathered on it, losses read in blocks
    on_device = sets_on_device(sets, device)
    streams = [
        activation_batches(x, batch_size, seed=s) for x, s in zip(on_device, seeds, strict=True)
    ]
    history = LossHistory(len(sets))
    # neither the objective's nor the learning rate's ramp is evidence of a plateau or a drain
    schedule = model.schedule = cfg.schedule()
    ramp_end = max(lr_warm_up_steps, schedule.entropy_on_from)
    monitor = checks = None
    if convergence is not None:
        rule = replace(convergence, min_steps=max(convergence.min_steps, ramp_end))
        monitor = ConvergenceMonitor(rule, len(sets))
    if convergence is not None or drain_hold is not None:
        chosen = list(check_sets) if check_sets is not None else sets
        rows = min(x.shape[0] for x in chosen)
        if convergence is None:  # a drain hold alone: a few rows suffice
            rows = min(rows, _DRAIN_CHECK_ROWS)
        checks = torch.stack([x[:rows].float() for x in chosen]).to(device)
    limit = n_steps + (drain_hold.extra_steps(n_steps) if drain_hold is not None else 0)
    drain_entropies: list[list[float]] = [[] for _ in sets]
    holding, fresh = False, True
    frozen: dict[int, list[Tensor]] = {}
    taken: dict[int, int] = {}  # the steps a stopped BAE trained
    active = list(range(len(sets)))  # the BAEs still training: the only ones computed
    members: Tensor | None = None  # None while every BAE trains (no indexing at all)
    final = cfg.covariance_off_final_fraction
    ends: dict[int, int] = {}  # converged with the covariance term on: trains to then without it
    clock = 0  # the schedule's step: it stands still while a drain hold holds it
    n = -1
    bar = trange(limit, desc=f"Training {len(sets)} stacked BAEs", disable=not progress)
    for n in bar:
        batch = torch.stack([next(streams[g]) for g in active]).to(device)
        off = [g in ends for g in active] if ends else None
        losses = model.losses(batch, clock, members, off, resample=fresh)
        fresh = not holding  # a held step leaves the clock where it is
        total_loss(losses).sum().backward()
        model.clip_grad_norms_(1.0)
        optimizer.step()
        if not holding:
            scheduler.step()
            clock += 1
        optimizer.zero_grad()
        for g, weights in frozen.items():  # Adam's momentum would still move a converged BAE
            for parameter, kept in zip(model.parameters(), weights, strict=True):
                parameter.data[g] = kept
        history.record(active, losses)
        stopping = [g for g in active if ends.get(g) == clock]
        converging = monitor is not None and monitor.due(n)
        draining = drain_hold is not None and (n + 1) % drain_hold.check_every == 0
        if checks is not None and (converging or draining):
            errors, entropies = [math.nan] * len(sets), [math.nan] * len(sets)
            rows = checks if members is None else checks[members]
            for g, error, bits in zip(active, *_check(model, rows, members), strict=True):
                errors[g], entropies[g] = error, bits
            if draining and drain_hold is not None:
                for g in active:
                    drain_entropies[g].append(entropies[g])
                # only once the objective is whole, before the final phase, and never so long
                # that the rest of the schedule would not fit in the steps left
                room = limit - (n + 1) - drain_hold.check_every >= n_steps - clock
                falling = any(drain_hold.draining(drain_entropies[g]) for g in active)
                holding = room and falling and clock >= ramp_end and schedule.covariance_on(clock)
                shown = progress_bits([entropies[g] for g in active])  # read at the check
                bar.set_postfix(held=n + 1 - clock, bits=shown, refresh=False)
            if converging and monitor is not None:
                for g in monitor.update(clock - 1, errors, entropies):
                    if final > 0 and clock < n_steps and schedule.covariance_on(clock):
                        # the last fraction of its training without the term, as without the rule
                        ends[g] = min(n_steps, clock + math.ceil(final / (1 - final) * clock))
                    else:
                        stopping.append(g)
        for g in stopping:
            frozen[g] = [p.data[g].clone() for p in model.parameters()]
            taken[g] = n + 1
        if len(frozen) == len(sets) or clock == n_steps:
            break
        if stopping:
            active = [g for g in active if g not in frozen]
            members = torch.tensor(active, device=device)
    history.flush()
    steps = [taken.get(g, n + 1) for g in range(len(sets))]
    return StackedTraining([sae.to(device) for sae in model.unstack()], history.histories, steps)
