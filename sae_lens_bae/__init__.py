"""sae-lens-bae: the Binary Autoencoder (BAE) for SAELens and TransformerLens.

Importing the package registers the ``"bae"`` architecture (inference and training classes) with
SAELens, so ``SAE.load_from_disk``, ``LanguageModelSAETrainingRunner`` and
``MultiSAETrainingRunner`` accept BAEs like any built-in architecture.
"""

from importlib import metadata

from sae_lens_bae.activations import ActivationCache, harvest_activations
from sae_lens_bae.compression import compress, decompress
from sae_lens_bae.entropy import EntropyEstimate, estimate_entropy
from sae_lens_bae.features import burstiness
from sae_lens_bae.losses import (
    bae_objective,
    covariance_penalty,
    minibatch_entropy,
    reconstruction_loss,
)
from sae_lens_bae.models import load_model
from sae_lens_bae.registry import register_all as _register_all
from sae_lens_bae.saes.bae import (
    BAE,
    DEFAULT_BATCH_SIZE,
    DEFAULT_LR,
    BAEConfig,
    BAETrainingSAE,
    BAETrainingSAEConfig,
)
from sae_lens_bae.saes.binary import bits_to_values
from sae_lens_bae.saes.loading import load_sae
from sae_lens_bae.steering import steer, steering_hook, task_vector
from sae_lens_bae.training import (
    TrainingRun,
    activation_batches,
    fill_training_schedule,
    train_bae,
    train_sae,
)

_register_all()

__version__ = metadata.version("sae-lens-bae")  # one version: pyproject.toml's

__all__ = [
    "BAE",
    "ActivationCache",
    "EntropyEstimate",
    "TrainingRun",
    "burstiness",
    "compress",
    "decompress",
    "estimate_entropy",
    "harvest_activations",
    "load_model",
    "load_sae",
    "steer",
    "steering_hook",
    "task_vector",
    "train_sae",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_LR",
    "BAEConfig",
    "BAETrainingSAE",
    "BAETrainingSAEConfig",
    "activation_batches",
    "bae_objective",
    "bits_to_values",
    "covariance_penalty",
    "fill_training_schedule",
    "minibatch_entropy",
    "reconstruction_loss",
    "train_bae",
]
