"""SAELens baseline architectures, configured to be compared with a BAE on the same activations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAEConfig
from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAEConfig
from sae_lens.saes.standard_sae import StandardTrainingSAEConfig
from sae_lens.saes.topk_sae import TopKTrainingSAEConfig

from sae_lens_bae.saes.gated_relu import GatedReLUTrainingSAEConfig

__all__ = ["BASELINES", "TRAINED_BASELINES", "baseline_configs"]

BASELINES = (
    "standard",
    "standard_rescaled",
    "topk15",
    "topk",
    "jumprelu",
    "batchtopk",
    "gated_relu",
    "transcoder",
)
"""Every baseline known here. ``topk15`` is the paper's k = 15, ``topk`` SAELens' default k;
``standard_rescaled`` is the standard SAE read through per-channel z-scores (no training of its
own); ``transcoder`` maps the MLP's input to the layer's residual output
(``sae_lens_bae.training.transcoder``)."""

TRAINED_BASELINES = ("standard", "topk15", "topk", "jumprelu", "batchtopk", "gated_relu")
"""The baselines ``baseline_configs`` builds: SAEs of one hook point trained with SAELens'
``SAETrainer``, each its own model (``standard_rescaled`` reads the standard SAE)."""


def baseline_configs(
    d_in: int, expansion: int, names: Sequence[str], l1_coefficient: float = 5.0
) -> dict[str, Any]:
    """Training configs of the SAELens baselines among ``names`` (d_sae = expansion * d_in, no
    activation normalisation: callers scale activations once for every model). ``standard`` comes
    along with ``standard_rescaled``, which reads the same SAE."""
    unknown = [name for name in names if name not in BASELINES]
    if unknown:
        raise ValueError(f"Unknown baselines {unknown}; choose from {list(BASELINES)}")
    d_sae = expansion * d_in
    common = {"d_in": d_in, "d_sae": d_sae, "normalize_activations": "none"}
    configs: dict[str, Any] = {
        "standard": StandardTrainingSAEConfig(**common, l1_coefficient=l1_coefficient),
        "topk15": TopKTrainingSAEConfig(**common, k=15),
        "topk": TopKTrainingSAEConfig(**common),
        "jumprelu": JumpReLUTrainingSAEConfig(**common),
        "batchtopk": BatchTopKTrainingSAEConfig(**common),
        "gated_relu": GatedReLUTrainingSAEConfig(**common, l1_coefficient=l1_coefficient),
    }
    wanted = set(names) | ({"standard"} if "standard_rescaled" in names else set())
    return {name: c for name, c in configs.items() if name in wanted}
