"""The minibatch of a data-parallel step, spread over the ranks of a ``torch.distributed`` group:
what a data-parallel trainer sets as a BAE's ``batch`` seam (``saes.minibatch.LocalBatch``, the
identity, by default).

A BAE's entropy and covariance terms are properties of the *minibatch*: with plain DDP every rank
would penalise the entropy of its own shard, a smaller-batch objective than the one a single
process trains. ``GlobalBatch`` gives the loss the global minibatch instead: ``sum`` adds a
tensor over the ranks and ``gather`` concatenates the ranks' rows, both with autograd through
the collective. Their backward passes add the gradients of every rank (each rank computes the
same global loss L, so rank r's samples get N dL/dx), which ``DistributedDataParallel``'s
average over N ranks turns back into dL/dx: N ranks with batch b train exactly the BAE one
process would train with batch N * b. One rank is the identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from jaxtyping import Float
from torch import Tensor

__all__ = ["GlobalBatch", "is_distributed"]


def is_distributed() -> bool:
    """Whether this process is one rank of an initialised ``torch.distributed`` group."""
    return dist.is_available() and dist.is_initialized()


def _all_gather(x: Tensor, group: Any, codes: bool) -> Tensor:
    """Concatenation over the ranks along dim 0; 0/1 ``codes`` travel as bytes (1/4 of fp32)."""
    wire = x.to(torch.uint8) if codes else x.contiguous()
    parts = [torch.empty_like(wire) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, wire, group=group)
    return torch.cat(parts).to(x.dtype)


class _SumRanks(torch.autograd.Function):
    """All-reduce (sum); backward: the sum over ranks of the gradients (every rank's loss uses
    the sum). ``torch.distributed.nn.functional.all_reduce``, which torch deprecates."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        total = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return _SumRanks.apply(grad, ctx.group), None


class _GatherRows(torch.autograd.Function):
    """All-gather along dim 0; backward: the sum over ranks of the gradient of this rank's rows."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Any, codes: bool) -> Tensor:
        ctx.group, ctx.rows = group, x.shape[0]
        return _all_gather(x, group, codes)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        grad = grad.contiguous()
        rank = dist.get_rank(ctx.group)
        if dist.get_backend(ctx.group) == dist.Backend.NCCL:
            out = grad.new_empty((ctx.rows, *grad.shape[1:]))
            dist.reduce_scatter_tensor(out, grad, group=ctx.group)
            return out, None, None
        dist.all_reduce(grad, group=ctx.group)  # gloo has no reduce-scatter
        return grad[rank * ctx.rows : (rank + 1) * ctx.rows].clone(), None, None


@dataclass(frozen=True)
class GlobalBatch:
    """The ranks of ``group`` (None: the default group, if initialised) as one minibatch.

    Every rank must hold the same number of rows.
    """

    group: Any = None
    distributed: bool = False

    @classmethod
    def of(cls, group: Any = None) -> GlobalBatch:
        """The data-parallel minibatch over ``group`` (the default group when None)."""
        if not is_distributed():
            raise RuntimeError(
                "GlobalBatch.of needs torch.distributed initialised (launch with torchrun and "
                "call torch.distributed.init_process_group first)"
            )
        return cls(group, True)

    @property
    def world(self) -> int:
        return dist.get_world_size(self.group) if self.distributed else 1

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group) if self.distributed else 0

    def sum(self, x: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
        """``x`` added over the ranks (every rank gets the sum), differentiably."""
        if self.world == 1:
            return x
        return _SumRanks.apply(x, self.group)

    def gather(
        self, x: Float[Tensor, "*stack batch n"], dim: int = -2, *, codes: bool = False
    ) -> Float[Tensor, "..."]:
        """The ranks' ``x`` concatenated along the batch dimension ``dim`` in rank order;
        ``codes=True``: x holds only 0 and 1 (sent as bytes), on every rank."""
        if self.world == 1:
            return x
        moved = x.movedim(dim, 0)
        if torch.is_grad_enabled() and x.requires_grad:
            gathered = _GatherRows.apply(moved, self.group, codes)
        else:
            gathered = _all_gather(moved, self.group, codes)
        return gathered.movedim(0, dim)
