"""How ``bae compare`` reads a model on one split: every metric from per-sequence sums, so that
the point estimate (every sequence once) and each bootstrap replicate (a resample of the
split's sequences, shared by every model) come from one definition (``split_metrics``).

Per sequence: tokens, squared error, the sums EV's variance needs, each latent's active
tokens (``features.activity``: an SAE latent that fires, a BAE bit in its rare state) and each
feature's records under every magnitude (``MAGNITUDES_READ``); with the language model at hand,
what splicing each model into it costs (``spliced_reads``) and k-sparse probing accuracy on
labelled sentences (``probe_reads``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sae_lens_bae.activations import LayerActivations, prompt_states, sequence_splits
from sae_lens_bae.evaluation import spliced_losses
from sae_lens_bae.features import FeatureRecords, code_prior, frequency_counts, top_k_records
from sae_lens_bae.features.activity import latent_activity
from sae_lens_bae.features.probing import k_sparse_probe_correct, sentence_features
from sae_lens_bae.features.statistics import TABLE_1_MIN_RECORDS
from sae_lens_bae.prompts import encode_prompts

__all__ = [
    "MAGNITUDES_READ",
    "SplitSums",
    "probe_reads",
    "read_split",
    "row_of_metrics",
    "sequence_weights",
    "spliced_reads",
    "split_metrics",
]

MAGNITUDES_READ = ("native", "rescaled", "support")
"""``activated`` under each family's own magnitude (burstiness for a BAE, the raw activation for
an SAE) and the two common to every family (``features.records.feature_magnitudes``)."""


@dataclass
class SplitSums:
    """Per-sequence sums of one model on one split (rows: the split's sequences, sorted)."""

    tokens: Tensor  # [S]
    sse: Tensor  # [S]
    x_sum: Tensor  # [S, d]
    x_sq: Tensor  # [S]
    active: Tensor  # [S, latents]
    records: dict[str, Tensor]  # magnitude -> [S, latents]


def sequence_weights(n: int, replicates: int, seed: int) -> np.ndarray:
    """How often each of n units is drawn in each of ``replicates`` resamples with replacement."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(replicates, n))
    return np.stack([np.bincount(row, minlength=n) for row in draws]).astype(np.float64)


@torch.no_grad()
def read_split(
    sae: Any, data: LayerActivations, records_k: int, prior_source: str, batch_size: int = 4096
) -> tuple[SplitSums, FeatureRecords]:
    """``SplitSums`` of ``sae`` on ``data``'s held-out rows, and its native records."""
    x_all = data.test[data.hook]
    sequences, row_of = data.positions[:, 0].unique(return_inverse=True)
    n_seq, is_bae = len(sequences), hasattr(sae, "encode_bits")
    majority = code_prior(sae, x_all, source="evaluation") > 0.5 if is_bae else None
    sums = {"tokens": torch.zeros(n_seq, dtype=torch.float64), "sse": None, "x_sum": None}
    for start in range(0, x_all.shape[0], batch_size):
        x = x_all[start : start + batch_size].to(sae.W_dec.device, sae.W_dec.dtype)
        rows = row_of[start : start + batch_size]
        parts = {
            "tokens": torch.ones(len(rows), dtype=torch.float64),
            "sse": (sae.decode(sae.encode(x)) - x).double().pow(2).sum(-1).cpu(),
            "x_sum": x.double().cpu(),
            "x_sq": x.double().pow(2).sum(-1).cpu(),
            "active": latent_activity(sae, x, majority).double().cpu(),
        }
        for key, part in parts.items():
            if sums.get(key) is None:
                sums[key] = torch.zeros((n_seq, *part.shape[1:]), dtype=torch.float64)
            sums[key].index_add_(0, rows, part)
    counted, native = {}, None
    for name in MAGNITUDES_READ:
        magnitude = name if name != "native" else "burstiness" if is_bae else "raw"
        prior = code_prior(sae, x_all, source=prior_source) if magnitude == "burstiness" else None
        made = top_k_records(
            sae,
            x_all,
            data.positions,
            data.token_ids,
            magnitude,
            k=records_k,
            prior=prior,
            sequences=data.sequences,
        )
        counted[name] = made.counts_by_sequence()[1].double()
        native = made if name == "native" else native
    return SplitSums(records=counted, **sums), native  # type: ignore[arg-type]


def split_metrics(sums: SplitSums, weights: np.ndarray, n_explain: int) -> dict[str, list[Any]]:
    """Every metric of one model on one split, once per row of ``weights`` (each sequence
    counted ``weights[b, i]`` times): EV, the ``frequency_counts`` of the firing frequency (L0,
    dead, constant, dense) and ``activated``/``activated_strict`` under every magnitude."""
    w = torch.as_tensor(weights, dtype=torch.float64)
    tokens = w @ sums.tokens
    sst = w @ sums.x_sq - (w @ sums.x_sum).pow(2).sum(-1) / tokens
    found: dict[str, list[Any]] = {"explained_variance": (1 - (w @ sums.sse) / sst).tolist()}
    frequencies = (w @ sums.active) / tokens[:, None]
    for counts in map(frequency_counts, frequencies):
        for key in ("l0", "dead", "constant", "dense"):
            found.setdefault(key, []).append(counts[key])
    for name, records in sums.records.items():
        per_feature = w @ records  # FeatureRecords.activated: more than min_samples records
        found[f"activated_by_magnitude.{name}"] = (per_feature > n_explain).sum(-1).tolist()
        strict = (per_feature > TABLE_1_MIN_RECORDS).sum(-1).tolist()
        found[f"activated_strict_by_magnitude.{name}"] = strict
    found["activated"] = found["activated_by_magnitude.native"]
    found["activated_strict"] = found["activated_strict_by_magnitude.native"]
    return found


def row_of_metrics(sums: SplitSums, weights: np.ndarray, n_explain: int) -> dict[str, Any]:
    """A row's metrics (every sequence once) and ``replicates`` (one per row of ``weights``)."""
    point = split_metrics(sums, np.ones((1, len(sums.tokens))), n_explain)
    row: dict[str, Any] = {}
    for key, values in point.items():
        if "." in key:
            outer, inner = key.split(".")
            row.setdefault(outer, {})[inner] = values[0]
        else:
            row[key] = values[0]
    row["replicates"] = split_metrics(sums, weights, n_explain)
    return row


def spliced_reads(
    models: dict[str, Any],
    data: LayerActivations,
    language_model: Any,
    sequences: int,
    outlier_norm_ratio: float | None,
) -> dict[str, dict[str, Any]]:
    """``spliced_losses`` of every model that reads and writes ``data``'s hook, on its first
    ``sequences`` held-out sequences (none: nothing read)."""
    if not models or sequences <= 0:
        return {}
    held_out = data.sequences[data.positions[:, 0].unique()][:sequences]
    return spliced_losses(
        language_model,
        models,
        held_out,
        data.hook,
        input_scale=data.scales[data.hook],
        outlier_norm_ratio=outlier_norm_ratio,
    )


@torch.no_grad()
def probe_reads(
    models: dict[str, Any],
    data: LayerActivations,
    tasks: dict[str, list[tuple[str, str]]],
    language_model: Any,
    seed: int,
    replicates: int,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per model and split, k-sparse probing accuracy per task: on ``test`` rows, each task's
    probe (fitted on a seeded half of its sentences) on its other half; on ``ood`` rows, the
    same probe on the held-out half of the next task (another text, the same two labels), and
    nothing with one task. Each with its binomial standard error and bootstrap replicates over
    the sentences read."""
    halves = {}
    for task, pairs in tasks.items():
        labels = sorted({label for _, label in pairs})
        tokens, last = encode_prompts([text for text, _ in pairs], language_model.tokenizer)
        states, where, _ = prompt_states(
            language_model, tokens, last[:, 0], data.hook, progress=False
        )
        y = torch.tensor([labels.index(label) for _, label in pairs])
        order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed))
        cut = sequence_splits(len(pairs), {"test": 0.5})
        halves[task] = (states, where[:, 0], y, order[list(cut["train"])], order[list(cut["test"])])
    names = list(tasks)
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for name, sae in models.items():
        features = {
            t: sentence_features(sae, h[0], h[1], len(h[2]), data.scales[data.hook])
            for t, h in halves.items()
        }
        found[name] = {"test": {}, "ood": {}}
        for i, task in enumerate(names):
            _, _, y, fit, held = halves[task]
            other = names[(i + 1) % len(names)]
            tests = {"test": (features[task][held], y[held])}
            if other != task:
                o = halves[other]
                tests["ood"] = (features[other][o[4]], o[2][o[4]])
            correct = k_sparse_probe_correct(features[task][fit], y[fit], tests)
            for split, per_k in correct.items():
                found[name][split][task] = _probe_summary(per_k, replicates, seed)
    return found


def _probe_summary(per_k: dict[int, np.ndarray], replicates: int, seed: int) -> dict[str, Any]:
    """Accuracy, binomial standard error and bootstrap replicates (sentences resampled) per k."""
    n = len(next(iter(per_k.values())))
    weights = sequence_weights(n, replicates, seed)
    summary: dict[str, Any] = {"sentences": n, "accuracy": {}, "standard_error": {}}
    summary["replicates"] = {}
    for k, hits in per_k.items():
        accuracy = float(np.mean(hits))
        summary["accuracy"][str(k)] = accuracy
        summary["standard_error"][str(k)] = float(np.sqrt(accuracy * (1 - accuracy) / n))
        summary["replicates"][str(k)] = (weights @ hits.astype(float) / n).tolist()
    return summary
