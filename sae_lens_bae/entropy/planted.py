"""States of known entropy: r fair bits planted along orthonormal directions in d dimensions
(exactly r bits), and how many of them a code recovers. What the synthetic benchmark and the
tutorials read BAEs against."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

__all__ = ["RECOVERED", "bit_agreement", "directional_data", "planted_cell", "recovered_bits"]

RECOVERED = 0.99
"""A planted bit counts as recovered when a code bit agrees with it on this fraction of states."""


def planted_cell(
    r: int, d: int, n_train: int, n_test: int, seed: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Train and test instances c M of one basis M (orthonormal rows), c uniform on {0,1}^r, and
    their bits c (``recovered_bits`` compares a code with them)."""
    if r > d:
        raise ValueError(f"rank r={r} cannot exceed the dimension d={d}")
    generator = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(d, max(r, 1), generator=generator))[0].T[:r]
    bits = torch.randint(0, 2, (n_train + n_test, r), generator=generator).float()
    data = bits @ basis if r else torch.zeros(n_train + n_test, d)
    train, test = data[:n_train].clone(), data[n_train:].clone()
    # copies, not views: a caller that drops a part (the train bits, n x r) frees its memory
    return train, test, bits[:n_train].clone(), bits[n_train:].clone()


def directional_data(r: int, d: int, n_train: int, n_test: int, seed: int) -> tuple[Tensor, Tensor]:
    """Train and test instances c M of one basis M (orthonormal rows), c uniform on {0,1}^r."""
    train, test, _, _ = planted_cell(r, d, n_train, n_test, seed)
    return train, test


@torch.no_grad()
def bit_agreement(
    codes: Float[Tensor, "n n_bits"], bits: Float[Tensor, "n r"]
) -> Float[Tensor, "r n_bits"]:
    """The fraction of the states on which each code bit copies or negates each planted bit
    (whichever is more), in fp64 on the codes' device."""
    codes, bits = codes.double(), bits.to(codes.device).double()
    same = (bits.T @ codes + (1 - bits).T @ (1 - codes)) / len(bits)
    return torch.maximum(same, 1 - same)


@torch.no_grad()
def recovered_bits(
    codes: Float[Tensor, "n n_bits"], bits: Float[Tensor, "n r"], agreement: float = RECOVERED
) -> int:
    """How many planted bits some code bit copies (or negates) on at least ``agreement`` of
    the states: an estimate near r could come from a code of other bits with the same sum of
    entropies; this says whether the BAE found the planted ones."""
    if bits.shape[1] == 0 or codes.shape[1] == 0:
        return 0
    return int((bit_agreement(codes, bits).amax(1) >= agreement).sum())
