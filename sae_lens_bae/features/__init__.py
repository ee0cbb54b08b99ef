"""Feature extraction: burstiness magnitudes, top-k activation records and feature statistics."""

from sae_lens_bae.features.burstiness import burstiness, code_prior
from sae_lens_bae.features.records import (
    FeatureRecords,
    feature_magnitudes,
    records_from_text,
    top_k_records,
)
from sae_lens_bae.features.statistics import (
    decoder_covariance_norm,
    feature_statistics,
    firing_frequency,
    frequency_counts,
    latent_activity,
)

__all__ = [
    "FeatureRecords",
    "burstiness",
    "latent_activity",
    "code_prior",
    "decoder_covariance_norm",
    "feature_magnitudes",
    "feature_statistics",
    "firing_frequency",
    "frequency_counts",
    "records_from_text",
    "top_k_records",
]
