"""Extreme states: the one rule every path into a BAE applies to its training states.

A state is **extreme** when its L2 norm is above ``max_norm_ratio`` (``NORM_RATIO``, 10) times
the median L2 norm of the states it is screened with. The median is a statistic no single state,
nor any share of them below one half, can move far: LLMs' attention-sink states (norms tens to
thousands of times the others') are found by it, and a set without them loses none of its states.

Where a path holds the whole set (a tensor or an activation cache given to ``train_sae``, a
harvest, the sets of ``estimate_entropies``), the median is the set's and the extreme states
are dropped before training (``drop_outliers``). Where states stream (SAELens' runners, an
iterator of batches), the BAE's training step screens each minibatch at its config's
``extreme_norm_ratio`` (``screen_step``) against the median norm of the global minibatch (every
rank of a data-parallel step gathers the norms, so the split does not change the rule); a
step's minibatch keeps its size (the ranks gather equal shares, and a dropped row would need the
host to learn the count), so each extreme row is replaced by the global minibatch's state of
median norm, and adds nothing of its own. A ratio of None keeps every state. Every path reports
how many states it set aside.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from jaxtyping import Bool, Float
from sae_lens.saes.sae import TrainStepInput
from torch import Tensor

__all__ = [
    "NORM_RATIO",
    "drop_outliers",
    "outlier_mask",
    "outliers_set_aside",
    "register_screen_count",
    "report_outliers",
    "screen_rows",
    "screen_step",
]

NORM_RATIO = 10.0
"""A state whose norm is above this many times the median norm is extreme."""

_COUNT_BUFFER = "extreme_rows_set_aside"

logger = logging.getLogger(__name__)


def outlier_mask(
    states: Float[Tensor, "n d"],
    max_norm_ratio: float | None = NORM_RATIO,
    *,
    reference: Float[Tensor, "m d"] | None = None,
) -> Bool[Tensor, " n"]:
    """True for the states to keep: norm at most ``max_norm_ratio`` times the median norm of
    ``reference`` (default: ``states`` themselves); all of them when ``max_norm_ratio`` is None.
    A mask, so paired sets (a transcoder's input and target, several hooks of one harvest) can
    drop the same rows. NaN or infinite states are kept, for the checks downstream to refuse;
    a median norm of 0 (a set mostly of zeros) makes no state extreme."""
    if max_norm_ratio is None:
        return torch.ones(states.shape[0], dtype=torch.bool, device=states.device)
    return ~_extreme(states, max_norm_ratio, reference)[0]


def _extreme(
    states: Tensor,
    max_norm_ratio: float,
    reference: Tensor | None = None,
    gather: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The rule, once for every path: (extreme, reference norms, median) of ``states`` [..., n,
    d] (a stack: one set or minibatch per leading index) against the median norm of its
    ``reference`` (default: themselves), whose norms ``gather`` makes those of the global
    minibatch where ``states`` are one rank's share; the median is [..., 1]. Extreme: norm above
    ``max_norm_ratio`` times the median, when that is not 0; a NaN or infinite norm is never
    extreme (the checks that refuse such states see it)."""
    norms = states.float().norm(dim=-1)
    against = norms if reference is None else reference.float().norm(dim=-1)
    against = against if gather is None else gather(against)
    median = against.nanmedian(dim=-1, keepdim=True).values
    extreme = (norms > max_norm_ratio * median) & (median > 0) & norms.isfinite()
    return extreme, against, median


def drop_outliers(
    states: Float[Tensor, "n d"], max_norm_ratio: float | None = NORM_RATIO
) -> tuple[Float[Tensor, "m d"], int]:
    """``states`` without the extreme ones (``outlier_mask``), and how many were dropped."""
    keep = outlier_mask(states, max_norm_ratio)
    dropped = int((~keep).sum())
    return (states[keep] if dropped else states), dropped


def report_outliers(dropped: int, total: int, where: str, max_norm_ratio: float | None) -> None:
    """Log how many of ``total`` states ``where`` set aside (a warning when any were)."""
    if max_norm_ratio is None:
        logger.info("%s: extreme states kept (no norm ratio)", where)
    elif dropped:
        logger.warning(
            "%s: %d of %d states set aside as extreme (norm above %g x the median norm)",
            where, dropped, total, max_norm_ratio,
        )  # fmt: skip


def register_screen_count(sae: torch.nn.Module, device: torch.device) -> None:
    """Give a training BAE, when built, the buffer its steps count the rows they set aside in:
    on the device (no wait for it in the step), moved with the SAE, and out of its state dict (a
    record of this process's steps, not a weight: in no checkpoint or saved inference model)."""
    count = torch.zeros((), dtype=torch.int64, device=device)
    sae.register_buffer(_COUNT_BUFFER, count, persistent=False)
    sae.register_load_state_dict_post_hook(_count_off_meta)


def _count_off_meta(sae: torch.nn.Module, _: Any) -> None:
    """SAELens' loaders build an SAE on the meta device and load its weights into it: the
    count, in no state dict, starts at 0 beside them (a meta tensor cannot be moved)."""
    count = getattr(sae, _COUNT_BUFFER)
    if count.is_meta:
        device = next((t.device for t in sae.parameters() if not t.is_meta), torch.device("cpu"))
        setattr(sae, _COUNT_BUFFER, torch.zeros_like(count, device=device))


def screen_step(sae: Any, step_input: TrainStepInput) -> TrainStepInput:
    """The step's input of a training BAE (``saes.bae.BAETrainingSAE``, which imports this) with
    its minibatch screened (``screen_rows`` at ``sae.cfg.extreme_norm_ratio``, through its
    ``batch`` seam); it logs the count on SAELens' logging steps."""
    ratio = sae.cfg.extreme_norm_ratio
    x = step_input.sae_in
    if ratio is None or x.numel() == 0:
        return step_input
    screened = screen_rows(sae, x.reshape(-1, x.shape[-1]), ratio).reshape(x.shape)
    if step_input.is_logging_step and outliers_set_aside(sae):
        logger.warning(
            "%d minibatch rows set aside as extreme so far (norm above %g x the minibatch's "
            "median norm)", outliers_set_aside(sae), ratio,
        )  # fmt: skip
    return replace(step_input, sae_in=screened)


def screen_rows(model: Any, x: Float[Tensor, "... n d"], ratio: float) -> Tensor:
    """Minibatch rows ``x`` of a training BAE (``[n, d]``) or of a stack of them (``[G, n, d]``,
    ``stacks.StackedBAE``) with each extreme row (against the median norm of its own global
    minibatch, through ``model.batch``) replaced by that minibatch's state of median norm. The
    count of the global minibatches' rows (the same on every rank) adds up in ``model``'s buffer
    on the device; ``outliers_set_aside`` reads it."""
    batch = model.batch  # the ranks' norms, gathered in rank order: one median for all
    extreme, norms, median = _extreme(x, ratio, gather=lambda n: batch.gather(n, -1))
    typical = _typical_row(batch, x, (norms - median).abs().argmin(dim=-1))
    counted = extreme.sum()
    getattr(model, _COUNT_BUFFER).add_(counted if batch.world == 1 else batch.sum(counted))
    return torch.where(extreme[..., None], typical, x)


def _typical_row(batch: Any, rows: Tensor, index: Tensor) -> Tensor:
    """Row ``index`` ([...], no host wait) of each global minibatch of ``rows`` [..., n, d], as
    [..., 1, d] on every rank: the rank holding it sends it, the others add zeros."""
    at = lambda i: rows.take_along_dim(i[..., None, None], dim=-2)  # noqa: E731
    if batch.world == 1:
        return at(index)
    n = rows.shape[-2]
    local = index - batch.rank * n
    mine = at(local.clamp(0, n - 1))
    held = ((local >= 0) & (local < n))[..., None, None]
    return batch.sum(torch.where(held, mine, torch.zeros_like(mine)))


def outliers_set_aside(sae: torch.nn.Module) -> int:
    """How many minibatch rows the SAE's training steps in this process have set aside as
    extreme (of the global minibatches, under data parallelism); 0 for an SAE that is not a
    training BAE."""
    count = getattr(sae, _COUNT_BUFFER, None)
    return 0 if count is None else int(count)
