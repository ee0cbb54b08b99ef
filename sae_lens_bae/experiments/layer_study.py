"""What the one-layer model studies share (``bae compare``, ``bae bench recipes``): evaluating
trained BAEs and SAEs on the same held-out tokens, and the table and figures of the result.

Every model gets the same columns (definitions in ``sae_lens_bae.features.statistics``): the
paper's ``activated`` beside ours, ``constant``/``dead``/``dense``/``frequent`` on each channel's
active frequency, explained variance, L0, and, with the language model at hand, the next-token
loss and KL it costs spliced into the model (``sae_lens_bae.evaluation.spliced_losses``), and on
labelled sentences of another text the statistics of their tokens (``ood_*``) and k-sparse
probing accuracy (``sae_lens_bae.features.probing``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformer_lens import HookedTransformer

from sae_lens_bae.activations import (
    LayerActivations,
    outlier_mask,
    prompt_states,
    sequence_splits,
)
from sae_lens_bae.comsem import COMSEM_COLUMNS
from sae_lens_bae.evaluation import spliced_losses
from sae_lens_bae.features import (
    FeatureRecords,
    code_prior,
    feature_magnitudes,
    feature_statistics,
    top_k_records,
)
from sae_lens_bae.features.burstiness import PriorSource
from sae_lens_bae.features.probing import PROBE_KS, k_sparse_probe_accuracy, sentence_features
from sae_lens_bae.features.records import Candidates, Magnitude
from sae_lens_bae.plots import save_figure, subplots
from sae_lens_bae.prompts import encode_prompts
from sae_lens_bae.reports import cell, markdown_table
from sae_lens_bae.saes.protocols import BinaryEncoder

__all__ = [
    "OOD_COLUMNS",
    "TABLE_COLUMNS",
    "EvaluationSettings",
    "add_columns",
    "evaluate_model",
    "heat_map",
    "models_table",
    "plot_active_frequencies",
    "sentence_columns",
    "spliced_columns",
]

TABLE_COLUMNS = (
    ("explained_variance", "EV", ".3f"),
    ("l0", "L0", ".1f"),
    ("activated", "activated", ""),
    ("activated_strict", "activated (>8)", ""),
    ("activated_firing", "activated (firing)", ""),
    ("constant", "constant", ""),
    ("dead", "dead", ""),
    ("dense", "dense", ""),
    ("frequent", "active >10%", ""),
    ("firing_over_half", "firing >50%", ""),
    ("ce_loss_score", "CE recovered", ".3f"),
    ("kl_div_with_sae", "KL", ".4f"),
    ("reconstruction_loss", "reconstruction loss", ".4f"),
    ("decoder_covariance_norm", "‖Cov(W_dec)‖", ".4f"),
)
"""(key, title, format) of the table's columns, in order."""


@dataclass(frozen=True)
class EvaluationSettings:
    """How models are read on the held-out tokens (the metrics' parameters)."""

    records_k: int = 10
    n_explain: int = 5
    activated_min_samples: int = 8
    dense_threshold: float = 0.5
    prior: PriorSource = "training"
    spliced_sequences: int = 64
    outlier_norm_ratio: float = 10.0


def evaluate_model(
    name: str,
    sae: Any,
    data: LayerActivations,
    settings: EvaluationSettings,
    *,
    inputs: Tensor | None = None,
    targets: Tensor | None = None,
    magnitude: Magnitude | None = None,
) -> tuple[dict[str, Any], FeatureRecords, Tensor | None]:
    """The statistics of one model on the held-out tokens, its records (the paper's: top-k over
    all channels), and the BAE's burstiness prior (None for an SAE). ``inputs``/``targets``: a
    transcoder's own input and target hook points."""
    sae.eval()
    inputs = data.test[data.hook] if inputs is None else inputs
    is_bae = isinstance(sae, BinaryEncoder)
    prior = code_prior(sae, inputs, source=settings.prior) if is_bae else None
    magnitude = magnitude or ("burstiness" if is_bae else "raw")

    def records_of(candidates: Candidates) -> FeatureRecords:
        return top_k_records(
            sae, inputs, data.positions, data.token_ids, magnitude, k=settings.records_k,
            prior=prior, sequences=data.sequences, candidates=candidates,
        )  # fmt: skip

    records = records_of("all")
    firing = records_of("firing") if is_bae else records
    records.info = {"model": data.model, "hook": data.hook, "sae": name}
    stats = feature_statistics(
        sae,
        inputs,
        records,
        firing_records=firing,
        n_explain=settings.n_explain,
        activated_min_samples=settings.activated_min_samples,
        dense_threshold=settings.dense_threshold,
        targets=targets,
    )
    stats["magnitude"] = magnitude
    return stats, records, prior


def add_columns(rows: dict[str, dict[str, Any]], columns: dict[str, dict[str, Any]]) -> None:
    """Add each model's ``columns`` to its table row; ``standard_rescaled``, the standard SAE
    read with other magnitudes, shares the standard SAE's."""
    for name, values in columns.items():
        rows[name].update(values)
        if name == "standard" and "standard_rescaled" in rows:
            rows["standard_rescaled"].update(values)


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
    held_out = data.sequences[int(data.positions[0, 0]) :][: settings.spliced_sequences]
    return spliced_losses(
        model,
        models,
        held_out,
        data.hook,
        input_scale=data.scales[data.hook],
        outlier_norm_ratio=settings.outlier_norm_ratio,
    )


