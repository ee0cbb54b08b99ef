"""Registration of this package's architectures with SAELens' registries.

SAELens' ``register_sae_class`` raises when a name is taken, which would break a second import or
a notebook ``importlib.reload``. Registering here is idempotent: an entry left by an earlier load
of *our* classes is replaced by the current ones, while a name owned by someone else still raises.
"""

from __future__ import annotations

from typing import Any

from sae_lens.registry import (
    SAE_CLASS_REGISTRY,
    SAE_TRAINING_CLASS_REGISTRY,
    register_sae_class,
    register_sae_training_class,
)
from sae_lens.saes.sae import SAE, SAEConfig, TrainingSAE, TrainingSAEConfig

from sae_lens_bae.saes import bae, gated_relu


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _register_one(
    registry: dict[str, Any], register: Any, architecture: str, classes: tuple[type, type]
) -> None:
    existing = registry.get(architecture)
    if existing is None:
        register(architecture, *classes)
    elif tuple(map(_qualname, existing)) == tuple(map(_qualname, classes)):
        registry[architecture] = classes  # same classes from a reload: use the new objects
    else:
        raise ValueError(
            f"SAELens architecture {architecture!r} is already registered by "
            f"{_qualname(existing[0])}; sae_lens_bae cannot register {_qualname(classes[0])} "
            "under the same name."
        )


def register_architecture(
    architecture: str,
    sae_class: type[SAE[Any]],
    config_class: type[SAEConfig],
    training_class: type[TrainingSAE[Any]],
    training_config_class: type[TrainingSAEConfig],
) -> None:
    """Register the inference and the training class of one architecture (both are needed:
    a training config's constructor looks up its inference config)."""
    _register_one(SAE_CLASS_REGISTRY, register_sae_class, architecture, (sae_class, config_class))
    _register_one(
        SAE_TRAINING_CLASS_REGISTRY,
        register_sae_training_class,
        architecture,
        (training_class, training_config_class),
    )


def register_all() -> None:
    """Register every architecture this package defines."""
    register_architecture(
        bae.ARCHITECTURE, bae.BAE, bae.BAEConfig, bae.BAETrainingSAE, bae.BAETrainingSAEConfig
    )
    register_architecture(
        gated_relu.ARCHITECTURE,
        gated_relu.GatedReLUSAE,
        gated_relu.GatedReLUSAEConfig,
        gated_relu.GatedReLUTrainingSAE,
        gated_relu.GatedReLUTrainingSAEConfig,
    )
