"""Data-parallel BAE training on ``torch.distributed``: N ranks with batch b train exactly the BAE
that one process trains with batch N * b.

Launch with ``torchrun`` (NCCL on GPUs, gloo on CPU). Three pieces:

* ``data_parallel(trainer)`` turns any SAELens ``SAETrainer`` of a BAE (``train_sae``'s, or the
  one ``bae train``'s runner builds) data-parallel: the weights' gradients are averaged by
  ``DistributedDataParallel``, and the BAE computes its loss on the *global* minibatch
  (``parallel.global_batch``, set as the BAE's ``batch`` seam): per-bit counts are summed over
  the ranks, the codes gathered so that each rank computes its band of covariance tiles, with
  autograd through every collective. The trainer counts samples and firing statistics over the
  global batch, so its schedule (steps, checkpoints, entropy switch-on) is the single-process one.
* ``rank_batches`` is the rank's part of ``activation_batches``' stream at batch N * b: the
  ranks' batches, concatenated in rank order, *are* the single-process batches, so a run resumes
  exactly with any number of ranks that keeps the global batch.
* ``rank_cache_batches`` reads only the rank's block of an ``ActivationCache`` (memory / N).

Rank 0 writes checkpoints and the final model (every rank holds the same weights).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from jaxtyping import Float
from sae_lens.saes.sae import TrainStepInput, TrainStepOutput
from sae_lens.training.sae_trainer import SAETrainer
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from sae_lens_bae.activations.cache import ActivationCache
from sae_lens_bae.parallel.global_batch import GlobalBatch, is_distributed
from sae_lens_bae.saes.bae import BAETrainingSAE
from sae_lens_bae.saes.minibatch import LOCAL_BATCH

__all__ = [
    "batch_indices",
    "data_parallel",
    "is_distributed",
    "rank_batches",
    "rank_cache_batches",
    "rank_world",
    "spawn_local",
]


def rank_world(group: Any = None) -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) outside ``torch.distributed``."""
    batch = GlobalBatch.of(group) if is_distributed() else LOCAL_BATCH
    return batch.rank, batch.world


def batch_indices(
    n: int,
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    start: int = 0,
    device: torch.device | str = "cpu",
) -> Iterator[Tensor]:
    """Row indices of endless minibatches over n rows, reshuffled every epoch from ``seed``, the
    last partial batch of an epoch dropped; ``start`` skips that many batches. The same indices
    on any ``device``: an epoch's order is drawn on the CPU and copied there once, not a batch
    at a time."""
    if n < batch_size:
        raise ValueError(
            f"Need at least batch_size={batch_size} activations to form a minibatch, got {n}"
        )
    per_epoch = n // batch_size
    generator = torch.Generator().manual_seed(seed)
    skip = start
    while True:
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        order = order.to(device)
        first, skip = min(skip, per_epoch), skip - min(skip, per_epoch)
        for batch in range(first, per_epoch):
            yield order[batch * batch_size : (batch + 1) * batch_size]


def rank_batches(
    activations: Float[Tensor, "n d_in"],
    batch_size: int,
    *,
    seed: int = 0,
    start: int = 0,
    group: Any = None,
) -> Iterator[Float[Tensor, "batch d_in"]]:
    """This rank's ``batch_size`` rows of every global minibatch of N * ``batch_size`` rows.

    Every rank holds (or memory-maps) the same ``activations``; each gathers only its rows. The
    global minibatches are those of ``activation_batches(activations, N * batch_size, seed=seed)``
    and rank r gets rows [r * b, (r + 1) * b) of each, so an epoch covers every row once across
    the ranks and the stream does not depend on N at a fixed global batch.
    """
    rank, world = rank_world(group)
    mine = slice(rank * batch_size, (rank + 1) * batch_size)
    for index in batch_indices(activations.shape[0], batch_size * world, seed=seed, start=start):
        yield activations[index[mine]]


def rank_cache_batches(
    cache: ActivationCache,
    hook: str,
    batch_size: int,
    *,
    seed: int = 0,
    start: int = 0,
    group: Any = None,
    dtype: torch.dtype = torch.float32,
) -> Iterator[Float[Tensor, "batch d_in"]]:
    """Minibatches of ``batch_size`` rows from this rank's block of sequences of ``cache``
    (``ActivationCache.rank_sequences``): only its shards are read, and the ranks' blocks cover
    the cache once. Each rank reshuffles its block every epoch from (seed, rank), so the stream
    depends on the number of ranks: a run resumes exactly with the same number."""
    rank, world = rank_world(group)
    rows = cache.activations(hook, dtype=dtype, sequences=cache.rank_sequences(rank, world))
    for index in batch_indices(
        rows.shape[0], batch_size, seed=seed * 1_000_003 + rank, start=start
    ):
        yield rows[index]


