"""A SAELens ``ActivationsStore`` whose position in the activation stream survives a checkpoint.

SAELens' store mixes fresh activations into a buffer with the global RNG and keeps that buffer in
a generator's locals; its checkpoint holds only how many sequences were read, so a resumed run
sees other minibatches than an uninterrupted one. This store mixes the same way (the buffer is
refilled to ``buffer_size`` tokens, shuffled, ``mix_fraction`` of it kept back, the rest served)
but keeps the buffer, the batches left to serve and its own seeded generator as state, written
with the checkpoint: a run killed and resumed trains on exactly the same minibatches.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from sae_lens import LanguageModelSAERunnerConfig
from sae_lens.training.activations_store import ActivationsStore
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor
from transformer_lens.hook_points import HookedRootModule

__all__ = ["ResumableActivationsStore"]

_STATE = ("mixing_storage", "mixing_serving", "mixing_rng")


class ResumableActivationsStore(ActivationsStore):
    """``ActivationsStore`` with an exactly resumable mixing buffer (see the module docstring)."""

    generator: torch.Generator
    rank: int = 0
    storage: Tensor
    serving: Tensor

    @classmethod
    def for_runner(
        cls,
        model: HookedRootModule,
        cfg: LanguageModelSAERunnerConfig[Any],
        override_dataset: Any = None,
        rank: int = 0,
        world: int = 1,
    ) -> ResumableActivationsStore:
        """The store SAELens' runner would build from ``cfg``, seeded with ``cfg.seed``.

        As rank ``rank`` of ``world`` data-parallel ranks it serves 1/world of the global batch
        ``cfg.train_batch_size_tokens`` (give it this rank's shard of the dataset), mixes with
        seed ``cfg.seed + rank``, and keeps its checkpoint state in CHECKPOINT/rank_R (R > 0).
        """
        if cfg.train_batch_size_tokens % world:
            raise ValueError(
                f"The global batch of {cfg.train_batch_size_tokens} tokens does not split over "
                f"{world} ranks: give a batch size divisible by {world}"
            )
        store = cls.from_config(model, cfg, override_dataset=override_dataset)
        assert isinstance(store, cls)
        store.rank = rank
        store.train_batch_size_tokens = cfg.train_batch_size_tokens // world
        store.generator = torch.Generator().manual_seed(cfg.seed + rank)
        empty = torch.empty(0, cfg.sae.d_in, dtype=store.dtype, device=store.device)
        store.storage, store.serving = empty, empty
        return store

    def get_data_loader(self) -> Iterator[Tensor]:
        return self._mixed_batches()

    @torch.no_grad()
    def _mixed_batches(self) -> Iterator[Tensor]:
        buffer_size = self.n_batches_in_buffer * self.training_context_size
        batch = self.train_batch_size_tokens
        fresh = self._iterate_filtered_activations()
        while True:
            while self.serving.shape[0] < batch:
                storage = torch.cat([self.serving, self.storage])
                while storage.shape[0] < max(buffer_size, batch):
                    storage = torch.cat([storage, next(fresh).to(storage.dtype)])
                if self.activations_mixing_fraction > 0:
                    order = torch.randperm(storage.shape[0], generator=self.generator)
                    storage = storage[order.to(storage.device)]
                keep = int(buffer_size * self.activations_mixing_fraction)
                served = max(1, (storage.shape[0] - keep) // batch) * batch
                self.serving, self.storage = storage[:served], storage[served:]
            out, self.serving = self.serving[:batch], self.serving[batch:]
            yield out

    def state_dict(self) -> dict[str, Tensor]:
        return {
            **super().state_dict(),
            "mixing_storage": self.storage.contiguous(),
            "mixing_serving": self.serving.contiguous(),
            "mixing_rng": self.generator.get_state(),
        }

    def save_to_checkpoint(self, checkpoint_path: str | Path) -> None:
        folder = self._rank_folder(checkpoint_path)
        folder.mkdir(parents=True, exist_ok=True)
        super().save_to_checkpoint(folder)

    def load_from_checkpoint(self, checkpoint_path: str | Path) -> None:
        super().load_from_checkpoint(self._rank_folder(checkpoint_path))

    def _rank_folder(self, checkpoint_path: str | Path) -> Path:
        """Where this rank's state lives in a checkpoint (rank 0: the checkpoint itself)."""
        return Path(checkpoint_path) / f"rank_{self.rank}" if self.rank else Path(checkpoint_path)

    def load(self, file_path: str) -> None:
        """Fast-forward the token stream (SAELens) and restore the buffer and generator; a
        damaged file, or one without this store's state, is refused first, in one line."""
        try:
            state = load_file(file_path)
        except (SafetensorError, OSError) as error:
            raise ValueError(
                f"{file_path} is not an activation store's state ({type(error).__name__}); "
                "delete that checkpoint folder and resume from an earlier one, or start again"
            ) from None
        missing = [name for name in _STATE if name not in state]
        if missing:
            raise ValueError(
                f"{file_path} was written by SAELens' own ActivationsStore (no {missing[0]}): "
                "it cannot resume this run exactly; start it again or resume with SAELens' runner"
            )
        super().load(file_path)
        self.storage = state["mixing_storage"].to(self.device)
        self.serving = state["mixing_serving"].to(self.device)
        self.generator.set_state(state["mixing_rng"])
        self._dataloader = None
