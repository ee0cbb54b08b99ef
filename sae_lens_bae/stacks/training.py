"""Many small BAEs trained as one ``StackedBAE``, with a stop rule, a drain hold and checkpoints.

The result equals G separate ``train_sae`` runs with the same seeds and data order: each BAE is
initialised as ``train_sae`` initialises it, sees its own minibatches and minibatch statistics,
and has its gradient clipped to norm 1 on its own, as SAELens' ``SAETrainer`` does (Adam is
elementwise, so one optimiser over stacked weights updates each BAE as its own would). A framed
BAE (``input_variance`` set, the ``entropy`` recipe's) fixes its input frame before the first step
on the rows ``train_sae`` fixes it on: its set less the rows the outlier rule sets aside, sampled
to at most 100 minibatches' rows. The BAEs come back with their frames on (the entropy recipe
trains them further); saving one folds it.

With a ``checkpoint`` folder the run saves everything it would need to go on (weights, Adam, the
learning-rate schedule, the loop's ``_Progress``, the stop rule's checks and the loss histories)
every ``CHECKPOINT_SECONDS`` and when it ends; the same call on the same folder then goes on from
there, to the weights of a run that was never interrupted, or returns the finished BAEs at once.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch
from jaxtyping import Float
from sae_lens.training.optim import get_lr_scheduler
from torch import Tensor
from tqdm.auto import tqdm

from sae_lens_bae.outliers import outlier_mask
from sae_lens_bae.reports import read_torch, write_torch
from sae_lens_bae.saes.bae import BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.saes.bae_recipes import DEFAULT_BATCH_SIZE, DEFAULT_LR
from sae_lens_bae.saes.bae_step import reconstruct
from sae_lens_bae.saes.binary import bits_to_values, step
from sae_lens_bae.saes.input_frame import fix_frame, frame, frame_sample, module_frame
from sae_lens_bae.saes.objective import binary_entropy
from sae_lens_bae.stacks.model import StackedBAE
from sae_lens_bae.training.checkpoints import (
    COMPLETE_MARKER,
    check_resumable,
    fingerprint,
    mark_complete,
)
from sae_lens_bae.training.convergence import Convergence, ConvergenceMonitor, DrainHold
from sae_lens_bae.training.deferred import LossHistory, progress_bits, sets_on_device
from sae_lens_bae.training.trainer import NORM_ESTIMATE_BATCHES, activation_batches

__all__ = [
    "CHECKPOINT_SECONDS",
    "StackedBAE",
    "StackedTrainer",
    "StackedTraining",
    "train_stacked_baes",
]

_DRAIN_CHECK_ROWS = 8192
"""Check states a drain hold reads (without a convergence rule): a code's entropy on them moves
by well under a bit between checks; checking a large set whole costs more than the steps."""

CHECKPOINT_SECONDS = 600.0
"""Wall time between two checkpoints of a run with a ``checkpoint`` folder: a stack of a few
hundred BAEs with their Adam states is gigabytes, so not every few steps."""

_STATE_FILE = "stacked_state.pt"
_STATE_KEYS = {"model", "optimizer", "scheduler", "progress", "histories", "checks"}


class StackedTraining(NamedTuple):
    """What ``train_stacked_baes`` returns: the BAEs, their loss histories, and the steps each
    trained (fewer than the budget for a BAE that converged)."""

    baes: list[BAETrainingSAE]
    histories: list[dict[str, list[float]]]
    steps: list[int]


@dataclass
class _Progress:
    """Everything the loop changes besides the weights, Adam and the lr schedule."""

    active: list[int]
    """The BAEs still training: the only ones computed."""
    drain_entropies: list[list[float]]
    """Each BAE's code entropy at every drain-hold check."""
    n: int = 0
    """Steps taken (held ones included)."""
    clock: int = 0
    """The schedule's step: it stands still while a drain hold holds it."""
    holding: bool = False
    """Whether the drain hold holds the schedule now."""
    frozen: dict[int, list[Tensor]] = field(default_factory=dict)
    """The weights of each BAE that stopped (Adam's momentum would still move them)."""
    taken: dict[int, int] = field(default_factory=dict)
    """The steps each stopped BAE trained."""
    ends: dict[int, int] = field(default_factory=dict)
    """BAEs that converged with the covariance term on: the clock they train to without it."""

    def drawn(self, g: int) -> int:
        """Minibatches BAE ``g`` has taken from its stream."""
        return self.taken.get(g, self.n)


