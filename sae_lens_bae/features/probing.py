"""k-sparse probing, as SAEBench defines it: a judge-free measure of whether a dictionary has
latents for a concept. On labelled sentences (one feature vector each: the SAE's latents
mean-pooled over the sentence's tokens, standardised on the probe's training sentences), the k
latents whose class means differ most on the
probe's training sentences are kept, a logistic-regression probe is fitted on them, and its
accuracy on held-out sentences is the score, for each k."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from sklearn.linear_model import LogisticRegression
from torch import Tensor

__all__ = [
    "PROBE_KS",
    "k_sparse_probe_accuracy",
    "k_sparse_probe_correct",
    "sentence_features",
    "top_latents",
]

PROBE_KS = (1, 5, 20)
"""The k of the probes (SAEBench reads 1, 2, 5 and more; 1, 5 and 20 span a small dictionary)."""


def top_latents(
    features: Float[Tensor, "n d_sae"], labels: Int[Tensor, " n"], k: int
) -> Int[Tensor, " k"]:
    """The k latents with the largest |mean over class 1 - mean over class 0| (ties: the lower
    index first)."""
    labels = labels.bool()
    if labels.all() or not labels.any():
        raise ValueError("the probe's training sentences hold one class only; give both")
    gap = (features[labels].double().mean(0) - features[~labels].double().mean(0)).abs()
    return torch.argsort(gap, descending=True, stable=True)[:k]


def k_sparse_probe_accuracy(
    train: Float[Tensor, "n d_sae"],
    train_labels: Int[Tensor, " n"],
    test: Float[Tensor, "m d_sae"],
    test_labels: Int[Tensor, " m"],
    ks: Sequence[int] = PROBE_KS,
) -> dict[int, float]:
    """Held-out accuracy of the k-sparse probe (``k_sparse_probe_correct``), for each k."""
    correct = k_sparse_probe_correct(train, train_labels, {"test": (test, test_labels)}, ks)
    return {k: float(np.mean(hits)) for k, hits in correct["test"].items()}


def k_sparse_probe_correct(
    train: Float[Tensor, "n d_sae"],
    train_labels: Int[Tensor, " n"],
    tests: dict[str, tuple[Tensor, Tensor]],
    ks: Sequence[int] = PROBE_KS,
) -> dict[str, dict[int, np.ndarray]]:
    """Per test set and k, which of its sentences the probe labels right. Features are
    standardised by the training sentences' mean and standard deviation (so no latent wins
    for its scale), the k latents chosen on the training sentences (``top_latents``) and
    sklearn's L2 logistic regression at C = 1 fitted on them, as SAEBench fits it."""
    mean, std = train.double().mean(0), train.double().std(0).clamp_min(1e-8)
    train_z = (train.double() - mean) / std
    y_train = train_labels.cpu().numpy()
    found: dict[str, dict[int, np.ndarray]] = {name: {} for name in tests}
    for k in ks:
        keep = top_latents(train_z, train_labels, min(k, train.shape[1]))
        probe = LogisticRegression(C=1.0, max_iter=1000).fit(train_z[:, keep].numpy(), y_train)
        for name, (features, labels) in tests.items():
            z = ((features.double() - mean) / std)[:, keep].numpy()
            found[name][k] = probe.predict(z) == labels.cpu().numpy()
    return found


@torch.no_grad()
def sentence_features(
    sae: Any,
    states: Float[Tensor, "rows d"],
    sentence_of_row: Int[Tensor, " rows"],
    n_sentences: int,
    input_scale: float = 1.0,
) -> Float[Tensor, "n d_sae"]:
    """One feature vector per sentence: ``sae.encode`` of its token states (rows of ``states``
    whose ``sentence_of_row`` is the sentence, as ``activations.prompt_states`` gives them),
    times ``input_scale`` (the scale the SAE was trained at), averaged over its tokens."""
    codes = sae.encode((states * input_scale).to(sae.W_dec.device, sae.W_dec.dtype)).float().cpu()
    sums = torch.zeros(n_sentences, codes.shape[1]).index_add_(0, sentence_of_row, codes)
    tokens = torch.bincount(sentence_of_row, minlength=n_sentences).clamp(min=1)
    return sums / tokens[:, None]
