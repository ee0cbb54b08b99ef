"""Architectures, one module each (as in ``sae_lens.saes``)."""

from sae_lens_bae.saes.bae import BAE, BAEConfig, BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.saes.loading import load_sae

__all__ = ["BAE", "BAEConfig", "BAETrainingSAE", "BAETrainingSAEConfig", "load_sae"]
