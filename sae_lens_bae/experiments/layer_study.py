"""How ``bae compare`` reads trained BAEs and SAEs on one split of held-out tokens.

Every model gets the same columns (definitions in ``sae_lens_bae.features.statistics``): the
paper's ``activated`` and Table 1's ``activated_strict``, ``constant``/``dead``/``dense`` on each
channel's active frequency, explained variance, L0 and the BAE's rare-state L0; with the language
model at hand, the next-token loss and KL it costs spliced into the model
(``sae_lens_bae.evaluation.spliced_losses``), and k-sparse probing accuracy on labelled sentences
(``sae_lens_bae.features.probing``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from sae_lens.saes.sae import TrainStepInput
from torch import Tensor
from transformer_lens import HookedTransformer

from sae_lens_bae.activations import (
    LayerActivations,
    prompt_states,
    sequence_splits,
)
from sae_lens_bae.evaluation import spliced_losses
from sae_lens_bae.features import (
    FeatureRecords,
    code_prior,
    feature_statistics,
    top_k_records,
)
from sae_lens_bae.features.burstiness import PriorSource
from sae_lens_bae.features.probing import k_sparse_probe_accuracy, sentence_features
from sae_lens_bae.features.statistics import DENSE_FREQUENCY
from sae_lens_bae.prompts import encode_prompts
from sae_lens_bae.saes.protocols import BinaryEncoder

__all__ = [
    "EvaluationSettings",
    "evaluate_model",
    "probe_columns",
    "spliced_columns",
    "training_objective",
]


@dataclass(frozen=True)
class EvaluationSettings:
    """How models are read on held-out tokens (the metrics' parameters)."""

    records_k: int = 10
    n_explain: int = 5
    dense_threshold: float = DENSE_FREQUENCY
    prior: PriorSource = "training"
    spliced_sequences: int = 64
    outlier_norm_ratio: float = 10.0


def evaluate_model(
    name: str, sae: Any, data: LayerActivations, settings: EvaluationSettings
) -> tuple[dict[str, Any], FeatureRecords, Tensor | None]:
    """The statistics of one model on ``data``'s held-out tokens, its records (the paper's:
    top-k over all channels, burstiness for a BAE) and the BAE's burstiness prior (None for an
    SAE)."""
    sae.eval()
    inputs = data.test[data.hook]
    is_bae = isinstance(sae, BinaryEncoder)
    prior = code_prior(sae, inputs, source=settings.prior) if is_bae else None
    magnitude = "burstiness" if is_bae else "raw"
    records = top_k_records(
        sae, inputs, data.positions, data.token_ids, magnitude, k=settings.records_k,
        prior=prior, sequences=data.sequences, candidates="all",
    )  # fmt: skip
    records.info = {"model": data.model, "hook": data.hook, "sae": name}
    stats = feature_statistics(
        sae, inputs, records, n_explain=settings.n_explain, dense_threshold=settings.dense_threshold
    )
    stats["magnitude"] = magnitude
    return stats, records, prior


def spliced_columns(
    models: dict[str, Any],
    data: LayerActivations,
    settings: EvaluationSettings,
    model: HookedTransformer,
) -> dict[str, dict[str, float | None]]:
    """``spliced_losses`` of every model that reads and writes the studied hook, on the first
    ``settings.spliced_sequences`` held-out sequences of the language model ``model``."""
    if not models or settings.spliced_sequences <= 0:
        return {}
    held_out = data.sequences[data.positions[:, 0].unique()][: settings.spliced_sequences]
    return spliced_losses(
        model,
        models,
        held_out,
        data.hook,
        input_scale=data.scales[data.hook],
        outlier_norm_ratio=settings.outlier_norm_ratio,
    )


@torch.no_grad()
def probe_columns(
    models: dict[str, Any],
    data: LayerActivations,
    sentences: list[tuple[str, str]],
    model: HookedTransformer,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Per model, ``probe_accuracy`` on labelled sentences: k -> held-out accuracy of the k-sparse
    probe, fitted on a seeded half of the sentences, scored on the other half. Two labels are
    needed."""
    labels = sorted({label for _, label in sentences})
    if len(labels) != 2:
        raise ValueError(f"probing needs sentences of two labels, got {labels}")
    tokens, last = encode_prompts([text for text, _ in sentences], model.tokenizer)
    states, where, _ = prompt_states(model, tokens, last[:, 0], data.hook, progress=False)
    y = torch.tensor([labels.index(label) for _, label in sentences])
    order = torch.randperm(len(sentences), generator=torch.Generator().manual_seed(seed))
    halves = sequence_splits(len(sentences), {"test": 0.5})
    train, test = order[list(halves["train"])], order[list(halves["test"])]
    columns = {}
    for name, sae in models.items():
        features = sentence_features(
            sae, states, where[:, 0], len(sentences), data.scales[data.hook]
        )
        probe = k_sparse_probe_accuracy(features[train], y[train], features[test], y[test])
        columns[name] = {"probe_accuracy": {str(k): a for k, a in probe.items()}}  # JSON's keys
    return columns


@torch.no_grad()
def training_objective(sae: Any, states: Tensor, batch_size: int, steps: int) -> float:
    """The loss ``sae`` trained on (its ``training_forward_pass``, the coefficients at their
    final values, no dead-latent term), averaged over whole minibatches of ``batch_size`` rows
    of ``states``: how well a run optimised its own objective, whatever its sparsity. Read on a
    copy, so the model's running statistics do not move."""
    copied = copy.deepcopy(sae)
    coefficients = {
        name: getattr(value, "value", value) for name, value in copied.get_coefficients().items()
    }
    losses = []
    for start in range(0, states.shape[0] - batch_size + 1, batch_size):
        step = TrainStepInput(
            sae_in=states[start : start + batch_size].to(sae.W_dec.device, sae.W_dec.dtype),
            coefficients=coefficients, dead_neuron_mask=None, n_training_steps=steps - 1,
            is_logging_step=False,
        )  # fmt: skip
        losses.append(float(copied.training_forward_pass(step).loss))
    if not losses:
        raise ValueError(f"{states.shape[0]} rows make no minibatch of {batch_size}")
    return sum(losses) / len(losses)