@torch.no_grad()
def heat_map(
    sae: Any, inputs: Tensor, magnitude: Magnitude, prior: Tensor | None, rates: Tensor
) -> Tensor:
    """Magnitudes of 64 held-out tokens on the 128 most used channels."""
    channels = torch.argsort(rates, descending=True)[:128]
    values, _ = feature_magnitudes(sae, inputs, magnitude, prior=prior)(0, 64)
    return values[:, channels]


OOD_COLUMNS = (
    ("ood_explained_variance", "EV (OOD)", ".3f"),
    ("ood_l0", "L0 (OOD)", ".1f"),
    ("ood_dead", "dead (OOD)", ""),
)
"""(key, title, format) of the out-of-distribution columns (``sentence_columns``)."""


@torch.no_grad()
def sentence_columns(
    models: dict[str, Any],
    data: LayerActivations,
    sentences: list[tuple[str, str]],
    settings: EvaluationSettings,
    model: HookedTransformer,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Per model, on labelled sentences of a text none was trained on: the statistics of their
    tokens (``ood_`` + ``explained_variance``, ``l0``, ``dead``, ``constant``; outliers dropped
    as in training) and ``probe_accuracy`` (k -> held-out accuracy of the k-sparse probe, fitted
    on a seeded half of the sentences, scored on the other half). Two labels are needed."""
    labels = sorted({label for _, label in sentences})
    if len(labels) != 2:
        raise ValueError(f"probing needs sentences of two labels, got {labels}")
    tokens, last = encode_prompts([text for text, _ in sentences], model.tokenizer)
    states, where, _ = prompt_states(model, tokens, last[:, 0], data.hook, progress=False)
    y = torch.tensor([labels.index(label) for _, label in sentences])
    order = torch.randperm(len(sentences), generator=torch.Generator().manual_seed(seed))
    halves = sequence_splits(len(sentences), {"test": 0.5})
    train, test = order[list(halves["train"])], order[list(halves["test"])]
    scale = data.scales[data.hook]
    ood = states * scale
    ood = ood[outlier_mask(ood, settings.outlier_norm_ratio)]
    columns = {}
    for name, sae in models.items():
        features = sentence_features(sae, states, where[:, 0], len(sentences), scale)
        probe = k_sparse_probe_accuracy(features[train], y[train], features[test], y[test])
        stats = feature_statistics(sae, ood, dense_threshold=settings.dense_threshold)
        keys = ("explained_variance", "l0", "dead", "constant")
        columns[name] = {
            "probe_accuracy": {str(k): accuracy for k, accuracy in probe.items()},  # JSON's keys
            **{f"ood_{k}": stats[k] for k in keys},
        }
    return columns


def models_table(rows: dict[str, dict[str, Any]], first: str = "model") -> str:
    """The markdown table of ``TABLE_COLUMNS`` (with ComSem's, the out-of-distribution and the
    probing columns when the rows have them)."""
    present = list(rows.values())
    with_comsem = any("comsem_score" in row for row in present)
    with_sentences = any("probe_accuracy" in row for row in present)
    columns = [(first, lambda row: row["name"])]
    columns += [
        (title, lambda row, key=key, spec=spec: cell(row.get(key), spec))
        for key, title, spec in TABLE_COLUMNS
        + (COMSEM_COLUMNS if with_comsem else ())
        + (OOD_COLUMNS if with_sentences else ())
    ]
    if with_sentences:
        columns += [
            (
                f"probe k={k}",
                lambda row, k=k: cell(row.get("probe_accuracy", {}).get(str(k)), ".3f"),
            )
            for k in PROBE_KS
        ]
    return markdown_table([{"name": name, **row} for name, row in rows.items()], columns)


def plot_active_frequencies(
    frequencies: dict[str, Tensor], path: str | Path, title: str = ""
) -> Path:
    """Histogram of log10 active frequency per model (a BAE bit's rarity min(p, 1 - p), an SAE
    latent's firing rate), with channels never active counted at the left edge."""
    fig, ax = subplots(figsize=(7.5, 4.5))
    floor = -6.0
    bins = np.linspace(floor, np.log10(0.5) + 0.05, 50)
    for name, values in frequencies.items():
        values = values.detach().float().cpu().numpy()
        logs = np.log10(np.clip(values, 10**floor, None))
        label = f"{name} ({int((values == 0).sum())} never active)"
        ax.hist(logs, bins=np.append(bins, 0.0), histtype="step", linewidth=1.4, label=label)
    ax.set(
        xlabel="log10 active frequency (BAE: rarity min(p, 1 - p); SAE: firing rate)",
        ylabel="channels",
        title=title or "Active frequency on held-out tokens",
    )
    ax.legend(fontsize=7)
    return save_figure(fig, path)