class _TrainingStep(nn.Module):
    """The BAE's training step as a module's forward, so that DDP sees the step; its output
    covers the global minibatch (the trainer's firing statistics count every rank's rows, the
    record reads the global ``mse_loss``)."""

    def __init__(self, sae: BAETrainingSAE) -> None:
        super().__init__()
        self.sae = sae

    def forward(self, step_input: TrainStepInput) -> TrainStepOutput:
        output = type(self.sae).training_forward_pass(self.sae, step_input)
        batch = self.sae.batch
        output.sae_in = batch.gather(output.sae_in.detach())
        output.sae_out = batch.gather(output.sae_out.detach())
        # SAELens' mse_loss is this rank's mean (DDP averages its gradient); the record's is the
        # global minibatch's, the mean of the ranks' means
        mse = output.losses["mse_loss"].detach()
        output.losses["mse_loss"] = batch.sum(mse) / batch.world
        binary = self.sae.cfg.bits_per_feature == 1  # 0/1 features travel as bytes
        output.feature_acts = batch.gather(output.feature_acts.detach(), codes=binary)
        return output


def data_parallel(trainer: SAETrainer[Any, Any], group: Any = None) -> SAETrainer[Any, Any]:
    """Make ``trainer`` (built on every rank with the *global* ``train_batch_size_samples`` and
    ``total_training_samples``, fed this rank's batches) train on the global minibatch.

    Like SAELens' ``compile_sae``, it replaces the BAE's ``training_forward_pass`` on the instance:
    the step now runs through ``DistributedDataParallel`` (which broadcasts rank 0's weights and
    buffers once, then averages gradients; buffers are not synced again, the BAE's running
    statistics are computed from the global batch on every rank). ``trainer.step`` counts the
    samples of every rank, and SAELens' scale estimate is the ranks' mean. Returns ``trainer``.
    """
    sae = trainer.sae
    if not isinstance(sae, BAETrainingSAE):
        raise TypeError(
            f"data_parallel trains BAEs; got a {type(sae).__name__} (for other SAELens "
            "architectures wrap the SAE in DistributedDataParallel: their losses are per sample)"
        )
    if not is_distributed():
        raise RuntimeError(
            "data_parallel needs torch.distributed initialised: launch with torchrun and call "
            "torch.distributed.init_process_group (gloo on CPU, nccl on GPUs) first"
        )
    _, world = rank_world(group)
    sae.to(trainer.cfg.device)
    sae.batch = GlobalBatch.of(group)
    ddp = DistributedDataParallel(
        _TrainingStep(sae), process_group=group, forward_sync_buffers=False
    )
    # a function, not the module: an nn.Module attribute would make the DDP wrapper a child of sae
    sae.training_forward_pass = lambda step_input: ddp(step_input)  # type: ignore[method-assign]
    local_step = trainer.step

    def step(batch: Tensor) -> TrainStepOutput:
        output = local_step(batch)
        trainer.n_training_samples += (world - 1) * batch.shape[0]  # the other ranks' rows
        return output

    trainer.step = step
    _one_scale(trainer, group, world)
    return trainer


def _one_scale(trainer: SAETrainer[Any, Any], group: Any, world: int) -> None:
    """SAELens' estimate of the states' scale (``normalize_activations``) reads this rank's
    batches; averaged over the ranks, every rank scales by the factor of the global stream, as
    one process would, and a resumed run (which loads rank 0's) goes on with the same."""
    scaler = trainer.activation_scaler
    estimate = scaler.estimate_scaling_factor

    def estimate_globally(*args: Any, **kwargs: Any) -> None:
        estimate(*args, **kwargs)
        device = trainer.cfg.device if dist.get_backend(group) == "nccl" else "cpu"
        norm = torch.tensor([1.0 / scaler.scaling_factor], dtype=torch.float64, device=device)
        dist.all_reduce(norm, group=group)  # the ranks' mean norms over sqrt(d), summed
        scaler.scaling_factor = world / float(norm)

    scaler.estimate_scaling_factor = estimate_globally  # type: ignore[method-assign]


def spawn_local(fn: Callable[..., None], world: int, *args: Any, backend: str = "gloo") -> None:
    """Run ``fn(rank, *args)`` on ``world`` processes of this machine, each a rank of one process
    group (``backend``: gloo, or nccl with GPU ``rank`` each): data-parallel code tried, tested or
    timed without ``torchrun``. ``fn`` must be importable (a module-level function)."""
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    mp.spawn(_spawned_rank, args=(world, port, backend, fn, args), nprocs=world)


def _spawned_rank(
    rank: int, world: int, port: int, backend: str, fn: Callable[..., None], args: tuple[Any, ...]
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        fn(rank, *args)
    finally:
        dist.destroy_process_group()