@torch.no_grad()
def _check(
    model: StackedBAE, states: Tensor, members: Tensor | None = None
) -> tuple[list[float], list[float]]:
    """Relative reconstruction error (SSE / sum of squares, in the BAE's input frame) and code
    entropy in bits of each stacked BAE (or of the rows ``members``) on its own check states
    [G, m, d]."""
    rows = model._rows(members)
    x = states.to(rows.W_enc.dtype)
    framed = frame(x, rows.frame)
    bits = step(model._pre(rows, x))
    values = bits_to_values(bits, model.cfg.bits_per_feature)
    out = reconstruct(values, rows.W_dec, rows.b_dec, None)  # left in the frame, as ``framed``
    sse = (out - framed).double().pow(2).sum(dim=(1, 2))
    squares = framed.double().pow(2).sum(dim=(1, 2)).clamp_min(1e-30)
    entropy = binary_entropy(bits.float().mean(1))
    return (sse / squares).tolist(), entropy.tolist()


class _Checkpoint:
    """The run's checkpoint folder: one state file, written to a temporary name and renamed, and
    the marker written last (``training.checkpoints``)."""

    def __init__(self, folder: Path, run: dict[str, Any]) -> None:
        self.folder, self.run = folder, run
        self.saved_at = time.monotonic()
        self.finished = False

    def load(self) -> dict[str, Any] | None:
        """The saved state, or None where there is none (a folder whose first save was cut
        short has none either); refuses another run's (``check_resumable``)."""
        if not (self.folder / COMPLETE_MARKER).is_file():
            return None
        self.finished = bool(check_resumable(self.folder, self.run).get("finished"))
        path, fix = self.folder / _STATE_FILE, f"delete {self.folder} to train again"
        state = read_torch(path, "a readable checkpoint", fix, weights_only=False)
        if not isinstance(state, dict) or set(state) != _STATE_KEYS:
            raise ValueError(f"{path} is not a stacked training checkpoint; {fix}")
        return state

    def due(self) -> bool:
        return time.monotonic() - self.saved_at >= CHECKPOINT_SECONDS

    def save(self, state: dict[str, Any], finished: bool) -> None:
        """The state file replaced whole (a kill leaves the last one), then the marker."""
        write_torch(self.folder / _STATE_FILE, state)
        steps = state["progress"].n
        samples = steps * self.run["global_batch_size"]
        info = {"n_training_steps": steps, "n_training_samples": samples}
        mark_complete(self.folder, **self.run, **info, finished=finished)
        self.saved_at = time.monotonic()


