"""Steering: task vectors built from BAE (or SAE) features, added through TransformerLens hooks."""

from sae_lens_bae.steering.classify import SteeredClassifier, label_accuracy
from sae_lens_bae.steering.hooks import Positions, steer, steering_hook
from sae_lens_bae.steering.vectors import feature_difference, mean_difference, task_vector

__all__ = [
    "Positions",
    "SteeredClassifier",
    "feature_difference",
    "label_accuracy",
    "mean_difference",
    "steer",
    "steering_hook",
    "task_vector",
]
