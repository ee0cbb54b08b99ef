"""Data-parallel BAE training on ``torch.distributed``: the global minibatch as the BAE's
``batch`` seam (``global_batch``) and the trainers' data-parallel pieces (``distributed``)."""

from sae_lens_bae.parallel.distributed import (
    batch_indices,
    data_parallel,
    is_distributed,
    rank_batches,
    rank_cache_batches,
    rank_world,
    spawn_local,
)
from sae_lens_bae.parallel.global_batch import GlobalBatch

__all__ = [
    "GlobalBatch",
    "batch_indices",
    "data_parallel",
    "is_distributed",
    "rank_batches",
    "rank_cache_batches",
    "rank_world",
    "spawn_local",
]
