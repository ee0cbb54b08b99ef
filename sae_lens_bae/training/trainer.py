"""Training a BAE through SAELens' own ``SAETrainer`` and runners.

``train_bae`` / ``train_sae`` train on activations you already have (a tensor or an iterator of
batches, e.g. from an ``ActivationCache``), with the config as given: a BAE's phases are steps
of its config (``bae_config(..., training_steps=N)`` resolves a recipe's), so SAELens' runners
train one with no extra call. With ``checkpoint_dir`` a run writes
checkpoints, and ``resume=True`` continues from the newest complete one on exactly the same
minibatches: a killed and resumed run ends with the weights of an uninterrupted one.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from sae_lens.config import SAETrainerConfig
from sae_lens.saes.sae import TrainingSAE, TrainingSAEConfig, TrainStepOutput
from sae_lens.training.sae_trainer import SAETrainer
from torch import Tensor

from sae_lens_bae.activations.cache import ActivationCache
from sae_lens_bae.outliers import (
    NORM_RATIO,
    drop_outliers,
    outlier_mask,
    outliers_set_aside,
    report_outliers,
)
from sae_lens_bae.parallel.distributed import (
    batch_indices,
    data_parallel,
    is_distributed,
    rank_batches,
    rank_cache_batches,
    rank_world,
)
from sae_lens_bae.reports import read_json_list, write_json
from sae_lens_bae.saes.bae import BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.saes.bae_recipes import DEFAULT_BATCH_SIZE, DEFAULT_LR, bae_config
from sae_lens_bae.saes.input_frame import fix_frame_from_set
from sae_lens_bae.training.checkpoints import (
    DAMAGED_CHECKPOINT_FIX,
    check_checkpoint_files,
    check_resumable,
    fingerprint,
    latest_checkpoint,
    mark_complete,
    read_marker,
)

__all__ = [
    "HISTORY_FILE",
    "RecordingTrainer",
    "TrainingRun",
    "activation_batches",
    "save_in_input_units",
    "train_bae",
    "train_sae",
]

HISTORY_FILE = "history.json"
"""The loss history so far, in a ``RecordingTrainer`` checkpoint."""


def activation_batches(
    activations: Float[Tensor, "n d_in"],
    batch_size: int = DEFAULT_BATCH_SIZE,
    *,
    shuffle: bool = True,
    seed: int = 0,
    start: int = 0,
) -> Iterator[Float[Tensor, "batch d_in"]]:
    """Endless minibatches over a fixed activation set, reshuffled every epoch.

    The paper trains for many epochs over one set of hidden states; the last partial batch of an
    epoch is dropped so every minibatch entropy is measured on ``batch_size`` samples. ``start``
    skips that many batches of the same stream (a resumed run) without gathering them.
    """
    for index in batch_indices(
        activations.shape[0],
        batch_size,
        shuffle=shuffle,
        seed=seed,
        start=start,
        device=activations.device,
    ):
        yield activations[index]


class _Counted(Iterator[Tensor]):
    """An iterator that counts what it gave: the data position a checkpoint records."""

    def __init__(self, data: Iterator[Tensor], count: int = 0) -> None:
        self.data, self.count = data, count

    def __next__(self) -> Tensor:
        batch = next(self.data)
        self.count += 1
        return batch


class RecordingTrainer(SAETrainer[Any, Any]):
    """SAELens' ``SAETrainer`` that also keeps a loss history, through its public ``step`` seam.

    Every ``record_every`` steps it stores what SAELens logs of the step (its losses, among them
    ``mse_loss``, and its scalar metrics) and ``reconstruction_loss``, ``mse_loss / d_in`` (the
    squared error per element, the scale plots and tables read). Its
    checkpoints also hold the history and the number of batches read, and are marked complete
    last (``sae_lens_bae.training.checkpoints``); ``resume`` continues from one.
    """

    def __init__(self, *args: Any, record_every: int = 10, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.record_every = record_every
        self.history: list[dict[str, float]] = []
        self.marker_info: dict[str, Any] = {}  # more facts for every checkpoint's marker
        self._user_checkpoint_fn = self.save_checkpoint_fn
        self.save_checkpoint_fn = self._complete_checkpoint

    def _complete_checkpoint(self, checkpoint_path: Path | None) -> None:
        if self._user_checkpoint_fn is not None:
            self._user_checkpoint_fn(checkpoint_path=checkpoint_path)
        if checkpoint_path is None:
            return
        write_json(checkpoint_path / HISTORY_FILE, self.history)
        batches = self.data_provider.count if isinstance(self.data_provider, _Counted) else None
        # SAETrainer checkpoints inside a step, before it counts that step as done; its final
        # checkpoint after the last one
        in_step = not checkpoint_path.name.startswith("final_")
        mark_complete(
            checkpoint_path,
            n_training_samples=self.n_training_samples,
            n_training_steps=self.n_training_steps + in_step,
            batches_read=batches,
            **self.marker_info,
        )

    def resume(self, checkpoint: str | Path) -> dict[str, Any]:
        """Load the weights, running statistics, optimiser, schedules and history of a complete
        checkpoint (see ``latest_checkpoint``); returns its marker (``batches_read``...)."""
        checkpoint = Path(checkpoint)
        marker = read_marker(checkpoint)
        check_checkpoint_files(checkpoint)
        fix = DAMAGED_CHECKPOINT_FIX
        try:  # files that read, but were written for another model or trainer
            self.load_trainer_state(checkpoint)
            self.sae.load_weights_from_checkpoint(checkpoint)
        except (RuntimeError, KeyError, ValueError) as error:
            raise ValueError(f"{checkpoint} holds another model's state ({error}); {fix}") from None
        self.n_training_steps = int(marker["n_training_steps"])
        history = checkpoint / HISTORY_FILE
        self.history = (
            read_json_list(history, "a training loss history", fix) if history.is_file() else []
        )
        self.checkpoint_thresholds = [
            threshold
            for threshold in self.checkpoint_thresholds
            if threshold >= self.n_training_samples
        ]
        return marker

    def step(self, batch: Tensor) -> TrainStepOutput:
        output = super().step(batch)
        if self.n_training_steps % self.record_every == 0:
            with torch.no_grad():
                row = {"step": float(self.n_training_steps)}
                for name, value in {**output.losses, **output.metrics}.items():
                    value = value() if callable(value) else value
                    if isinstance(value, Tensor) and value.numel() == 1:
                        value = value.item()
                    if isinstance(value, (int, float)):
                        row[name] = float(value)
                row["reconstruction_loss"] = row["mse_loss"] / self.sae.cfg.d_in
            self.history.append(row)
        return output


@dataclass
class TrainingRun:
    """A trained SAE, its recorded loss history and how many training states were set aside
    as extreme (``sae_lens_bae.outliers``: dropped from a tensor or cache, or replaced in a
    BAE's minibatches)."""

    sae: TrainingSAE[Any]
    history: list[dict[str, float]] = field(default_factory=list)
    outliers_dropped: int = 0


def train_sae(
    activations: Float[Tensor, "n d_in"] | ActivationCache | Iterable[Float[Tensor, "batch d_in"]],
    cfg: TrainingSAEConfig,
    *,
    hook: str | None = None,
    training_samples: int | None = None,
    epochs: float | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    lr: float = DEFAULT_LR,
    device: str = "cpu",
    seed: int = 0,
    record_every: int = 10,
    checkpoint_dir: str | Path | None = None,
    n_checkpoints: int = 10,
    resume: bool = False,
    distributed: bool = False,
    outlier_norm_ratio: float | None = NORM_RATIO,
    **trainer_kwargs: Any,
) -> TrainingRun:
    """Train any SAELens architecture (a BAE or a baseline) with ``SAETrainer`` on activations
    that are already computed, keeping a loss history.

    Args:
        activations: a ``[n, d_in]`` tensor (iterated in reshuffled epochs, ``seed`` fixing the
            order), an ``ActivationCache`` (its ``hook``, the only one by default, which the SAE
            then names as its hook point) or any iterator of ``[batch_size, d_in]`` batches.
        cfg: the training config of the SAE (e.g. ``BAETrainingSAEConfig``,
            ``TopKTrainingSAEConfig``).
        training_samples: length of training in rows (give this or ``epochs``).
        epochs: length of training in passes over a tensor or cache.
        batch_size: rows per step (per rank when ``distributed``).
        checkpoint_dir: write ``n_checkpoints`` checkpoints there during training.
        resume: continue from the newest complete checkpoint in ``checkpoint_dir``, on the
            same minibatches as the interrupted run (an iterator of batches is read past the
            batches already trained on; it must give the same batches again). Give the same
            arguments as the interrupted run.
        distributed: this process is one of N ranks (``torchrun``, process group initialised):
            train a BAE on the global minibatch of N * ``batch_size`` rows
            (``sae_lens_bae.parallel.distributed``). A tensor must be the same on every rank
            (each reads its rows of the global batches: the stream is the one of a single process
            at batch N * ``batch_size``, so a tensor run resumes with any N at that global batch);
            a cache is read by blocks, one per rank (resume with the same N); an iterator must
            give this rank's batches. ``training_samples`` counts all ranks; rank 0 writes the
            checkpoints (resuming ranks read them: a file system they share).
        outlier_norm_ratio: extreme states (``sae_lens_bae.outliers``: norm above this times
            the median) are dropped from a tensor or a cache (against its median) before
            training; a BAE's step screens each minibatch of a stream instead (an iterator, a
            cache read in blocks by ranks) against the minibatch's: the BAE's config gets it as
            ``extreme_norm_ratio`` (in place of the one ``cfg`` holds; None where the set was
            screened whole). None keeps every state. The count (states of a set, minibatch rows
            of a stream) is logged and returned (``TrainingRun.outliers_dropped``).
        trainer_kwargs: any further ``SAETrainerConfig`` field (``lr_scheduler_name``,
            ``logger``...).
    """
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs the checkpoint_dir the interrupted run wrote to")
    if distributed and not is_distributed():
        raise ValueError(
            "distributed=True needs torch.distributed initialised: launch with torchrun and call "
            "torch.distributed.init_process_group first"
        )
    rank, world = rank_world() if distributed else (0, 1)
    info: dict[str, Any] = {"global_batch_size": batch_size * world, "world_size": world}
    if distributed and isinstance(activations, ActivationCache):
        info["data"] = "cache blocks"
    if isinstance(activations, Tensor) and checkpoint_dir is not None:
        settings = {
            "cfg": repr(sorted(cfg.to_dict().items())),
            "schedule": (lr, seed, training_samples, epochs),  # the global batch: checked apart
            "trainer": repr(trainer_kwargs),
            "outliers": outlier_norm_ratio,
        }
        info["inputs"] = fingerprint([activations], settings)
    checkpoint = latest_checkpoint(checkpoint_dir) if resume else None
    marker = check_resumable(checkpoint, info) if checkpoint else {}  # before any data is read
    start = int(marker.get("batches_read", 0))
    cached = isinstance(activations, ActivationCache)
    if cached:
        hook = hook or (activations.hooks[0] if len(activations.hooks) == 1 else None)
        if hook is None:
            raise ValueError(f"Name the hook to train on: hook=... (one of {activations.hooks})")
    data, training_samples, dropped, rows = _training_data(
        activations,
        cfg.d_in,
        hook,
        batch_size,
        seed,
        start,
        distributed,
        training_samples,
        epochs,
        outlier_norm_ratio,
    )
    writes = checkpoint_dir is not None and rank == 0
    trainer_cfg = SAETrainerConfig(
        total_training_samples=training_samples,
        train_batch_size_samples=batch_size * world,
        lr=lr,
        lr_end=trainer_kwargs.pop("lr_end", lr),
        device=device,
        checkpoint_path=str(checkpoint_dir) if writes else None,
        n_checkpoints=n_checkpoints if writes else 0,
        **trainer_kwargs,
    )
    # a set screened whole is not screened again by minibatch: one rule, applied once
    streamed = not isinstance(activations, Tensor | ActivationCache) or distributed and cached
    if isinstance(cfg, BAETrainingSAEConfig):  # the ratio its step screens with, in a copy
        ratio = outlier_norm_ratio if streamed else None  # (a config's metadata is shared)
        cfg = replace(cfg, extreme_norm_ratio=ratio, metadata=copy.deepcopy(cfg.metadata))
    trainer = _trainer(cfg, trainer_cfg, data, hook, seed, record_every)
    trainer.marker_info = info
    if rows is not None:  # an input frame from the set (a resumed run loads its own below)
        fix_frame_from_set(trainer.sae, rows, NORM_ESTIMATE_BATCHES * batch_size * world, seed)
    if checkpoint is not None:
        trainer.resume(checkpoint)
    if distributed:
        data_parallel(trainer)
    sae = trainer.fit()
    if isinstance(sae, BAETrainingSAE):  # in input units when training ends, as SAELens folds
        sae.fold_input_scale()  # its own scaling at the end of fit (its checkpoints keep the frame)
    in_steps = outliers_set_aside(sae)
    trained = trainer.n_training_samples  # every rank's (the count is the global minibatches')
    report_outliers(in_steps, trained, "training steps", outlier_norm_ratio)
    return TrainingRun(sae, trainer.history, dropped + in_steps)


def save_in_input_units(sae: TrainingSAE[Any], folder: str | Path, scale: float) -> None:
    """Save ``sae``, trained on states multiplied by ``scale``, as an inference SAE that reads
    the states as they were before (SAELens' ``fold_activation_norm_scaling_factor`` on a copy):
    what a user loads and hooks into the model. ``sae`` itself is left as it is."""
    folded = copy.deepcopy(sae)
    folded.fold_activation_norm_scaling_factor(scale)
    folded.save_inference_model(str(folder))


NORM_ESTIMATE_BATCHES = 100
"""Minibatches a statistic of the states is estimated over before the first step: SAELens'
mean-norm estimate in ``bae train`` (100 x ``--batch-size`` states; SAELens' default, 1,000, costs
ten times the forward passes) and the input frame ``train_sae`` fixes on a training set."""


def _training_data(
    activations: Tensor | ActivationCache | Iterable[Tensor],
    d_in: int,
    hook: str | None,
    batch_size: int,
    seed: int,
    start: int,
    distributed: bool,
    training_samples: int | None,
    epochs: float | None,
    outlier_norm_ratio: float | None,
) -> tuple[_Counted, int, int, Tensor | None]:
    """The counted stream of minibatches ``train_sae`` reads (from batch ``start`` on), the
    length of training in rows, how many extreme states a tensor or cache had dropped, and the
    screened set itself (None for a stream)."""
    dropped, rows = 0, None
    if isinstance(activations, ActivationCache):
        assert hook is not None
        if not distributed:
            activations = activations.activations(hook)
        else:
            if epochs is not None:
                training_samples = int(epochs * activations.token_positions().shape[0])
            stream = rank_cache_batches(activations, hook, batch_size, seed=seed, start=start)
            data = _Counted(stream, start)
    if isinstance(activations, Tensor):
        if activations.ndim != 2 or activations.shape[1] != d_in:
            raise ValueError(
                f"activations must be [n, d_in={d_in}], got {tuple(activations.shape)}"
            )
        n = activations.shape[0]
        activations, dropped = drop_outliers(activations, outlier_norm_ratio)
        report_outliers(dropped, n, "training set", outlier_norm_ratio)
        if epochs is not None:
            training_samples = int(epochs * activations.shape[0])
        batches = rank_batches if distributed else activation_batches
        data = _Counted(batches(activations, batch_size, seed=seed, start=start), start)
        rows = activations
    elif not isinstance(activations, ActivationCache):
        if epochs is not None:
            raise ValueError("epochs needs an activation tensor; give training_samples instead")
        data = _Counted(iter(activations))
        for _ in range(start):
            next(data)
    if training_samples is None:
        raise ValueError("Say how long to train: training_samples=... or epochs=...")
    return data, training_samples, dropped, rows


def _trainer(
    cfg: TrainingSAEConfig,
    trainer_cfg: SAETrainerConfig,
    data: _Counted,
    hook: str | None,
    seed: int,
    record_every: int,
) -> RecordingTrainer:
    """The SAE of ``cfg``, initialised from ``seed``, and SAELens' trainer of it."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        sae = TrainingSAE.from_dict(cfg.to_dict())
    if hook is not None and sae.cfg.metadata.hook_name is None:  # so it splices where it read
        sae.cfg.metadata.hook_name = hook
    return RecordingTrainer(cfg=trainer_cfg, sae=sae, data_provider=data, record_every=record_every)


def train_bae(
    activations: Float[Tensor, "n d_in"] | Iterable[Float[Tensor, "batch d_in"]],
    cfg: BAETrainingSAEConfig | None = None,
    **kwargs: Any,
) -> BAETrainingSAE:
    """Train a BAE on activations that are already computed (see :func:`train_sae` for the
    arguments); ``cfg`` defaults to the default recipe at the activations' width, its phases
    resolved into the steps of this run (``bae_config(..., training_steps=...)``)."""
    if cfg is None:
        if not isinstance(activations, Tensor):
            raise ValueError("Pass cfg=bae_config(d_in, training_steps=...) when streaming batches")
        cfg = bae_config(activations.shape[-1], training_steps=_steps_of(activations, kwargs))
    return train_sae(activations, cfg, **kwargs).sae


def _steps_of(activations: Tensor, kwargs: dict[str, Any]) -> int | None:
    """The steps ``train_sae(activations, **kwargs)`` trains for (None without a length): its
    samples (``epochs`` over the states it keeps) over its global minibatch."""
    samples, epochs = kwargs.get("training_samples"), kwargs.get("epochs")
    if epochs is not None:
        kept = outlier_mask(activations, kwargs.get("outlier_norm_ratio", NORM_RATIO))
        samples = int(epochs * int(kept.sum()))
    world = rank_world()[1] if kwargs.get("distributed") else 1
    batch = kwargs.get("batch_size", DEFAULT_BATCH_SIZE) * world
    return None if samples is None else samples // batch
