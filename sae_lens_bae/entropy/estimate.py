"""Entropy of a set of hidden states, estimated by a trained BAE, with what makes it trustworthy.

The estimate is H(p) = -sum_i [p_i log2 p_i + (1-p_i) log2(1-p_i)] with p the BAE's mean binary
code over the *whole* set (not per minibatch): the sum of the code bits' entropies. It is an
upper bound on the entropy of the code (tight only when the code bits are independent, which the
covariance penalty pushes towards), and the code's entropy is at most the set's. Beside it:

* ``ceiling_bits`` = log2(number of distinct states): no distribution over the set can hold more;
  an estimate above it says the code bits are dependent or the code wastes bits, not that the set
  has that much entropy;
* ``code_bits``: the plug-in entropy of the distinct codes in the set, a lower companion (at most
  both the estimate and the ceiling);
* ``excess_bits``: how far the estimate exceeds the code's joint entropy (``code_bits`` with the
  Miller-Madow bias correction), where the sample resolves that joint distribution (at most one
  distinct code per ``RESOLVED_SAMPLES_PER_CODE`` states; else None). The sum over bits
  equals the joint entropy only for independent code bits, so an excess is bits counted twice
  by dependent code bits: an over-count below the ceiling, which the ceiling alone cannot catch;
* ``relative_error``: the BAE's reconstruction error on the set (SSE / total variance): an
  estimate from a code that has lost the states says little about the states;
* ``typical_relative_error``: the same for the typical state, the median state's squared error
  over the median state's squared distance from the states' coordinate-wise median (on a uniform
  sample of at most ``TYPICAL_SAMPLE`` states). The total is a sum over states, so a few states
  far from the rest can carry it, and a code of those few passes the total while the median
  state keeps most of its error (docs/research/code-notes.md). The centre is a median, not the
  mean, because such states pull the mean away from all the others too;
* ``state_bits``: the plug-in entropy of the distinct states themselves, the entropy of the
  set's own empirical distribution (log2 n when every state is distinct). The code is a
  function of the state, so ``code_bits`` is at most it; the difference is what the code merges
  (``lost_bits``), and ``bits - code_bits`` is what the code bits count twice *on this set*
  (exact, no sample-size condition: both are plug-ins of the same states). The estimate minus
  ``state_bits`` is the second less the first, so with both within ``set_tolerance`` the
  estimate is within it of the set's entropy (docs/research/llm-truth.md). Both are asked only
  of a *discrete* set, one where some state repeats exactly (``discrete_set_bits``): where
  every state is distinct, the states may be noisy copies of fewer values, which a code should
  merge (the rule then cannot tell merging from reading);
* ``reliable``: both errors at most ``max_relative_error``, the estimate within the ceiling,
  an excess (where known) at most ``max(MIN_EXCESS_BITS, EXCESS_FRACTION * joint entropy)``,
  and the code neither merging nor double-counting more than ``set_tolerance(state_bits)``;
  ``unreliable_reasons`` names the conditions that fail;
* ``bootstrap_std``: the spread of the estimate over states resampled with replacement (Poisson
  bootstrap, streamed), for the same BAE.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.saes.objective import binary_entropy

__all__ = [
    "DEFAULT_MAX_RELATIVE_ERROR",
    "EXCESS_FRACTION",
    "MIN_EXCESS_BITS",
    "RESOLVED_SAMPLES_PER_CODE",
    "TYPICAL_SAMPLE",
    "EntropyEstimate",
    "code_entropy",
    "excess_bits",
    "is_reliable",
    "discrete_set_bits",
    "plugin_entropy",
    "set_tolerance",
    "typical_relative_error",
    "unreliable_reasons",
]

DEFAULT_MAX_RELATIVE_ERROR = 0.2
"""A cell whose BAE leaves more of its states' variance unexplained than this is not reliable."""
RESOLVED_SAMPLES_PER_CODE = 16
"""The code's joint entropy is taken as measured when there are at least this many states per
distinct code (the Miller-Madow-corrected plug-in is then within about 0.05 bit)."""
EXCESS_FRACTION = 0.05
"""An estimate may exceed the code's joint entropy by this fraction of it (the synthetic
benchmark's accuracy bar, 0.05 r bits) ..."""
MIN_EXCESS_BITS = 0.1
"""... or by this many bits, whichever is larger."""
SET_TOLERANCE_BITS = 0.25
"""A code may merge, or count twice, this many bits of the set's own entropy ..."""
SET_TOLERANCE_FRACTION = 0.03
"""... or this fraction of it, whichever is larger: the accuracy asked of a reading of real
states whose entropy is known (``bae bench llm-truth``)."""
TYPICAL_SAMPLE = 8192
"""States kept (a uniform reservoir sample of the stream) to measure the typical state's error:
a median needs the states, and a set may not fit in memory."""


