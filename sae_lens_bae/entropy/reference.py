"""A reference reading of a set of states beside a BAE's: the smallest k-means code that passes
the same trust rule.

A BAE's estimate of an LLM cell can be unreliable for two reasons: the cell cannot be read at
the rule's error with so few states (no binary code with a linear decoder can keep 80% of the
variance while spending less than log2 of the number of states), or it can be and the BAE's
encoder does not find such a code. A k-means code tells the two apart. Its codes have one active
bit of K (each state fires its nearest centroid's bit) and decode to the centroid, a
binary code with a linear decoder like a BAE's; in the estimator's currency (the sum of
per-bit entropies) it costs H(p) + sum_k (1 - p_k) log2(1 / (1 - p_k)) <= log2 K + log2 e
bits whatever the set (docs/research/code-notes.md has its readings on the position trace).

``reference_reading`` tries K = 16, 32, 64, ... (powers of two up to the number of distinct
states over e, beyond which log2 K + log2 e passes the ceiling) and stops at the first whose
code *reads the cell*: both errors (total and typical state's) within the rule's and its
per-bit sum under the ceiling. Its bits are the reference's rate at the rule's error. The
rule's third test, the excess of the per-bit sum over the code's joint entropy, is reported
(``reliable`` applies the whole rule) but does not stop the ladder: a one-hot code's sum always
over-counts its joint entropy, by up to log2 e bits, and that joint entropy is known exactly
(``assignment_bits``), so the over-count says nothing about whether such a code can read the
cell. It is a reference, not a bound: a code with several active bits may spend fewer bits,
and its reading grows with K (it is a rate at a resolution, not an entropy independent of it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sae_lens_bae.entropy.estimate import (
    DEFAULT_MAX_RELATIVE_ERROR,
    excess_bits,
    is_reliable,
    plugin_entropy,
    typical_relative_error,
)
from sae_lens_bae.saes.objective import binary_entropy

__all__ = [
    "QuantizerReading",
    "kmeans",
    "quantizer_reading",
    "reference_reading",
    "reference_sizes",
]


def kmeans(
    x: Float[Tensor, "n d"], k: int, iterations: int = 50, seed: int = 0, chunk: int = 4096
) -> tuple[Float[Tensor, "k d"], Int[Tensor, " n"], int]:
    """Lloyd's k-means from a k-means++ start: the centroids, each state's cluster and the
    iterations run (stops early once no assignment changes). A cluster left empty keeps its
    centroid. Distances are computed in ``chunk`` rows at a time, so memory is chunk x k."""
    if not 1 <= k <= x.shape[0]:
        raise ValueError(f"k must be in [1, {x.shape[0]}] (the number of states), got {k}")
    offset = x.float().mean(0)
    x = x.float() - offset  # centred: the distances below subtract norms, exact near the origin
    generator = torch.Generator(device="cpu").manual_seed(seed)
    norms = x.pow(2).sum(-1)
    first = int(torch.randint(x.shape[0], (1,), generator=generator))
    chosen = [first]
    nearest = (norms - 2 * (x @ x[first]) + norms[first]).clamp_min(0)
    for _ in range(1, k):
        weights = nearest.double().cpu()
        index = (
            int(torch.multinomial(weights, 1, generator=generator))
            if weights.sum() > 0
            else int(torch.randint(x.shape[0], (1,), generator=generator))
        )
        chosen.append(index)
        distances = (norms - 2 * (x @ x[index]) + norms[index]).clamp_min(0)
        nearest = torch.minimum(nearest, distances)
    centroids = x[chosen].clone()
    assignment = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)
    norms = norms[:, None]
    run = 0
    while run < iterations:
        run += 1
        c_norms = centroids.pow(2).sum(-1)
        new = torch.cat(
            [
                (norms[s : s + chunk] - 2 * x[s : s + chunk] @ centroids.T + c_norms).argmin(-1)
                for s in range(0, x.shape[0], chunk)
            ]
        )
        if torch.equal(new, assignment):
            break
        assignment = new
        counts = torch.bincount(assignment, minlength=k)
        sums = torch.zeros_like(centroids).index_add_(0, assignment, x)
        filled = counts > 0
        centroids[filled] = sums[filled] / counts[filled, None].to(x.dtype)
    return centroids + offset, assignment, run


@dataclass
class QuantizerReading:
    """What a one-active-bit code of ``k`` bits spends and loses on a set: ``bits``, the
    per-bit entropy sum of its one-hot code (what a BAE estimate of that code reads);
    ``assignment_bits``, the code's joint entropy; the errors as a BAE's are measured (total
    SSE / SST, and the typical state's); ``reads_cell``: both errors within the rule's and
    ``bits`` under the ceiling; ``reliable``: the whole rule (``is_reliable``, the excess too)."""

    k: int
    bits: float
    assignment_bits: float
    excess_bits: float | None
    ceiling_bits: float
    used_bits: int
    relative_error: float | None
    typical_relative_error: float | None
    reads_cell: bool
    reliable: bool
    iterations: int

    def summary(self) -> dict[str, float | int | bool | None]:
        return asdict(self)


def quantizer_reading(
    x: Float[Tensor, "n d"],
    k: int,
    iterations: int = 50,
    seed: int = 0,
    max_relative_error: float = DEFAULT_MAX_RELATIVE_ERROR,
    n_distinct: int | None = None,
) -> tuple[QuantizerReading, Float[Tensor, "k d"]]:
    """The ``QuantizerReading`` of ``kmeans(x, k)`` on ``x`` (all of its states), and the
    centroids. ``n_distinct``: the distinct states of ``x`` if the caller has counted them."""
    centroids, assignment, run = kmeans(x, k, iterations, seed)
    data = x.double()
    errors = (data - centroids.double()[assignment]).pow(2).sum(-1)
    sst = float((data - data.mean(0)).pow(2).sum())
    counts = torch.bincount(assignment, minlength=k)
    bits = float(binary_entropy(counts.double() / x.shape[0]))
    if n_distinct is None:
        n_distinct = torch.unique(x, dim=0).shape[0]
    ceiling = math.log2(n_distinct)
    error = float(errors.sum()) / sst if sst > 0 else None
    typical = typical_relative_error(data, errors)
    excess = excess_bits(bits, counts.tolist())
    reading = QuantizerReading(
        k=k,
        bits=bits,
        assignment_bits=plugin_entropy(counts.tolist()),
        excess_bits=excess,
        ceiling_bits=ceiling,
        used_bits=int((counts > 0).sum()),
        relative_error=error,
        typical_relative_error=typical,
        reads_cell=is_reliable(bits, ceiling, error, None, max_relative_error, typical),
        reliable=is_reliable(bits, ceiling, error, excess, max_relative_error, typical),
        iterations=run,
    )
    return reading, centroids


def reference_sizes(n_distinct: int, smallest: int = 16) -> list[int]:
    """K = ``smallest``, 2 ``smallest``, ... while K <= n_distinct / e (a larger K's code may
    spend up to log2 K + log2 e > log2 n_distinct bits: over the ceiling); at least one K."""
    sizes = [smallest]
    while sizes[-1] * 2 <= n_distinct / math.e:
        sizes.append(sizes[-1] * 2)
    return [min(k, n_distinct) for k in sizes]


def reference_reading(
    x: Float[Tensor, "n d"],
    sizes: Sequence[int] | None = None,
    iterations: int = 50,
    seed: int = 0,
    max_relative_error: float = DEFAULT_MAX_RELATIVE_ERROR,
) -> tuple[QuantizerReading, list[QuantizerReading]]:
    """The first K of ``sizes`` (default ``reference_sizes``) whose k-means code of ``x`` reads
    the cell (``QuantizerReading.reads_cell``), or the last one tried if none does; and every
    reading made on the way."""
    n_distinct = torch.unique(x, dim=0).shape[0]  # once, for the sizes and every K's ceiling
    if sizes is None:
        sizes = reference_sizes(n_distinct)
    if not sizes:
        raise ValueError("reference_reading needs at least one K")
    readings = []
    for k in sizes:
        reading, _ = quantizer_reading(
            x, min(k, x.shape[0]), iterations, seed, max_relative_error, n_distinct
        )
        readings.append(reading)
        if reading.reads_cell:
            break
    return readings[-1], readings
