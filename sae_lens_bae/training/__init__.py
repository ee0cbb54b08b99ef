"""Training: any SAELens architecture on cached activations through SAELens' ``SAETrainer``,
transcoders, and the baselines a BAE is compared with."""

from sae_lens_bae.training.baselines import (
    FAMILIES,
    TRAINED_BASELINES,
    baseline_configs,
    family_config,
    shared_schedule,
)
from sae_lens_bae.training.convergence import Convergence, ConvergenceMonitor, DrainHold
from sae_lens_bae.training.trainer import (
    RecordingTrainer,
    TrainingRun,
    activation_batches,
    save_in_input_units,
    train_bae,
    train_sae,
)
from sae_lens_bae.training.transcoder import train_transcoder

__all__ = [
    "FAMILIES",
    "Convergence",
    "ConvergenceMonitor",
    "DrainHold",
    "TRAINED_BASELINES",
    "RecordingTrainer",
    "TrainingRun",
    "activation_batches",
    "baseline_configs",
    "family_config",
    "save_in_input_units",
    "shared_schedule",
    "train_bae",
    "train_sae",
    "train_transcoder",
]
