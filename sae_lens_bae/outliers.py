"""Extreme states: the one rule every path into a BAE applies to its training states.

A state is **extreme** when its L2 norm is above ``max_norm_ratio`` (``NORM_RATIO``, 10) times
the median L2 norm of the states it is screened with. The median is a statistic no single state,
nor any share of them below one half, can move far: LLMs' attention-sink states (norms tens to
thousands of times the others') are found by it, and a set without them loses none of its states.

Where a path holds the whole set (a tensor or an activation cache given to ``train_sae``, a
harvest, the sets of ``estimate_entropies``), the median is the set's and the extreme states
are dropped before training (``drop_outliers``). Where states stream (SAELens' runners, an
iterator of batches), the BAE's training step screens each minibatch against its own median
(``screen_step``); a step's minibatch keeps its size (the ranks of a data-parallel step gather
equal shares, and a dropped row would need the host to learn the count), so each extreme row is
replaced by the minibatch's state of median norm, and adds nothing of its own. A ratio of None
keeps every state. Every path reports how many states it set aside.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch
from jaxtyping import Bool, Float
from sae_lens.saes.sae import TrainStepInput
from torch import Tensor

__all__ = [
    "NORM_RATIO",
    "RATIO_ATTRIBUTE",
    "drop_outliers",
    "outlier_mask",
    "outliers_set_aside",
    "report_outliers",
    "screen_step",
]

NORM_RATIO = 10.0
"""A state whose norm is above this many times the median norm is extreme."""

RATIO_ATTRIBUTE = "outlier_norm_ratio"
"""The attribute of a training BAE its step reads the ratio from (``NORM_RATIO`` when unset;
None: keep every state), e.g. on the SAE given to SAELens' runner as ``override_sae``."""

_COUNT_ATTRIBUTE = "_outliers_set_aside"

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
    states: Tensor, max_norm_ratio: float, reference: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """The rule, once for every path: (extreme, norms, median) of ``states`` [n, d] against the
    median norm of ``reference`` (default: themselves). Extreme: norm above ``max_norm_ratio``
    times the median, when that is not 0; a NaN or infinite norm is never extreme (the checks
    that refuse such states see it)."""
    norms = states.float().norm(dim=-1)
    median = (norms if reference is None else reference.float().norm(dim=-1)).nanmedian()
    extreme = (norms > max_norm_ratio * median) & (median > 0) & norms.isfinite()
    return extreme, norms, median


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


def screen_step(sae: Any, step_input: TrainStepInput) -> TrainStepInput:
    """The step's input with each extreme row of its minibatch (against the minibatch's median
    norm, at the SAE's ``outlier_norm_ratio``) replaced by the minibatch's state of median
    norm. The count adds up on the device (no wait for it in the step); it is logged on
    SAELens' logging steps and read by ``outliers_set_aside``."""
    ratio = getattr(sae, RATIO_ATTRIBUTE, NORM_RATIO)
    x = step_input.sae_in
    if ratio is None or x.numel() == 0:
        return step_input
    rows = x.reshape(-1, x.shape[-1])
    extreme, norms, median = _extreme(rows, ratio)
    typical = rows.index_select(0, (norms - median).abs().argmin().reshape(1))  # no host wait
    screened = torch.where(extreme[:, None], typical, rows).reshape(x.shape)
    if getattr(sae, _COUNT_ATTRIBUTE, None) is None:  # moves with the SAE; not in its weights
        count = torch.zeros((), dtype=torch.int64, device=x.device)
        sae.register_buffer(_COUNT_ATTRIBUTE, count, persistent=False)
    getattr(sae, _COUNT_ATTRIBUTE).add_(extreme.sum())
    if step_input.is_logging_step and outliers_set_aside(sae):
        logger.warning(
            "%d minibatch rows set aside as extreme so far (norm above %g x the minibatch's "
            "median norm)", outliers_set_aside(sae), ratio,
        )  # fmt: skip
    return replace(step_input, sae_in=screened)


def outliers_set_aside(sae: Any) -> int:
    """How many minibatch rows the SAE's training steps have set aside as extreme."""
    count = getattr(sae, _COUNT_ATTRIBUTE, None)
    return 0 if count is None else int(count)
