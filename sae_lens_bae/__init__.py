"""sae-lens-bae: the Binary Autoencoder (BAE) for SAELens and TransformerLens.

Importing the package registers the ``"bae"`` architecture (inference and training classes) with
SAELens, so ``SAE.load_from_disk``, ``LanguageModelSAETrainingRunner`` and
``MultiSAETrainingRunner`` accept BAEs like any built-in architecture.
"""

import importlib
from importlib import metadata
from typing import TYPE_CHECKING, Any

from sae_lens_bae import kernels
from sae_lens_bae.activations import ActivationCache, harvest_activations
from sae_lens_bae.compression import compress, decompress
from sae_lens_bae.data import load_token_dataset
from sae_lens_bae.entropy import (
    CellEntropy,
    EntropyEstimate,
    EntropyRecipe,
    code_entropy,
    estimate_entropies,
    support_entropy,
)
from sae_lens_bae.features import burstiness, code_prior, top_k_records
from sae_lens_bae.models import load_model
from sae_lens_bae.registry import register_all as _register_all
from sae_lens_bae.saes.bae import BAE, BAEConfig, BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.saes.bae_recipes import BAE_RECIPES, DEFAULT_LR, bae_config
from sae_lens_bae.saes.loading import load_sae
from sae_lens_bae.steering import steer, steering_hook, task_vector
from sae_lens_bae.training import TrainingRun, train_bae, train_sae

if TYPE_CHECKING:  # imported on first use (``__getattr__``); named here for checkers and docs
    from sae_lens_bae.comsem import ClientConfig, ComSemConfig, comsem

_register_all()
# the architecture's one seam for a faster exact covariance penalty: every BAE the package
# trains (one, a stack, data-parallel) computes it through the kernels
BAETrainingSAE.covariance_penalty = staticmethod(kernels.covariance_penalty)

__version__ = metadata.version("sae-lens-bae")  # one version: pyproject.toml's

__all__ = [
    # models and text
    "load_model",
    "load_token_dataset",
    "harvest_activations",
    "ActivationCache",
    # the BAE as a SAELens architecture
    "BAE",
    "BAEConfig",
    "BAETrainingSAE",
    "BAETrainingSAEConfig",
    "BAE_RECIPES",
    "bae_config",
    "load_sae",
    # training
    "DEFAULT_LR",
    "TrainingRun",
    "train_bae",
    "train_sae",
    # entropy
    "CellEntropy",
    "EntropyEstimate",
    "EntropyRecipe",
    "code_entropy",
    "estimate_entropies",
    "support_entropy",
    # features, ComSem, steering, compression
    "burstiness",
    "code_prior",
    "top_k_records",
    "ClientConfig",
    "ComSemConfig",
    "comsem",
    "steer",
    "steering_hook",
    "task_vector",
    "compress",
    "decompress",
]

_LAZY = {name: "sae_lens_bae.comsem" for name in ("ClientConfig", "ComSemConfig", "comsem")}
"""Imported on first use: the LLM client's packages take seconds to import."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
