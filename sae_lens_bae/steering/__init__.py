"""Steering: task vectors built from BAE (or SAE) features, added through TransformerLens hooks."""

from sae_lens_bae.steering.hooks import Positions, steer, steering_hook
from sae_lens_bae.steering.icl import (
    SteeredClassifier,
    SteerICLConfig,
    label_accuracy,
    prompt_states,
    run_steer_icl,
)
from sae_lens_bae.steering.vectors import feature_difference, mean_difference, task_vector

__all__ = [
    "Positions",
    "SteerICLConfig",
    "SteeredClassifier",
    "feature_difference",
    "label_accuracy",
    "mean_difference",
    "prompt_states",
    "run_steer_icl",
    "steer",
    "steering_hook",
    "task_vector",
]
