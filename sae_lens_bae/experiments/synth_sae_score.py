"""Scoring on a SAELens ``SyntheticModel``: one fixed evaluation set per model, read by SAELens'
``eval_sae_on_synthetic_data`` for every family, and the paper's counts beside it.

A BAE is scored in its canonical form (``saes.canonical``: every bit whose usual state is 1
flipped, an exact reparametrisation), so that "fires" means "is in its rare state" for every
family. ``ev_ceiling`` is the explained variance the best binary code of the SAE's width can
reach on the model: the true support of its ``width`` most frequent features, decoded by the
least-squares rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from sae_lens.evals import ExplainedVarianceCalculator
from sae_lens.synthetic import SyntheticModel, eval_sae_on_synthetic_data
from torch import Tensor

from sae_lens_bae.saes.canonical import canonicalise

__all__ = [
    "DENSE_RATE",
    "EvalSet",
    "binary_ceiling",
    "converged",
    "firing_counts",
    "score",
    "scored_form",
    "target_l0",
]

DENSE_RATE = 0.1
"""A latent firing on more than this fraction of samples is dense (the paper's threshold)."""


class _Replay:
    """An activation generator that gives back a fixed set of feature activations in order:
    every evaluation reads the same samples (``eval_sae_on_synthetic_data`` draws from it)."""

    def __init__(self, feature_acts: Tensor) -> None:
        self.feature_acts, self.at = feature_acts, 0

    def sample(self, batch_size: int) -> Tensor:
        batch = self.feature_acts[self.at : self.at + batch_size]
        self.at += batch_size
        return batch


@dataclass
class EvalSet:
    """Held-out samples of a synthetic model: the true feature activations and hidden states."""

    model: SyntheticModel
    feature_acts: Float[Tensor, "n features"]
    hidden: Float[Tensor, "n d"]

    @classmethod
    def draw(cls, model: SyntheticModel, n: int, seed: int) -> EvalSet:
        """``n`` samples drawn under ``seed`` (the global generator is restored after)."""
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            hidden, feature_acts = model.sample_with_features(n)
        return cls(model, feature_acts, hidden)


def scored_form(sae: Any) -> Any:
    """The model every metric reads: a BAE's canonical form (``prior``: its training mean code),
    any other SAE as it is."""
    return canonicalise(sae) if hasattr(sae, "encode_bits") else sae


@torch.no_grad()
def firing_counts(sae: Any, hidden: Tensor, batch_size: int = 4096) -> Tensor:
    """How often each latent fires (``encode != 0``, SAELens' own test) on ``hidden``, as a
    fraction of samples."""
    fired = torch.zeros(sae.cfg.d_sae)
    for start in range(0, hidden.shape[0], batch_size):
        fired += (sae.encode(hidden[start : start + batch_size]) != 0).float().sum(0).cpu()
    return fired / hidden.shape[0]


@torch.no_grad()
def score(sae: Any, data: EvalSet, batch_size: int = 4096) -> dict[str, Any]:
    """Every metric of a row: SAELens' ground-truth evaluation on ``data`` (the same call for
    every family), the paper's counts (dense latents, latents firing more often than the most
    frequent true feature) and dead latents."""
    model = scored_form(sae)
    n = data.feature_acts.shape[0]
    result = eval_sae_on_synthetic_data(
        model,
        data.model.feature_dict,
        _Replay(data.feature_acts),  # type: ignore[arg-type]  # duck-typed: sample(n)
        num_samples=n,
        batch_size=batch_size,
    )
    rates = firing_counts(model, data.hidden, batch_size)
    top_true = float((data.feature_acts > 0).float().mean(0).max())
    return {
        "l0": result.sae_l0,
        "mcc": result.mcc,
        "uniqueness": result.uniqueness,
        "f1": result.classification.f1_score,
        "precision": result.classification.precision,
        "recall": result.classification.recall,
        "dead": result.dead_latents,
        "dense": int((rates > DENSE_RATE).sum()),
        "above_top_feature": int((rates > top_true).sum()),
        "explained_variance": result.explained_variance,
        "shrinkage": result.shrinkage,
        "true_l0": result.true_l0,
    }


def target_l0(feature_acts: Tensor, width: int) -> float:
    """The true L0 of the model's ``width`` most frequent features (SynthSAEBench's target L0
    for an SAE of that width)."""
    active = feature_acts > 0
    top = active.float().mean(0).argsort(descending=True)[:width]
    return float(active[:, top].float().sum(-1).mean())


@torch.no_grad()
def binary_ceiling(fit: EvalSet, test: EvalSet, width: int) -> float:
    """The explained variance on ``test`` of the best decoder of a ``width``-bit code holding the
    true support of the ``width`` features most frequent on ``fit``: rows and bias fitted by
    least squares on ``fit``, EV by SAELens' calculator."""
    top = (fit.feature_acts > 0).float().mean(0).argsort(descending=True)[:width]

    def design(data: EvalSet) -> Tensor:
        code = (data.feature_acts[:, top] > 0).double().cpu()
        return torch.cat([code, torch.ones(code.shape[0], 1, dtype=code.dtype)], dim=1)

    # the design is rank-deficient (features never on in ``fit``, exclusive children that sum
    # to their parent): the SVD driver gives the minimum-norm solution, where the default QR
    # one returns rows that fit far worse
    rows = torch.linalg.lstsq(design(fit), fit.hidden.double().cpu(), driver="gelsd").solution
    calculator = ExplainedVarianceCalculator()
    calculator.add_batch((design(test) @ rows).float(), test.hidden.cpu())
    return float(calculator.compute())


def converged(history: list[dict[str, float]], keys: tuple[str, ...] = ("mcc", "f1")) -> bool:
    """The pre-registered rule (docs/research/synth-sae-bench.md): every ``key`` moved by under
    0.01 over the last quarter of training, from the evaluation nearest 3/4 of the run to the
    last one. Fewer than two evaluations decide nothing: not converged."""
    if len(history) < 2:
        return False
    last = history[-1]["step"]
    quarter = min(history, key=lambda row: abs(row["step"] - 0.75 * last))
    if quarter is history[-1]:
        return False
    return all(abs(history[-1][key] - quarter[key]) < 0.01 for key in keys)
