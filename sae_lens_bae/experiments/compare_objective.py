"""The loss a trained model optimised, read on held-out rows: ``bae compare`` chooses each
family's learning rate by it (``training_objective``)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from sae_lens.saes.sae import TrainStepInput
from torch import Tensor

__all__ = ["training_objective"]


@torch.no_grad()
def training_objective(sae: Any, states: Tensor, batch_size: int, steps: int) -> float:
    """The loss ``sae`` trained on (its ``training_forward_pass``, the coefficients at their
    final values, no dead-latent term), averaged over whole minibatches of ``batch_size`` rows
    of ``states``: how well a run optimised its own objective, whatever its sparsity. Read on a
    copy, so the model's running statistics do not move."""
    copied = copy.deepcopy(sae)
    coefficients = {
        name: getattr(value, "value", value) for name, value in copied.get_coefficients().items()
    }
    losses = []
    for start in range(0, states.shape[0] - batch_size + 1, batch_size):
        step = TrainStepInput(
            sae_in=states[start : start + batch_size].to(sae.W_dec.device, sae.W_dec.dtype),
            coefficients=coefficients, dead_neuron_mask=None, n_training_steps=steps - 1,
            is_logging_step=False,
        )  # fmt: skip
        losses.append(float(copied.training_forward_pass(step).loss))
    if not losses:
        raise ValueError(f"{states.shape[0]} rows make no minibatch of {batch_size}")
    return sum(losses) / len(losses)