@dataclass
class EntropyEstimate:
    """An entropy estimate in bits and the numbers that say how far to trust it (see module)."""

    bits: float
    firing_rates: Float[Tensor, " n_bits"]
    n_samples: int
    n_distinct: int
    ceiling_bits: float
    code_bits: float
    relative_error: float | None
    reliable: bool
    bootstrap_std: float | None = None
    n_codes: int = 0
    excess_bits: float | None = None
    typical_relative_error: float | None = None
    state_bits: float | None = None


def discrete_set_bits(state_bits: float | None, n_distinct: int, n_samples: int) -> float | None:
    """``state_bits`` where the set is discrete (some state repeats: fewer distinct states than
    states), else None: the set-level conditions are asked of discrete sets only (see module)."""
    return state_bits if n_distinct < n_samples else None


def set_tolerance(state_bits: float) -> float:
    """How far a reading may sit from a set's own entropy ``state_bits`` (see module)."""
    return max(SET_TOLERANCE_BITS, SET_TOLERANCE_FRACTION * state_bits)


def plugin_entropy(counts: Iterable[int]) -> float:
    """Entropy in bits of the empirical distribution with these counts."""
    counts = [c for c in counts if c > 0]
    total = sum(counts)
    return max(-sum(c / total * math.log2(c / total) for c in counts), 0.0) + 0.0


def excess_bits(bits: float, code_counts: Iterable[int]) -> float | None:
    """``bits`` (a per-bit sum) minus the joint entropy of the codes with these counts
    (plug-in plus the Miller-Madow correction, (K - 1) / (2 n ln 2) for K codes in n states), or
    None when the sample does not resolve the joint distribution (fewer than
    ``RESOLVED_SAMPLES_PER_CODE`` states per code: the plug-in is then biased low, and a good
    estimate would look like an excess)."""
    counts = [c for c in code_counts if c > 0]
    n = sum(counts)
    if not counts or n < RESOLVED_SAMPLES_PER_CODE * len(counts):
        return None
    joint = plugin_entropy(counts) + (len(counts) - 1) / (2 * n * math.log(2))
    return bits - joint


def unreliable_reasons(
    bits: float,
    ceiling_bits: float,
    relative_error: float | None,
    excess: float | None,
    max_relative_error: float = DEFAULT_MAX_RELATIVE_ERROR,
    typical_error: float | None = None,
    *,
    state_bits: float | None = None,
    code_bits: float | None = None,
) -> list[str]:
    """The conditions of the reliability rule (see module) that a reading fails, each in words
    with its number; empty for a reliable reading. ``state_bits`` and ``code_bits`` (a discrete
    set's plug-in entropy, ``discrete_set_bits``, and its code's) add the two set-level
    conditions where both are given."""
    reasons = []
    errors = (("relative error", relative_error), ("typical state's error", typical_error))
    for what, error in errors:
        if error is not None and error > max_relative_error:
            reasons.append(f"{what} {error:.2f}")
    if bits > ceiling_bits + 1e-6:
        reasons.append(f"estimate {bits:.1f} bits, over its ceiling {ceiling_bits:.1f}")
    if excess is not None and excess > max(MIN_EXCESS_BITS, EXCESS_FRACTION * (bits - excess)):
        reasons.append(f"dependent code bits: {excess:.1f} bits over the code's joint entropy")
    if state_bits is not None and code_bits is not None:
        tolerance = set_tolerance(state_bits)
        if state_bits - code_bits > tolerance:
            reasons.append(
                f"the code merges states: {code_bits:.2f} of the set's {state_bits:.2f} bits kept"
            )
        if bits - code_bits > tolerance:
            reasons.append(f"code bits count {bits - code_bits:.2f} bits twice on this set")
    return reasons


