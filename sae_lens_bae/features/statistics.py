"""Per-model feature statistics: the columns of the BAE-vs-SAE comparison table.

One definition of how often a latent is active, used by every table, plot and report
(``bae quickstart``, ``bae compare``, the firing-frequency and density plots, the dashboard):

* **active**: an SAE latent is active on a token when it fires (z != 0); a BAE bit when it is in
  its rare state (its bit differs from the bit's usual value on the tokens read: the bit of its
  canonical code is 1, see ``saes.canonical``). ``latent_activity`` decides it per token.
* **firing frequency** (``firing_frequency``): per latent, the fraction of tokens on which it is
  active; a BAE bit's rarity min(p, 1 - p).
* ``frequency_counts`` of it: **L0** (its sum: mean active latents per token), **dead** (0),
  **constant** (below ``CONSTANT_RARITY`` = 1e-4, dead ones included), **dense** (above
  ``DENSE_FREQUENCY`` = 0.1).
* ``activated``: the paper's ComSem definition: every token's top-k features over *all*
  latents by a magnitude (``top_k_records``), a feature activated with at least ``n_explain + 1``
  records (Algorithm 1); ``activated_strict``: more than ``TABLE_1_MIN_RECORDS`` = 8 of them
  (Table 1's caption). ``activated_firing``: top-k over firing latents only.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.evaluation import evaluate_sae
from sae_lens_bae.features.activity import latent_activity, rarity
from sae_lens_bae.features.burstiness import code_prior
from sae_lens_bae.features.records import FeatureRecords
from sae_lens_bae.saes.binary import CONSTANT_RARITY, DENSE_FREQUENCY
from sae_lens_bae.saes.input_frame import in_input_units

__all__ = [
    "DENSE_FREQUENCY",
    "TABLE_1_MIN_RECORDS",
    "latent_activity",
    "decoder_covariance_norm",
    "feature_statistics",
    "firing_frequency",
    "frequency_counts",
    "rarity",
]

TABLE_1_MIN_RECORDS = 8
"""The paper's Table 1 counts a feature activated with more than this many records."""


@torch.no_grad()
def firing_frequency(
    sae: Any, activations: Float[Tensor, "n d_in"], batch_size: int = 4096
) -> Float[Tensor, " latents"]:
    """Per latent, the fraction of ``activations`` on which it is active (``latent_activity``):
    an SAE latent's firing rate, a BAE bit's rarity min(p, 1 - p)."""
    if hasattr(sae, "encode_bits"):
        return rarity(code_prior(sae, activations, source="evaluation", batch_size=batch_size))
    total = None
    for start in range(0, activations.shape[0], batch_size):
        x = activations[start : start + batch_size].to(sae.W_dec.device, sae.W_dec.dtype)
        part = latent_activity(sae, x).sum(0, dtype=torch.float64).cpu()
        total = part if total is None else total + part
    if total is None:
        raise ValueError("firing_frequency needs at least one activation")
    return (total / activations.shape[0]).float()


def frequency_counts(
    frequency: Float[Tensor, " latents"],
    dense_threshold: float = DENSE_FREQUENCY,
    constant_threshold: float = CONSTANT_RARITY,
) -> dict[str, Any]:
    """What every report counts on the firing frequency: ``l0`` (its sum), ``dead``,
    ``constant``, ``dense`` and ``latents``."""
    frequency = frequency.detach().double().cpu()
    return {
        "l0": float(frequency.sum()),
        "dead": int((frequency == 0).sum()),
        "constant": int((frequency < constant_threshold).sum()),
        "dense": int((frequency > dense_threshold).sum()),
        "latents": int(frequency.numel()),
    }


@torch.no_grad()
def decoder_covariance_norm(W_dec: Float[Tensor, "d_sae d_in"]) -> float:
    """Spectral norm of the covariance matrix of the decoder's rows (the feature directions).

    Large when many features point along a few shared directions (redundant, entangled
    features); small when they spread out.
    """
    rows = W_dec.detach().double()
    if rows.shape[0] < 2:
        raise ValueError("decoder_covariance_norm needs at least two decoder rows")
    cov = torch.cov(rows.T)
    return float(torch.linalg.eigvalsh(cov).abs().max())


def feature_statistics(
    sae: Any,
    activations: Float[Tensor, "n d_in"],
    records: FeatureRecords | None = None,
    *,
    firing_records: FeatureRecords | None = None,
    n_explain: int = 5,
    activated_min_samples: int = 8,
    dense_threshold: float = DENSE_FREQUENCY,
    constant_threshold: float = CONSTANT_RARITY,
    targets: Float[Tensor, "n d_out"] | None = None,
) -> dict[str, Any]:
    """Held-out reconstruction loss and explained variance (``evaluate_sae``), the decoder
    covariance norm, the per-latent ``firing_frequency`` and its ``frequency_counts`` (``l0``,
    ``dead``, ``constant``, ``dense``), and, given records, ``activated`` (``records`` made over
    all latents: at least ``n_explain + 1`` records), ``activated_strict`` (more than 8) and
    ``activated_firing`` (``firing_records``: more than ``activated_min_samples``). See the
    module for the definitions. ``targets``: a transcoder's output hook point (errors are
    measured against them)."""
    stats = evaluate_sae(sae, activations, targets=targets)
    stats.pop("firing_rates")  # a BAE's raw bits: the frequency below is the one definition
    stats["decoder_covariance_norm"] = decoder_covariance_norm(in_input_units(sae).W_dec)
    frequency = firing_frequency(sae, activations)
    stats["firing_frequency"] = frequency
    stats.update(frequency_counts(frequency, dense_threshold, constant_threshold))
    stats["thresholds"] = {
        "dense": dense_threshold,
        "constant": constant_threshold,
        "n_explain": n_explain,
        "activated_min_samples": activated_min_samples,
    }
    if records is not None:  # at least n_explain + 1 records (Algorithm 1); more than 8 (Table 1)
        stats["activated"] = records.activated(n_explain)
        stats["activated_strict"] = records.activated(TABLE_1_MIN_RECORDS)
    if firing_records is not None:
        stats["activated_firing"] = firing_records.activated(activated_min_samples)
    return stats
