"""Architectures, one module each (as in ``sae_lens.saes``)."""

from sae_lens_bae.saes.bae import BAE, BAEConfig, BAETrainingSAE, BAETrainingSAEConfig

__all__ = ["BAE", "BAEConfig", "BAETrainingSAE", "BAETrainingSAEConfig"]
