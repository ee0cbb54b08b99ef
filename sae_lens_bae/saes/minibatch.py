"""The minibatch a BAE's step reduces over (its ``batch`` seam). Every term of the objective is a
property of the minibatch: :data:`LOCAL_BATCH` is this process's rows, the identity; a
data-parallel trainer sets the ranks' global minibatch instead (``parallel.GlobalBatch``), whose
``gather`` and ``sum`` make each term the one of the global minibatch."""

from __future__ import annotations

from torch import Tensor

__all__ = ["LOCAL_BATCH", "LocalBatch"]


class LocalBatch:
    """The minibatch of this process alone: the data-parallel seam's default, the identity."""

    world = 1
    rank = 0

    def gather(self, x: Tensor, dim: int = -2, *, codes: bool = False) -> Tensor:  # noqa: ARG002
        """The ranks' ``x`` concatenated along ``dim``: here ``x`` itself."""
        return x

    def sum(self, x: Tensor) -> Tensor:
        """``x`` added over the ranks: here ``x`` itself."""
        return x


LOCAL_BATCH = LocalBatch()
