"""Training a BAE through SAELens' own ``SAETrainer`` and runners.

``train_bae`` trains on activations you already have (a tensor or an iterator of batches);
``fill_training_schedule`` prepares a SAELens runner config so that the BAE knows when to switch
its entropy term on (after 25% of training by default).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import torch
from jaxtyping import Float
from sae_lens import LanguageModelSAERunnerConfig
from sae_lens.config import SAETrainerConfig
from sae_lens.multi_sae_training_runner import MultiSAETrainingRunnerConfig
from sae_lens.training.sae_trainer import SAETrainer
from torch import Tensor

from sae_lens_bae.saes.bae import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_LR,
    BAETrainingSAE,
    BAETrainingSAEConfig,
)

__all__ = ["activation_batches", "fill_training_schedule", "train_bae"]


def fill_training_schedule(
    config: LanguageModelSAERunnerConfig[Any] | MultiSAETrainingRunnerConfig,
) -> LanguageModelSAERunnerConfig[Any] | MultiSAETrainingRunnerConfig:
    """Set ``total_training_steps`` on every BAE config inside a SAELens runner config.

    A BAE keeps its entropy term off for ``entropy_off_fraction`` of training, but SAELens does not
    tell an SAE how long training is. Call this once on the runner config; BAE configs with an
    explicit ``total_training_steps`` or ``entropy_off_steps`` are left as they are.
    """
    if isinstance(config, MultiSAETrainingRunnerConfig):
        sae_cfgs = list(config.saes.values())
    elif isinstance(config, LanguageModelSAERunnerConfig):
        sae_cfgs = [config.sae]
    else:
        raise TypeError(
            "fill_training_schedule takes a LanguageModelSAERunnerConfig or a "
            f"MultiSAETrainingRunnerConfig, got {type(config).__name__}"
        )
    for sae_cfg in sae_cfgs:
        if isinstance(sae_cfg, BAETrainingSAEConfig) and sae_cfg.total_training_steps is None:
            sae_cfg.total_training_steps = config.total_training_steps
            sae_cfg.add_training_info_to_metadata()
    return config


def activation_batches(
    activations: Float[Tensor, "n d_in"],
    batch_size: int = DEFAULT_BATCH_SIZE,
    *,
    shuffle: bool = True,
    seed: int = 0,
) -> Iterator[Float[Tensor, "batch d_in"]]:
    """Endless minibatches over a fixed activation set, reshuffled every epoch.

    The paper trains for many epochs over one set of hidden states; the last partial batch of an
    epoch is dropped so every minibatch entropy is measured on ``batch_size`` samples.
    """
    n = activations.shape[0]
    if n < batch_size:
        raise ValueError(
            f"Need at least batch_size={batch_size} activations to form a minibatch, got {n}"
        )
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for start in range(0, n - batch_size + 1, batch_size):
            yield activations[order[start : start + batch_size]]


def train_bae(
    activations: Float[Tensor, "n d_in"] | Iterable[Float[Tensor, "batch d_in"]],
    cfg: BAETrainingSAEConfig | None = None,
    *,
    training_samples: int | None = None,
    epochs: float | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    lr: float = DEFAULT_LR,
    device: str = "cpu",
    seed: int = 0,
    **trainer_kwargs: Any,
) -> BAETrainingSAE:
    """Train a BAE with SAELens' ``SAETrainer`` on activations that are already computed.

    Args:
        activations: a ``[n, d_in]`` tensor (iterated in reshuffled epochs) or any iterator of
            ``[batch_size, d_in]`` batches.
        cfg: the BAE training config; default ``BAETrainingSAEConfig(d_in=activations' width)``.
        training_samples / epochs: length of training; give one (epochs needs a tensor).
        trainer_kwargs: any further ``SAETrainerConfig`` field (``checkpoint_path``,
            ``n_checkpoints``, ``lr_scheduler_name``, ``logger``...).
    """
    if isinstance(activations, Tensor):
        if activations.ndim != 2:
            raise ValueError(f"activations must be [n, d_in], got {tuple(activations.shape)}")
        if epochs is not None:
            training_samples = int(epochs * activations.shape[0])
        data: Iterator[Tensor] = activation_batches(activations, batch_size, seed=seed)
        d_in = activations.shape[1]
    else:
        if epochs is not None:
            raise ValueError("epochs needs an activation tensor; give training_samples instead")
        data = iter(activations)
        d_in = cfg.d_in if cfg is not None else None
    if training_samples is None:
        raise ValueError("Say how long to train: training_samples=... or epochs=...")
    if cfg is None:
        if d_in is None:
            raise ValueError("Pass cfg=BAETrainingSAEConfig(d_in=...) when streaming batches")
        cfg = BAETrainingSAEConfig(d_in=d_in)
    trainer_cfg = SAETrainerConfig(
        total_training_samples=training_samples,
        train_batch_size_samples=batch_size,
        lr=lr,
        lr_end=trainer_kwargs.pop("lr_end", lr),
        device=device,
        **trainer_kwargs,
    )
    if cfg.total_training_steps is None:
        cfg = replace(cfg, total_training_steps=trainer_cfg.total_training_steps)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        sae = BAETrainingSAE(cfg)
    trainer: SAETrainer[BAETrainingSAE, BAETrainingSAEConfig] = SAETrainer(
        cfg=trainer_cfg, sae=sae, data_provider=data
    )
    return trainer.fit()
