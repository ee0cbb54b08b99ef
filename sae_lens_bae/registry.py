"""Registration of this package's architectures with SAELens, through SAELens' public calls only
(``register_sae_class``, ``register_sae_training_class``).

SAELens refuses a name that is taken and offers no call that replaces an entry. A name already
held by this package's own classes (a second :func:`register_all`, or a notebook's
``importlib.reload`` of a module that defines them) is left as it is: SAELens keeps building the
classes registered first, and the reloaded module's classes stay unregistered. A name held by
another package's classes is refused.
"""

from __future__ import annotations

from typing import Any

from sae_lens.registry import (
    get_sae_class,
    get_sae_training_class,
    register_sae_class,
    register_sae_training_class,
)
from sae_lens.saes.sae import SAE, SAEConfig, TrainingSAE, TrainingSAEConfig

from sae_lens_bae.saes import bae, gated_relu


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _register_one(
    lookup: Any, register: Any, architecture: str, classes: tuple[type, type]
) -> None:
    try:
        registered = lookup(architecture)
    except KeyError:
        register(architecture, *classes)
        return
    if tuple(map(_qualname, registered)) != tuple(map(_qualname, classes)):
        raise ValueError(
            f"SAELens architecture {architecture!r} is already registered by "
            f"{_qualname(registered[0])}; sae_lens_bae cannot register {_qualname(classes[0])} "
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
    _register_one(get_sae_class, register_sae_class, architecture, (sae_class, config_class))
    _register_one(
        get_sae_training_class,
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