def is_reliable(
    bits: float,
    ceiling_bits: float,
    relative_error: float | None,
    excess: float | None,
    max_relative_error: float = DEFAULT_MAX_RELATIVE_ERROR,
    typical_error: float | None = None,
    *,
    state_bits: float | None = None,
    code_bits: float | None = None,
) -> bool:
    """The reliability rule (see module): reconstruction (in total and for the typical state),
    ceiling, excess and, given the set's and the code's plug-in entropies, separation and
    double counting on the set."""
    return not unreliable_reasons(
        bits,
        ceiling_bits,
        relative_error,
        excess,
        max_relative_error,
        typical_error,
        state_bits=state_bits,
        code_bits=code_bits,
    )


def typical_relative_error(
    states: Float[Tensor, "n d"], squared_errors: Float[Tensor, " n"]
) -> float | None:
    """The typical state's reconstruction error: the median of ``squared_errors`` (one per
    state) over the median squared distance of ``states`` from their coordinate-wise median
    (None if the median state sits on it: no typical spread to compare with)."""
    rows = states.double()
    distances = (rows - rows.median(0).values).pow(2).sum(-1)
    typical = float(distances.median())
    return float(squared_errors.double().median()) / typical if typical > 1e-30 else None


class _Reservoir:
    """A uniform sample of at most ``size`` rows of a stream (Algorithm R), with each row's
    squared reconstruction error: what the typical state's error is measured on. The rows are
    copied into one preallocated block (fp32), so no batch is kept alive by a sampled row."""

    def __init__(self, size: int, generator: torch.Generator) -> None:
        self.size, self.generator, self.seen, self.filled = size, generator, 0, 0
        self.rows: Tensor | None = None
        self.errors = torch.zeros(size, dtype=torch.float64)

    def add(self, rows: Tensor, errors: Tensor) -> None:
        rows, errors = rows.detach().cpu().float(), errors.detach().cpu().double()
        if self.rows is None:
            self.rows = torch.zeros(self.size, rows.shape[-1])
        fill = min(self.size - self.filled, rows.shape[0])
        self.rows[self.filled : self.filled + fill] = rows[:fill]
        self.errors[self.filled : self.filled + fill] = errors[:fill]
        self.filled += fill
        seen = self.seen + fill + torch.arange(rows.shape[0] - fill, dtype=torch.float64)
        slots = (
            torch.rand(seen.shape, generator=self.generator, dtype=torch.float64) * (seen + 1)
        ).long()
        for i in torch.nonzero(slots < self.size).flatten().tolist():  # in stream order
            self.rows[slots[i]], self.errors[slots[i]] = rows[fill + i], errors[fill + i]
        self.seen += rows.shape[0]

    def typical_relative_error(self) -> float | None:
        """``typical_relative_error`` of the sampled states (None before any)."""
        if self.rows is None:
            return None
        return typical_relative_error(self.rows[: self.filled], self.errors[: self.filled])


def _row_keys(rows: Tensor) -> list[int]:
    """A 64-bit hash of each row of a 2-D tensor (exact equality up to hash collisions, about
    1 in 2^64 per pair): what counting distinct states needs, in constant memory per row."""
    data = rows.detach().cpu().contiguous()
    if data.dtype == torch.bool:
        data = data.to(torch.uint8)
    raw = data.numpy()
    return [hash(raw[i].tobytes()) for i in range(raw.shape[0])]


