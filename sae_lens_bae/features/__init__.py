"""Feature extraction: burstiness magnitudes, top-k activation records and feature statistics."""

from sae_lens_bae.features.burstiness import burstiness, code_prior
from sae_lens_bae.features.records import (
    FeatureRecords,
    feature_magnitudes,
    records_from_text,
    top_k_records,
)
from sae_lens_bae.features.statistics import decoder_covariance_norm, feature_statistics

__all__ = [
    "FeatureRecords",
    "burstiness",
    "code_prior",
    "decoder_covariance_norm",
    "feature_magnitudes",
    "feature_statistics",
    "records_from_text",
    "top_k_records",
]
