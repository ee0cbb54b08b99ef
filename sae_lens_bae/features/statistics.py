"""Per-model feature statistics: the columns of the BAE-vs-SAE comparison table.

Which definition each count follows (see also ``docs/research/feature-study.md``):

* ``activated``: the paper's ComSem definition: every token's top-k features over *all*
  channels by the model's magnitude (``top_k_records(..., candidates="all")``: for a BAE the
  two-sided burstiness log2|h_B - p|, so a mostly-on channel that is off counts), and a feature is
  activated with at least ``n_explain + 1`` records (Algorithm 1). ``activated_strict``: the same
  records, more than ``TABLE_1_MIN_RECORDS`` = 8 of them (Table 1's caption). ``activated_firing``:
  ours before, top-k over firing channels only and more than ``activated_min_samples`` records.
* ``active_frequency`` per channel: how often a channel is in its informative state: an SAE
  latent's firing frequency, a BAE bit's rarity ``min(p, 1 - p)`` (its rare state, whichever of
  0/1 that is; see ``saes.canonical``). ``dead`` (never active), ``constant`` (active on fewer
  than ``constant_threshold`` of the tokens: no information), ``dense`` (active on more than
  ``dense_threshold``) and ``frequent`` (more than ``frequent_threshold``) count on it, for both.
  A BAE bit's rarity is at most 1/2, so at the default ``dense_threshold`` = 1/2 a BAE has no
  dense bit by construction; ``frequent`` compares the two kinds fairly, and
  ``firing_over_half`` counts a BAE's raw code bits on for more than half of the tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.evaluation import evaluate_sae
from sae_lens_bae.features.burstiness import code_prior
from sae_lens_bae.features.records import FeatureRecords
from sae_lens_bae.saes.resampling import CONSTANT_RARITY

__all__ = [
    "TABLE_1_MIN_RECORDS",
    "active_frequency",
    "decoder_covariance_norm",
    "feature_statistics",
]

TABLE_1_MIN_RECORDS = 8
"""The paper's Table 1 counts a feature activated with more than this many records."""


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


def active_frequency(
    sae: Any, activations: Float[Tensor, "n d_in"], firing_rates: Float[Tensor, " d_sae"]
) -> tuple[Float[Tensor, " channels"], Float[Tensor, " channels"]]:
    """Per channel, the fraction of ``activations`` on which it is in its informative state (a
    BAE code bit's rarity min(p, 1 - p) with p its mean code here, an SAE latent's firing rate),
    and the fraction on which it is on (p, or the firing rate)."""
    if hasattr(sae, "encode_bits"):
        p = code_prior(sae, activations, source="evaluation")
        return torch.minimum(p, 1.0 - p), p
    return firing_rates.float(), firing_rates.float()


def feature_statistics(
    sae: Any,
    activations: Float[Tensor, "n d_in"],
    records: FeatureRecords | None = None,
    *,
    firing_records: FeatureRecords | None = None,
    n_explain: int = 5,
    activated_min_samples: int = 8,
    dense_threshold: float = 0.5,
    constant_threshold: float = CONSTANT_RARITY,
    frequent_threshold: float = 0.1,
    targets: Float[Tensor, "n d_out"] | None = None,
) -> dict[str, Any]:
    """Held-out reconstruction loss, explained variance, L0 and firing rates (``evaluate_sae``),
    the decoder covariance norm, the per-channel ``active_frequency`` and its counts (``dead``,
    ``constant``, ``dense``, ``frequent``), and, given records, ``activated`` (``records`` made
    over all channels: at least ``n_explain + 1`` records) and ``activated_firing``
    (``firing_records``: more than ``activated_min_samples``). See the module for the
    definitions. ``targets``: a transcoder's output hook point (errors are measured against
    them)."""
    stats = evaluate_sae(sae, activations, dense_threshold=dense_threshold, targets=targets)
    stats["decoder_covariance_norm"] = decoder_covariance_norm(sae.W_dec)
    frequency, on = active_frequency(sae, activations, stats["firing_rates"])
    stats["active_frequency"] = frequency
    stats["channels"] = int(frequency.numel())
    # per token, the channels in their informative state, averaged: an SAE's L0, and a BAE's
    # bits in their rare state (each bit is rare on min(p, 1 - p) of the tokens)
    stats["l0_rare"] = float(frequency.double().sum())
    stats["dead"] = int((frequency == 0).sum())
    stats["constant"] = int((frequency < constant_threshold).sum())
    stats["dense"] = int((frequency > dense_threshold).sum())
    stats["frequent"] = int((frequency > frequent_threshold).sum())
    stats["firing_over_half"] = int((on > 0.5).sum())
    stats["thresholds"] = {
        "dense": dense_threshold,
        "constant": constant_threshold,
        "frequent": frequent_threshold,
        "n_explain": n_explain,
        "activated_min_samples": activated_min_samples,
    }
    if records is not None:  # at least n_explain + 1 records (Algorithm 1); more than 8 (Table 1)
        stats["activated"] = records.activated(n_explain)
        stats["activated_strict"] = records.activated(TABLE_1_MIN_RECORDS)
    if firing_records is not None:
        stats["activated_firing"] = firing_records.activated(activated_min_samples)
    return stats
