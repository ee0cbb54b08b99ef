"""Training a BAE through SAELens' own ``SAETrainer`` and runners.

``train_bae`` / ``train_sae`` train on activations you already have (a tensor or an iterator of
batches, e.g. from an ``ActivationCache``);
``fill_training_schedule`` prepares a SAELens runner config so that the BAE knows when to switch
its entropy term on (after 25% of training by default).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from jaxtyping import Float
from sae_lens import LanguageModelSAERunnerConfig
from sae_lens.config import SAETrainerConfig
from sae_lens.multi_sae_training_runner import MultiSAETrainingRunnerConfig
from sae_lens.saes.sae import TrainingSAE, TrainingSAEConfig, TrainStepOutput
from sae_lens.training.sae_trainer import SAETrainer
from torch import Tensor

from sae_lens_bae.losses import reconstruction_loss
from sae_lens_bae.saes.bae import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_LR,
    BAETrainingSAE,
    BAETrainingSAEConfig,
)

__all__ = [
    "RecordingTrainer",
    "TrainingRun",
    "activation_batches",
    "fill_training_schedule",
    "train_bae",
    "train_sae",
]


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


class RecordingTrainer(SAETrainer[Any, Any]):
    """SAELens' ``SAETrainer`` that also keeps a loss history, through its public ``step`` seam.

    Every ``record_every`` steps it stores the step's losses, its scalar metrics and
    ``reconstruction_loss`` (mean over batch and d_in, comparable across architectures).
    """

    def __init__(self, *args: Any, record_every: int = 10, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.record_every = record_every
        self.history: list[dict[str, float]] = []

    def step(self, batch: Tensor) -> TrainStepOutput:
        output = super().step(batch)
        if self.n_training_steps % self.record_every == 0:
            with torch.no_grad():
                row = {"step": float(self.n_training_steps)}
                row["reconstruction_loss"] = reconstruction_loss(
                    output.sae_out, output.sae_in
                ).item()
                for name, value in {**output.losses, **output.metrics}.items():
                    value = value() if callable(value) else value
                    if isinstance(value, Tensor) and value.numel() == 1:
                        value = value.item()
                    if isinstance(value, (int, float)):
                        row[name] = float(value)
            self.history.append(row)
        return output


@dataclass
class TrainingRun:
    """A trained SAE and its recorded loss history."""

    sae: TrainingSAE[Any]
    history: list[dict[str, float]] = field(default_factory=list)


def train_sae(
    activations: Float[Tensor, "n d_in"] | Iterable[Float[Tensor, "batch d_in"]],
    cfg: TrainingSAEConfig,
    *,
    training_samples: int | None = None,
    epochs: float | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    lr: float = DEFAULT_LR,
    device: str = "cpu",
    seed: int = 0,
    record_every: int = 10,
    **trainer_kwargs: Any,
) -> TrainingRun:
    """Train any SAELens architecture (a BAE or a baseline) with ``SAETrainer`` on activations
    that are already computed, keeping a loss history.

    Args:
        activations: a ``[n, d_in]`` tensor (iterated in reshuffled epochs, ``seed`` fixing the
            order) or any iterator of ``[batch_size, d_in]`` batches.
        cfg: the training config of the SAE (e.g. ``BAETrainingSAEConfig``,
            ``TopKTrainingSAEConfig``).
        training_samples / epochs: length of training; give one (epochs needs a tensor).
        trainer_kwargs: any further ``SAETrainerConfig`` field (``checkpoint_path``,
            ``n_checkpoints``, ``lr_scheduler_name``, ``logger``...).
    """
    if isinstance(activations, Tensor):
        if activations.ndim != 2 or activations.shape[1] != cfg.d_in:
            raise ValueError(
                f"activations must be [n, d_in={cfg.d_in}], got {tuple(activations.shape)}"
            )
        if epochs is not None:
            training_samples = int(epochs * activations.shape[0])
        data: Iterator[Tensor] = activation_batches(activations, batch_size, seed=seed)
    else:
        if epochs is not None:
            raise ValueError("epochs needs an activation tensor; give training_samples instead")
        data = iter(activations)
    if training_samples is None:
        raise ValueError("Say how long to train: training_samples=... or epochs=...")
    trainer_cfg = SAETrainerConfig(
        total_training_samples=training_samples,
        train_batch_size_samples=batch_size,
        lr=lr,
        lr_end=trainer_kwargs.pop("lr_end", lr),
        device=device,
        **trainer_kwargs,
    )
    if isinstance(cfg, BAETrainingSAEConfig) and cfg.total_training_steps is None:
        cfg = replace(cfg, total_training_steps=trainer_cfg.total_training_steps)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        sae = TrainingSAE.from_dict(cfg.to_dict())
    trainer = RecordingTrainer(
        cfg=trainer_cfg, sae=sae, data_provider=data, record_every=record_every
    )
    return TrainingRun(trainer.fit(), trainer.history)


def train_bae(
    activations: Float[Tensor, "n d_in"] | Iterable[Float[Tensor, "batch d_in"]],
    cfg: BAETrainingSAEConfig | None = None,
    **kwargs: Any,
) -> BAETrainingSAE:
    """Train a BAE on activations that are already computed (see :func:`train_sae` for the
    arguments); ``cfg`` defaults to ``BAETrainingSAEConfig(d_in=activations' width)``."""
    if cfg is None:
        if not isinstance(activations, Tensor):
            raise ValueError("Pass cfg=BAETrainingSAEConfig(d_in=...) when streaming batches")
        cfg = BAETrainingSAEConfig(d_in=activations.shape[-1])
    return train_sae(activations, cfg, **kwargs).sae  # type: ignore[return-value]
