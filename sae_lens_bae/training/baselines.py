"""The model families of a BAE-vs-SAE comparison: a BAE and SAELens' SAE architectures, each at a
sparsity setting, each with the dead-latent remedy it has, trained by the same schedule."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAEConfig
from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAEConfig
from sae_lens.saes.standard_sae import StandardTrainingSAEConfig
from sae_lens.saes.topk_sae import TopKTrainingSAEConfig

from sae_lens_bae.saes.bae_recipes import bae_config
from sae_lens_bae.saes.gated_relu import GatedReLUTrainingSAEConfig

__all__ = [
    "FAMILIES",
    "TRAINED_BASELINES",
    "baseline_configs",
    "family_config",
    "shared_schedule",
]

FAMILIES = {
    "bae": "coefficient_scale",
    "topk": "k",
    "batchtopk": "k",
    "jumprelu": "l0_coefficient",
    "standard": "l1_coefficient",
    "gated_relu": "l1_coefficient",
}
"""Each family and what its sparsity setting is: a multiple of the BAE recipe's a_e and a_c,
TopK's k, JumpReLU's L0 coefficient, an L1 coefficient."""

JUMPRELU_PRE_ACT_COEFFICIENT = 3e-6
"""JumpReLU's remedy: SAELens' pre-activation loss on dead latents, at Anthropic's coefficient."""


def remedy_window(steps: int) -> int:
    """Steps after which a silent latent counts as dead: 1/16 of the run, so every run gets the
    same number of chances whatever its length (SAELens' 1000-step default is half of a
    2000-step run), and at least 25 steps, so that a latent is judged on more than a few
    minibatches."""
    return max(25, steps // 16)


def shared_schedule(lr: float, steps: int) -> dict[str, Any]:
    """The ``SAETrainerConfig`` fields every family trains with: Adam at ``lr``, warm-up over
    the first 5% of steps, linear decay to 0 over the last 20% (SAELens' ``constant`` schedule ends
    its decay at 0 whatever ``lr_end``), and the dead-latent window
    (TopK's AuxK and JumpReLU's pre-activation loss read it; the standard SAE has no remedy in
    SAELens, the BAE none of its own)."""
    return {
        "lr": lr,
        "lr_end": lr / 10,
        "lr_warm_up_steps": steps // 20,
        "lr_decay_steps": steps // 5,
        "dead_feature_window": remedy_window(steps),
    }


def family_config(
    family: str, d_in: int, d_sae: int, setting: float, steps: int, **bae_fields: Any
) -> Any:
    """The training config of ``family`` at sparsity ``setting`` (``FAMILIES``), with no
    activation normalisation: callers scale activations once for every model. ``bae_fields``
    replace the BAE's config fields (a recipe variant); the other families take none."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose from {', '.join(FAMILIES)}")
    if family == "bae":
        # the setting scales the recipe's coefficients: a field replacing one would drop it
        owned = {"recipe", "coefficient_scale", "entropy_coefficient", "covariance_coefficient"}
        taken = sorted(owned & set(bae_fields))
        if taken:
            raise ValueError(f"{family} sets {', '.join(taken)} from its setting, not as fields")
        return bae_config(
            d_in, d_sae, coefficient_scale=setting, training_steps=steps, **bae_fields
        )
    if bae_fields:
        raise ValueError(f"{family} takes no BAE fields, got {', '.join(sorted(bae_fields))}")
    common: dict[str, Any] = {"d_in": d_in, "d_sae": d_sae, "normalize_activations": "none"}
    if family in ("topk", "batchtopk"):
        if setting != int(setting) or not 1 <= setting <= d_sae:
            raise ValueError(f"{family}'s k must be a whole number in [1, d_sae], got {setting}")
        config = TopKTrainingSAEConfig if family == "topk" else BatchTopKTrainingSAEConfig
        return config(**common, k=int(setting))
    if family == "jumprelu":
        return JumpReLUTrainingSAEConfig(
            **common, l0_coefficient=setting, pre_act_loss_coefficient=JUMPRELU_PRE_ACT_COEFFICIENT
        )
    config = StandardTrainingSAEConfig if family == "standard" else GatedReLUTrainingSAEConfig
    return config(**common, l1_coefficient=setting)


TRAINED_BASELINES = {
    "standard": ("standard", 5.0),
    "topk15": ("topk", 15),
    "topk": ("topk", 100),
    "jumprelu": ("jumprelu", 1.0),
    "batchtopk": ("batchtopk", 100),
    "gated_relu": ("gated_relu", 5.0),
}
"""Named baselines, each a family of ``FAMILIES`` at one setting: SAELens' defaults for k (100)
and the L0 coefficient (1), an L1 coefficient of 5 (the settings these names always trained
at), and ``topk15``, the paper's k = 15."""


def baseline_configs(d_in: int, expansion: int, names: Sequence[str], steps: int) -> dict[str, Any]:
    """Training configs of the named baselines (``TRAINED_BASELINES``), d_sae = expansion * d_in,
    built as ``family_config`` builds every family of a comparison (its dead-latent remedy
    included) for a run of ``steps`` steps."""
    unknown = [name for name in names if name not in TRAINED_BASELINES]
    if unknown:
        raise ValueError(f"Unknown baselines {unknown}; choose from {list(TRAINED_BASELINES)}")
    configs = {}
    for name in names:
        family, setting = TRAINED_BASELINES[name]
        configs[name] = family_config(family, d_in, expansion * d_in, setting, steps)
    return configs