@torch.no_grad()
def code_entropy(
    bae: torch.nn.Module,
    activations: Float[Tensor, "n d_in"] | Iterable[Float[Tensor, "batch d_in"]],
    batch_size: int = 4096,
    *,
    bootstrap: int = 0,
    seed: int = 0,
    max_relative_error: float = DEFAULT_MAX_RELATIVE_ERROR,
) -> EntropyEstimate:
    """Entropy in bits of ``activations`` as seen by ``bae`` (any object with ``encode_bits``,
    ``encode`` and ``decode``), with its ceiling, reconstruction error and reliability.

    Streams: a tensor is encoded ``batch_size`` rows at a time, and an iterable of batches (e.g.
    read from an activation cache) is consumed once, so the set never needs to fit in memory
    (distinct states and codes are counted by hashing each row; the typical state's error is
    measured on a reservoir sample of ``TYPICAL_SAMPLE`` states). ``bootstrap``: number of
    Poisson bootstrap replicates for ``bootstrap_std`` (0: none). ``seed`` seeds both samples.
    """
    batches = (
        (activations[i : i + batch_size] for i in range(0, activations.shape[0], batch_size))
        if isinstance(activations, Tensor)
        else activations
    )
    generator = torch.Generator().manual_seed(seed)
    reservoir = _Reservoir(TYPICAL_SAMPLE, torch.Generator().manual_seed(seed))
    counts: Tensor | None = None
    replicate_counts = replicate_sizes = None
    states: Counter[int] = Counter()
    codes: Counter[int] = Counter()
    n = 0
    sse = total = 0.0
    sums: Tensor | None = None
    for batch in batches:
        batch = batch.reshape(-1, batch.shape[-1])
        bits = bae.encode_bits(batch)
        out = bae.decode(bae.encode(batch)).double()
        x = batch.to(out.device).double()
        errors = (out - x).pow(2).sum(-1)
        sse += float(errors.sum())
        reservoir.add(x, errors)
        total += float(x.pow(2).sum())
        sums = x.sum(0) if sums is None else sums + x.sum(0)
        batch_counts = bits.sum(0, dtype=torch.float64)
        counts = batch_counts if counts is None else counts + batch_counts
        if bootstrap:
            weights = torch.poisson(torch.ones(bootstrap, bits.shape[0]), generator=generator)
            weights = weights.to(bits.device, torch.float64)
            part = weights @ bits.double()
            replicate_counts = part if replicate_counts is None else replicate_counts + part
            size = weights.sum(1)
            replicate_sizes = size if replicate_sizes is None else replicate_sizes + size
        states.update(_row_keys(batch.float()))
        codes.update(_row_keys(bits.bool()))
        n += bits.shape[0]
    if counts is None or n == 0 or sums is None:
        raise ValueError("code_entropy needs at least one activation")
    # in [0, 1] for 0/1 codes; a stand-in whose "codes" are not 0/1 (the tests' exact decoder)
    # gets a number that means nothing rather than binary_entropy's refusal
    rates = (counts / n).float().clamp(0.0, 1.0)
    bits_estimate = max(binary_entropy(rates).item(), 0.0) + 0.0  # + 0.0: no -0.0
    variance = total - float(sums.pow(2).sum()) / n
    has_variance = variance > 1e-12 * max(total, 1e-30)
    relative_error = sse / variance if has_variance else None
    typical_error = reservoir.typical_relative_error() if has_variance else None
    bootstrap_std = None
    if replicate_counts is not None and replicate_sizes is not None:
        p = (replicate_counts / replicate_sizes.clamp_min(1.0)[:, None]).float().clamp(0.0, 1.0)
        bootstrap_std = float(binary_entropy(p).clamp_min(0.0).std()) if bootstrap > 1 else 0.0
    errors = (relative_error, typical_error)
    return _estimate(bits_estimate, rates, states, codes, errors, bootstrap_std, max_relative_error)


def _estimate(
    bits: float,
    rates: Tensor,
    states: Counter[int],
    codes: Counter[int],
    errors: tuple[float | None, float | None],
    bootstrap_std: float | None,
    max_relative_error: float,
) -> EntropyEstimate:
    """The estimate of a set whose distinct states and codes were counted (hash -> states), with
    its relative and typical errors and bootstrap spread, judged by the rule."""
    n = sum(states.values())
    ceiling = math.log2(len(states))
    excess = excess_bits(bits, codes.values())
    state_bits, code_bits = plugin_entropy(states.values()), plugin_entropy(codes.values())
    reliable = is_reliable(
        bits,
        ceiling,
        errors[0],
        excess,
        max_relative_error,
        errors[1],
        state_bits=discrete_set_bits(state_bits, len(states), n),
        code_bits=code_bits,
    )
    return EntropyEstimate(
        bits=bits,
        firing_rates=rates,
        n_samples=n,
        n_distinct=len(states),
        ceiling_bits=ceiling,
        code_bits=code_bits,
        relative_error=errors[0],
        reliable=reliable,
        bootstrap_std=bootstrap_std,
        n_codes=len(codes),
        excess_bits=excess,
        typical_relative_error=errors[1],
        state_bits=state_bits,
    )