class StackedTrainer:
    """One optimiser over the stacked weights (Adam is elementwise, so it updates each BAE as its
    own would), SAELens' learning-rate schedule, a per-BAE gradient clip to norm 1 (as SAETrainer
    clips one BAE), and the rules that stop BAEs (``Convergence``) or hold the schedule
    (``DrainHold``). See :func:`train_stacked_baes` for the arguments."""

    def __init__(
        self,
        sets: list[Tensor],
        cfg: BAETrainingSAEConfig,
        seeds: list[int],
        options: dict[str, Any],
    ) -> None:
        self.sets, self.seeds, self.options = sets, seeds, options
        batch_size, device = options["batch_size"], options["device"]
        self.n_steps = options["training_samples"] // batch_size
        self.cfg, self.device = cfg, device
        self.model = StackedBAE(cfg, seeds, options["init"]).to(device)
        self._frame_sets()
        self._build_optimiser()
        self.history = LossHistory(len(sets))
        # neither the objective's nor the learning rate's ramp is evidence of a plateau or a drain
        self.ramp_end = max(options["lr_warm_up_steps"], cfg.entropy_off_steps)
        self.monitor, self.checks = self._build_rules()
        hold = options["drain_hold"]
        self.limit = self.n_steps + (hold.extra_steps(self.n_steps) if hold is not None else 0)
        self.run = _Progress(active=list(range(len(sets))), drain_entropies=[[] for _ in sets])
        self.saver = self._restore() if options["checkpoint"] is not None else None

    def _frame_sets(self) -> None:
        """Each BAE's frame before the first step, on the rows ``train_sae`` fixes a BAE's on
        (its set less the rows ``outlier_mask`` sets aside at the config's ratio, then
        ``frame_sample``: all of them or a seeded sample of ``NORM_ESTIMATE_BATCHES``
        minibatches' rows), so a stack member and a BAE alone train in one frame (a frame
        already set is kept)."""
        input_frame = module_frame(self.model)
        if input_frame is None or self.cfg.input_variance is None:
            return
        max_rows = NORM_ESTIMATE_BATCHES * self.options["batch_size"]
        for g, (x, seed) in enumerate(zip(self.sets, self.seeds, strict=True)):
            kept = x[outlier_mask(x, self.cfg.extreme_norm_ratio)]
            rows = frame_sample(kept, max_rows, seed).to(self.device)
            frame_rows = (input_frame[0][g : g + 1], input_frame[1][g : g + 1])
            fix_frame(frame_rows, rows[None], self.cfg.input_variance)

    def _build_optimiser(self) -> None:
        lr, options = self.options["lr"], self.options
        betas = (0.9, options["adam_beta2"])
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr, betas=betas)
        self.scheduler = get_lr_scheduler(
            options["lr_scheduler_name"],
            self.optimizer,
            training_steps=self.n_steps,
            lr=lr,
            warm_up_steps=options["lr_warm_up_steps"],
            decay_steps=0,
            lr_end=lr if options["lr_end"] is None else options["lr_end"],
            num_cycles=1,
        )

    def _build_rules(self) -> tuple[ConvergenceMonitor | None, Tensor | None]:
        """The stop rule's monitor and the check states [G, m, d] it and a drain hold read."""
        convergence, hold = self.options["convergence"], self.options["drain_hold"]
        monitor = None
        if convergence is not None:
            rule = replace(convergence, min_steps=max(convergence.min_steps, self.ramp_end))
            monitor = ConvergenceMonitor(rule, len(self.sets))
        if convergence is None and hold is None:
            return monitor, None
        check_sets = self.options["check_sets"]
        chosen = list(check_sets) if check_sets is not None else self.sets
        rows = min(x.shape[0] for x in chosen)
        if convergence is None:  # a drain hold alone: a few rows suffice
            rows = min(rows, _DRAIN_CHECK_ROWS)
        return monitor, torch.stack([x[:rows].float() for x in chosen]).to(self.device)

    def _restore(self) -> _Checkpoint:
        """The run's checkpoint folder, and the state saved there if any (another run's is
        refused in one line)."""
        o = self.options
        settings = {
            "cfg": repr(self.cfg),
            "seeds": self.seeds,
            "steps": self.n_steps,
            "schedule": (
                o["lr"],
                o["lr_warm_up_steps"],
                o["lr_scheduler_name"],
                o["lr_end"],
                o["adam_beta2"],
            ),
            "rules": (repr(o["convergence"]), repr(o["drain_hold"]), o["init"] is not None),
            "checks": None if self.checks is None else fingerprint(list(self.checks), {}),
        }
        run_info = {
            "global_batch_size": o["batch_size"],
            "world_size": 1,
            "inputs": fingerprint(self.sets, settings),
        }
        saver = _Checkpoint(Path(o["checkpoint"]), run_info)
        saved = saver.load()
        if saved is not None:
            self.model.load_state_dict(saved["model"])
            self.optimizer.load_state_dict(saved["optimizer"])
            self.scheduler.load_state_dict(saved["scheduler"])
            self.run, self.history.histories = saved["progress"], saved["histories"]
            if self.monitor is not None:
                self.monitor.errors, self.monitor.entropies = saved["checks"][:2]
                self.monitor.converged_at = saved["checks"][2]
        return saver

    def state(self) -> dict[str, Any]:
        """Everything the run needs to go on."""
        self.history.flush()
        monitor = self.monitor
        checks = (
            None if monitor is None else (monitor.errors, monitor.entropies, monitor.converged_at)
        )
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "progress": self.run,
            "histories": self.history.histories,
            "checks": checks,
        }

    def _finished(self) -> bool:
        return len(self.run.frozen) == len(self.sets) or self.run.clock == self.n_steps

    def fit(self) -> StackedTraining:
        """Train until every BAE stopped or the schedule ended; save and return the BAEs."""
        run, batch_size = self.run, self.options["batch_size"]
        # no wait for the device a step: minibatches gathered on it, losses read in blocks
        on_device = sets_on_device(self.sets, self.device)
        streams = [
            activation_batches(x, batch_size, seed=s, start=run.drawn(g))
            for g, (x, s) in enumerate(zip(on_device, self.seeds, strict=True))
        ]
        # None while every BAE trains (no indexing at all)
        self.members = (
            None
            if len(run.active) == len(self.sets)
            else torch.tensor(run.active, device=self.device)
        )
        finished = self._finished()
        self.bar = tqdm(
            range(run.n, self.limit),
            total=self.limit,
            initial=run.n,
            desc=f"Training {len(self.sets)} stacked BAEs",
            disable=not self.options["progress"] or finished,
        )
        for n in self.bar if not finished else ():
            self.step(n, torch.stack([next(streams[g]) for g in run.active]).to(self.device))
            self._stop(n, self._read_checks(n))
            if self._finished():
                break
            if self.saver is not None and self.saver.due():
                self.saver.save(self.state(), finished=False)
        if self.saver is not None and not self.saver.finished:
            self.saver.save(self.state(), finished=True)
        self.history.flush()
        steps = [run.taken.get(g, run.n) for g in range(len(self.sets))]
        baes = [sae.to(self.device) for sae in self.model.unstack()]
        return StackedTraining(baes, self.history.histories, steps)

    def step(self, n: int, batch: Tensor) -> None:
        """One optimiser step of the training BAEs on their minibatches ``batch``."""
        run = self.run
        off = [g in run.ends for g in run.active] if run.ends else None
        losses = self.model.losses(batch, run.clock, self.members, off)
        losses.pop("loss").sum().backward()
        self.model.clip_grad_norms_(1.0)
        self.optimizer.step()
        if not run.holding:
            self.scheduler.step()
            run.clock += 1
        self.optimizer.zero_grad()
        for g, weights in run.frozen.items():  # Adam's momentum would still move a stopped BAE
            for parameter, kept in zip(self.model.parameters(), weights, strict=True):
                parameter.data[g] = kept
        # the squared error per element, as ``RecordingTrainer`` derives it from ``mse_loss``
        losses["reconstruction_loss"] = losses["mse_loss"] / self.cfg.d_in
        self.history.record(run.active, losses)
        run.n = n + 1

    def _read_checks(self, n: int) -> tuple[list[float], list[float]] | None:
        """Each BAE's error and entropy on its check states when a rule checks at step ``n``,
        and the drain hold's decision taken on them."""
        run, hold = self.run, self.options["drain_hold"]
        converging = self.monitor is not None and self.monitor.due(n)
        draining = hold is not None and (n + 1) % hold.check_every == 0
        if self.checks is None or not (converging or draining):
            return None
        errors, entropies = [math.nan] * len(self.sets), [math.nan] * len(self.sets)
        rows = self.checks if self.members is None else self.checks[self.members]
        for g, error, bits in zip(run.active, *_check(self.model, rows, self.members), strict=True):
            errors[g], entropies[g] = error, bits
        if draining:
            for g in run.active:
                run.drain_entropies[g].append(entropies[g])
            # only once the objective is whole, before the final phase, and never so long
            # that the rest of the schedule would not fit in the steps left
            room = self.limit - (n + 1) - hold.check_every >= self.n_steps - run.clock
            falling = any(hold.draining(run.drain_entropies[g]) for g in run.active)
            whole = run.clock >= self.ramp_end and self.cfg.covariance_on(run.clock)
            run.holding = room and falling and whole
            shown = progress_bits([entropies[g] for g in run.active])  # read at the check
            self.bar.set_postfix(held=n + 1 - run.clock, bits=shown, refresh=False)
        return (errors, entropies) if converging else None

    def _stop(self, n: int, checked: tuple[list[float], list[float]] | None) -> None:
        """Freeze the BAEs that converged (or reached the end of their final phase)."""
        run, off = self.run, self.cfg.covariance_off_from_step
        stopping = [g for g in run.active if run.ends.get(g) == run.clock]
        if checked is not None and self.monitor is not None:
            for g in self.monitor.update(run.clock - 1, *checked):
                if (
                    off is not None
                    and off < self.n_steps
                    and run.clock < self.n_steps
                    and self.cfg.covariance_on(run.clock)
                ):
                    # the final phase's share of its training without the term, as without the
                    # rule: (n - off) / off of the steps it trained with it
                    more = math.ceil((self.n_steps - off) / off * run.clock)
                    run.ends[g] = min(self.n_steps, run.clock + more)
                else:
                    stopping.append(g)
        for g in stopping:
            run.frozen[g] = [p.data[g].clone() for p in self.model.parameters()]
            run.taken[g] = n + 1
        if stopping:
            run.active = [g for g in run.active if g not in run.frozen]
            self.members = torch.tensor(run.active, device=self.device) if run.active else None


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
    checkpoint: str | Path | None = None,
) -> StackedTraining:
    """Train one BAE per activation set, all at once (:class:`StackedTrainer`); returns the BAEs,
    per-BAE histories and the steps each trained.

    BAE ``g`` trains on ``activations[g]`` in reshuffled epochs with seed ``seeds[g]`` (default
    ``g``), as ``train_sae(activations[g], cfg, seed=seeds[g], ...)`` would (its input frame fixed
    on the same rows before the first step), for ``training_samples`` at most. With
    ``convergence``, each BAE is checked on ``check_sets[g]`` (default: its own set; the first rows,
    as many for every BAE) and stops updating once it has converged; training ends when all have
    (``sae_lens_bae.training.convergence``). A converged BAE drops out of the stacked matmuls. With
    ``cfg.covariance_off_from_step`` c before the budget's n steps, a BAE that converges at step s
    with the covariance term still on trains (n - c) / c s more steps without it (within the
    budget), as long a final phase for its length as the config gives a run of n steps.
    ``lr_warm_up_steps``, ``lr_scheduler_name``, ``lr_end``: SAELens' learning-rate schedule;
    ``adam_beta2``: Adam's second-moment decay. ``drain_hold``: while the code entropy of any
    training BAE on its check states still falls, the schedule stands still, for at most
    ``drain_hold.extra`` times the budget in held steps (``steps`` counts them). ``init``: BAEs to
    train on from, one per set; ``seeds`` then only order the minibatches. ``checkpoint``: a folder
    the run saves itself to and goes on from.
    """
    sets = list(activations)
    seeds = list(range(len(sets))) if seeds is None else list(seeds)
    if len(seeds) != len(sets):
        raise ValueError(f"{len(sets)} activation sets but {len(seeds)} seeds")
    options = {
        "training_samples": training_samples,
        "batch_size": batch_size,
        "lr": lr,
        "device": device,
        "progress": progress,
        "convergence": convergence,
        "check_sets": check_sets,
        "lr_warm_up_steps": lr_warm_up_steps,
        "lr_scheduler_name": lr_scheduler_name,
        "lr_end": lr_end,
        "adam_beta2": adam_beta2,
        "drain_hold": drain_hold,
        "init": init,
        "checkpoint": checkpoint,
    }
    return StackedTrainer(sets, cfg, seeds, options).fit()
