"""Activations: hook points checked, harvested once into a cache, or gathered at chosen positions.

``harvest_activations`` / ``ActivationCache``: every token's state of some hooks, on disk.
``harvest_layer``: one layer, cleaned, scaled and split, ready to train and evaluate models on.
``gather_states`` / ``prompt_states``: only the positions an experiment reads (tracing, steering).
"""

from sae_lens_bae.activations.cache import META_FILE, ActivationCache, harvest_activations
from sae_lens_bae.activations.hooks import (
    check_hooks,
    check_layers,
    hook_point,
    hook_width,
    layer_of,
    stop_layer,
    unembeds_residual,
)
from sae_lens_bae.activations.layer import (
    LayerActivations,
    drop_outliers,
    harvest_layer,
    held_out_splits,
    norm_scale,
    outlier_mask,
    sequence_splits,
)
from sae_lens_bae.activations.states import gather_states, prompt_states

__all__ = [
    "META_FILE",
    "ActivationCache",
    "LayerActivations",
    "check_hooks",
    "check_layers",
    "drop_outliers",
    "gather_states",
    "harvest_activations",
    "harvest_layer",
    "held_out_splits",
    "hook_point",
    "hook_width",
    "layer_of",
    "norm_scale",
    "outlier_mask",
    "prompt_states",
    "sequence_splits",
    "stop_layer",
    "unembeds_residual",
]
