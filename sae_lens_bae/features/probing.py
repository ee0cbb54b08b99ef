"""k-sparse probing, as SAEBench defines it: a judge-free measure of whether a dictionary has
latents for a concept. On labelled sentences (one feature vector each: the SAE's latents
mean-pooled over the sentence's tokens), the k latents whose class means differ most on the
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
from transformer_lens import HookedTransformer

from sae_lens_bae.activations.hooks import stop_layer

__all__ = [
    "PROBE_KS",
    "k_sparse_probe_accuracy",
    "sentence_features",
    "sentence_states",
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
    """Held-out accuracy of the logistic-regression probe on the top-k latents (``top_latents``
    on the training sentences only), for each k; sklearn's L2 probe at C = 1 as SAEBench fits it."""
    accuracies = {}
    y_train, y_test = train_labels.cpu().numpy(), test_labels.cpu().numpy()
    for k in ks:
        keep = top_latents(train, train_labels, min(k, train.shape[1]))
        x_train = train[:, keep].double().cpu().numpy()
        x_test = test[:, keep].double().cpu().numpy()
        probe = LogisticRegression(C=1.0, max_iter=1000).fit(x_train, y_train)
        accuracies[k] = float(np.mean(probe.predict(x_test) == y_test))
    return accuracies


@torch.no_grad()
def sentence_states(
    model: HookedTransformer, hook: str, sentences: Sequence[Int[Tensor, " tokens"]]
) -> list[Float[Tensor, "tokens d"]]:
    """The hook's states of each sentence (its tokens after BOS), one forward pass a sentence,
    stopping after the hook's block: read once, then encoded by every model."""
    device = next(model.parameters()).device
    states = []
    for tokens in sentences:
        _, cache = model.run_with_cache(
            tokens.to(device)[None], names_filter=hook, stop_at_layer=stop_layer([hook])
        )
        states.append(cache[hook][0, 1:].float().cpu())
    return states


@torch.no_grad()
def sentence_features(
    sae: Any, states: Sequence[Float[Tensor, "tokens d"]], input_scale: float = 1.0
) -> Float[Tensor, "n d_sae"]:
    """One feature vector per sentence: ``sae.encode`` of its states (times ``input_scale``,
    the scale the SAE was trained at), averaged over its tokens."""
    dtype, device = sae.W_dec.dtype, sae.W_dec.device
    rows = [sae.encode((s * input_scale).to(device, dtype)).float().mean(0).cpu() for s in states]
    return torch.stack(rows)
