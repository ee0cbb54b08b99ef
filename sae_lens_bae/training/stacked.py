"""Many small BAEs trained as one ``StackedBAE``, with a stop rule, a drain hold and checkpoints.

The result equals G separate ``train_sae`` runs with the same seeds and data order: each BAE is
initialised as ``train_sae`` initialises it, sees its own minibatches and minibatch statistics,
and has its gradient clipped to norm 1 on its own, as SAELens' ``SAETrainer`` does (Adam is
elementwise, so one optimiser over stacked weights updates each BAE as its own would).

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

from sae_lens_bae.losses import binary_entropy
from sae_lens_bae.reports import read_torch, write_torch
from sae_lens_bae.saes.bae import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_LR,
    BAETrainingSAE,
    BAETrainingSAEConfig,
)
from sae_lens_bae.saes.bae_step import forward_in_frame, stack_of
from sae_lens_bae.saes.input_scale import fix_frame, frame, module_frame
from sae_lens_bae.saes.stacked import StackedBAE
from sae_lens_bae.training.checkpoints import (
    COMPLETE_MARKER,
    check_resumable,
    fingerprint,
    mark_complete,
)
from sae_lens_bae.training.convergence import Convergence, ConvergenceMonitor, DrainHold
from sae_lens_bae.training.deferred import LossHistory, progress_bits, sets_on_device
from sae_lens_bae.training.trainer import activation_batches

__all__ = ["CHECKPOINT_SECONDS", "StackedBAE", "StackedTraining", "train_stacked_baes"]

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
    fresh: bool = True
    """Whether this step's clock is new (a held step must not resample again)."""
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
    rows = stack_of(model).rows(members)
    framed = frame(states.to(rows.W_enc.dtype), rows.frame)
    _, bits, _, out = forward_in_frame(rows, framed, model.cfg)
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
    ``checkpoint``: a folder the run saves itself to (see the module) and goes on from; a
    checkpoint of another run there (other sets or settings) is refused in one line.
    """
    sets = list(activations)
    seeds = list(range(len(sets))) if seeds is None else list(seeds)
    if len(seeds) != len(sets):
        raise ValueError(f"{len(sets)} activation sets but {len(seeds)} seeds")
    n_steps = training_samples // batch_size
    if cfg.total_training_steps is None:
        cfg = replace(cfg, total_training_steps=n_steps)
    model = StackedBAE(cfg, seeds, init).to(device)
    input_frame = module_frame(model)
    if input_frame is not None and cfg.rescale_inputs_to is not None:
        # each BAE's frame from its whole set, not its first minibatch: a set in memory is read
        # in one frame whatever its minibatches' order (a frame already set is kept)
        for g, x in enumerate(sets):
            rows = (input_frame[0][g : g + 1], input_frame[1][g : g + 1])
            fix_frame(rows, x.to(device)[None], cfg.rescale_inputs_to)
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
    run = _Progress(active=list(range(len(sets))), drain_entropies=[[] for _ in sets])
    saver = None
    if checkpoint is not None:
        settings = {
            "cfg": repr(cfg),
            "seeds": seeds,
            "steps": n_steps,
            "schedule": (lr, lr_warm_up_steps, lr_scheduler_name, lr_end, adam_beta2),
            "rules": (repr(convergence), repr(drain_hold), init is not None),
            "checks": None if checks is None else checks.double().sum().item(),
        }
        inputs = fingerprint(sets, settings)
        run_info = {"global_batch_size": batch_size, "world_size": 1, "inputs": inputs}
        saver = _Checkpoint(Path(checkpoint), run_info)
        saved = saver.load()
        if saved is not None:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            run, history.histories = saved["progress"], saved["histories"]
            if monitor is not None:
                monitor.errors, monitor.entropies = saved["checks"][:2]
                monitor.converged_at = saved["checks"][2]

    def state() -> dict[str, Any]:
        history.flush()
        return {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "progress": run,
            "histories": history.histories,
            "checks": None
            if monitor is None
            else (monitor.errors, monitor.entropies, monitor.converged_at),
        }

    # no wait for the device a step: minibatches gathered on it, losses read in blocks
    on_device = sets_on_device(sets, device)
    streams = [
        activation_batches(x, batch_size, seed=s, start=run.drawn(g))
        for g, (x, s) in enumerate(zip(on_device, seeds, strict=True))
    ]
    # None while every BAE trains (no indexing at all)
    members = None if len(run.active) == len(sets) else torch.tensor(run.active, device=device)
    final = cfg.covariance_off_final_fraction
    finished = len(run.frozen) == len(sets) or run.clock == n_steps
    bar = tqdm(
        range(run.n, limit),
        total=limit,
        initial=run.n,
        desc=f"Training {len(sets)} stacked BAEs",
        disable=not progress or finished,
    )
    for n in bar if not finished else ():
        batch = torch.stack([next(streams[g]) for g in run.active]).to(device)
        off = [g in run.ends for g in run.active] if run.ends else None
        losses = model.losses(batch, run.clock, members, off, resample=run.fresh)
        run.fresh = not run.holding  # a held step leaves the clock where it is
        losses.pop("loss").sum().backward()
        model.clip_grad_norms_(1.0)
        optimizer.step()
        if not run.holding:
            scheduler.step()
            run.clock += 1
        optimizer.zero_grad()
        for g, weights in run.frozen.items():  # Adam's momentum would still move a stopped BAE
            for parameter, kept in zip(model.parameters(), weights, strict=True):
                parameter.data[g] = kept
        history.record(run.active, losses)
        run.n = n + 1
        stopping = [g for g in run.active if run.ends.get(g) == run.clock]
        converging = monitor is not None and monitor.due(n)
        draining = drain_hold is not None and (n + 1) % drain_hold.check_every == 0
        if checks is not None and (converging or draining):
            errors, entropies = [math.nan] * len(sets), [math.nan] * len(sets)
            rows = checks if members is None else checks[members]
            for g, error, bits in zip(run.active, *_check(model, rows, members), strict=True):
                errors[g], entropies[g] = error, bits
            if draining and drain_hold is not None:
                for g in run.active:
                    run.drain_entropies[g].append(entropies[g])
                # only once the objective is whole, before the final phase, and never so long
                # that the rest of the schedule would not fit in the steps left
                room = limit - (n + 1) - drain_hold.check_every >= n_steps - run.clock
                falling = any(drain_hold.draining(run.drain_entropies[g]) for g in run.active)
                whole = run.clock >= ramp_end and schedule.covariance_on(run.clock)
                run.holding = room and falling and whole
                shown = progress_bits([entropies[g] for g in run.active])  # read at the check
                bar.set_postfix(held=n + 1 - run.clock, bits=shown, refresh=False)
            if converging and monitor is not None:
                for g in monitor.update(run.clock - 1, errors, entropies):
                    if final > 0 and run.clock < n_steps and schedule.covariance_on(run.clock):
                        # the last fraction of its training without the term, as without the rule
                        more = math.ceil(final / (1 - final) * run.clock)
                        run.ends[g] = min(n_steps, run.clock + more)
                    else:
                        stopping.append(g)
        for g in stopping:
            run.frozen[g] = [p.data[g].clone() for p in model.parameters()]
            run.taken[g] = n + 1
        if stopping:
            run.active = [g for g in run.active if g not in run.frozen]
            members = torch.tensor(run.active, device=device) if run.active else None
        finished = len(run.frozen) == len(sets) or run.clock == n_steps
        if finished:
            break
        if saver is not None and saver.due():
            saver.save(state(), finished=False)
    if saver is not None and not saver.finished:
        saver.save(state(), finished=True)
    history.flush()
    steps = [run.taken.get(g, run.n) for g in range(len(sets))]
    return StackedTraining([sae.to(device) for sae in model.unstack()], history.histories, steps)
