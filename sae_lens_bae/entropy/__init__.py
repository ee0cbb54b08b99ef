"""Entropy estimation with BAEs: the estimator, and the benchmarks and traces built on it."""

from sae_lens_bae.entropy.estimate import EntropyEstimate, estimate_entropy

__all__ = ["EntropyEstimate", "estimate_entropy"]
