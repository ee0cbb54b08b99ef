"""Stacks of BAEs: G BAEs of one config trained as one module (``model.StackedBAE``, its step the
architecture's with batched matmuls) by one trainer (``training.StackedTrainer``), with a stop
rule, a drain hold and checkpoints. Entropy estimation trains its BAEs this way."""

from sae_lens_bae.stacks.model import StackedBAE
from sae_lens_bae.stacks.training import StackedTrainer, StackedTraining, train_stacked_baes

__all__ = ["StackedBAE", "StackedTrainer", "StackedTraining", "train_stacked_baes"]
