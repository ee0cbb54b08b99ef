"""The running mean code: a BAE's prior (the mean code the paper's burstiness reads, saved with
its weights as JumpReLU's threshold is), its update after each training step, and the buffers
that keep their dtype when the module is cast."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["CODE_MEAN_DECAY", "RUNNING_MEAN_BUFFERS", "apply_keeping_dtypes", "update_running_mean"]


CODE_MEAN_DECAY = 0.999
"""The mean code (the burstiness prior) is the exact mean of the first 1 / (1 - decay) training
minibatches, then an exponential average over about that many."""


@torch.no_grad()
def update_running_mean(
    mean: Tensor, count: Tensor, batch_mean: Tensor, decay: float = CODE_MEAN_DECAY
) -> None:
    """In place: the exact running mean for the first 1/(1-decay) updates, then an exponential
    average with weight 1 - decay. Tensor arithmetic only: a GPU step never waits for the host."""
    count += 1
    mean.lerp_(batch_mean, torch.clamp(count.reciprocal(), min=1.0 - decay))


RUNNING_MEAN_BUFFERS = ("code_mean", "code_mean_count")
"""A BAE's running mean-code buffers: never cast with its parameters (in bf16 the update count
stalls at 256 and small updates round away)."""


def apply_keeping_dtypes(
    apply: Callable[[], object], buffers: dict[str, Tensor | None], names: tuple[str, ...]
) -> None:
    """Run a module's ``_apply`` (``.to(dtype)``, ``.half()``, a device move) so that the named
    buffers follow device moves but keep their dtype and exact values."""
    before = {name: buffers[name] for name in names if buffers.get(name) is not None}
    apply()
    for name, old in before.items():
        new = buffers[name]
        if new is not None and new.dtype != old.dtype:
            buffers[name] = old.to(new.device)
