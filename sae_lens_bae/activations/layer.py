"""One layer's activations over a text source, cleaned, scaled and split for training.

Every experiment that trains models on one layer (compare, compression, more-bit decoding) needs
the same steps after a harvest: drop the attention-sink outliers, scale once so that all models
share one loss unit, and split by sequence into training and held-out rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.activations.cache import harvest_activations
from sae_lens_bae.activations.hooks import check_hooks, hook_point, layer_of
from sae_lens_bae.data import default_corpus, iter_texts, tokenize_texts
from sae_lens_bae.models import load_model
from sae_lens_bae.outliers import NORM_RATIO, drop_outliers, outlier_mask, report_outliers

__all__ = [
    "LayerActivations",
    "drop_outliers",
    "harvest_layer",
    "held_out_splits",
    "norm_scale",
    "outlier_mask",
    "sequence_splits",
]


def norm_scale(acts: Float[Tensor, "n d"]) -> float:
    """sqrt(d) / mean norm: the factor that gives ``acts`` a mean norm of sqrt(d), as SAELens'
    ``expected_average_only_in`` would. Every command here scales states by it once, for all
    the models it trains, so their losses share one unit. The mean is summed exactly (``fsum``):
    a float reduction's rounding depends on the thread count, and the scaled rows are what a
    resumed run is recognised by."""
    norms = acts.norm(dim=-1).tolist()
    return acts.shape[1] ** 0.5 / (math.fsum(norms) / len(norms))


@dataclass
class LayerActivations:
    """One layer's activations over a text source, ready for training and held-out evaluation.

    Rows are tokens (BOS dropped, outliers by norm dropped), split by *sequence* into training
    and held-out rows, every hook scaled once by sqrt(d) / (mean training norm) as SAELens'
    ``expected_average_only_in`` would (``scales[hook]``), so that models trained on them share
    one loss unit. ``positions``/``token_ids`` locate the held-out rows in ``sequences``.
    """

    hook: str
    train: dict[str, Tensor]
    test: dict[str, Tensor]
    scales: dict[str, float]
    positions: Tensor
    token_ids: Tensor
    sequences: Tensor
    tokenizer: Any
    model: str
    dataset: str
    outliers_dropped: int


def sequence_splits(n_sequences: int, held_out: Mapping[str, float]) -> dict[str, range]:
    """Disjoint, contiguous blocks of sequence indices: ``train`` first, then each named held-out
    split with its fraction of the sequences (at least one), in the order given. Whole sequences
    go to one split, so no split sees a token of another's text."""
    sizes = {name: max(1, round(fraction * n_sequences)) for name, fraction in held_out.items()}
    bad = [name for name, fraction in held_out.items() if not 0.0 < fraction < 1.0]
    n_train = n_sequences - sum(sizes.values())
    if bad or n_train < 1:
        raise ValueError(
            f"held-out fractions {dict(held_out)} of {n_sequences} sequences leave no training "
            "sequence; give fractions in (0, 1) that sum to less than 1, or more text"
        )
    splits, start = {"train": range(n_train)}, n_train
    for name, size in sizes.items():
        splits[name], start = range(start, start + size), start + size
    return splits


def harvest_layer(
    model_name: str,
    dataset: str | None,
    layer: int | None,
    out_dir: str | Path,
    *,
    hook: str = "hook_resid_post",
    extra_hooks: Sequence[str] = (),
    text_column: str | None = None,
    context_size: int = 128,
    max_sequences: int | None = 1536,
    held_out_fraction: float = 0.1,
    outlier_norm_ratio: float | None = NORM_RATIO,
    device: str = "cpu",
    progress: bool = True,
    like: LayerActivations | None = None,
) -> LayerActivations:
    """Load the model and the text (``None``: the embedded corpus), harvest the hook point
    ``hook``/``layer`` name (``hook_point``: by default ``hook_resid_post`` of the middle layer)
    and ``extra_hooks`` (names inside the same block) once, then drop, scale and split.

    ``like``: another text read as ``like`` was (its hook points and scales), every row held
    out, for an out-of-distribution test set. Extreme states (``sae_lens_bae.outliers``: norm
    above ``outlier_norm_ratio`` x the harvest's median; None keeps them) are dropped from
    every split, and counted in ``outliers_dropped``."""
    if not 0.0 < held_out_fraction < 1.0:
        raise ValueError(f"held_out_fraction must be in (0, 1), got {held_out_fraction}")
    source = dataset if dataset is not None else str(default_corpus())
    texts = iter_texts(source, text_column=text_column)  # a missing path fails before the model
    model = load_model(model_name, device=device)
    if like is None:
        hook = hook_point(model, hook, layer)
        hooks = [hook, *[f"blocks.{layer_of(hook)}.{name}" for name in extra_hooks]]
    else:
        hook, hooks = like.hook, list(like.scales)
    check_hooks(model, hooks)
    tokens = tokenize_texts(texts, model.tokenizer, context_size, max_sequences=max_sequences)
    cache = harvest_activations(
        model, tokens, hooks, Path(out_dir), batch_size=8, progress=progress
    )
    tokenizer = model.tokenizer
    del model

    n_seq = cache.meta["n_sequences"]
    n_train_seq = 0
    if like is None:
        n_train_seq = len(sequence_splits(n_seq, {"test": held_out_fraction})["train"])
    acts = {h: cache.activations(h) for h in hooks}
    per_seq = acts[hook].shape[0] // n_seq
    keep = outlier_mask(acts[hook], outlier_norm_ratio)  # the same rows of every hook
    report_outliers(int((~keep).sum()), len(keep), f"harvest of {hook}", outlier_norm_ratio)
    n_train = int(keep[: n_train_seq * per_seq].sum())
    positions = cache.token_positions()[keep]
    sequences = cache.tokens()
    token_ids = sequences[positions[:, 0], positions[:, 1]]
    train, test = {}, {}
    scales = dict(like.scales) if like is not None else {}
    for h in hooks:
        kept = acts[h][keep]
        if h not in scales:
            scales[h] = norm_scale(kept[:n_train])
        train[h], test[h] = kept[:n_train] * scales[h], kept[n_train:] * scales[h]
    return LayerActivations(
        hook=hook,
        train=train,
        test=test,
        scales=scales,
        positions=positions[n_train:],
        token_ids=token_ids[n_train:],
        sequences=sequences,
        tokenizer=tokenizer,
        model=model_name,
        dataset=source,
        outliers_dropped=int((~keep).sum()),
    )


def held_out_splits(data: LayerActivations, names: Sequence[str]) -> dict[str, LayerActivations]:
    """The held-out rows of ``data`` cut by sequence into ``len(names)`` consecutive blocks of
    (nearly) equal sequence counts, one view of ``data`` each: no two share a sequence, and none
    shares one with the training rows."""
    held = data.positions[:, 0].unique()
    if len(held) < len(names):
        raise ValueError(
            f"{len(held)} held-out sequences cannot make the {len(names)} splits {list(names)}; "
            "harvest more text or hold out a larger fraction"
        )
    views = {}
    for name, block in zip(names, torch.tensor_split(held, len(names)), strict=True):
        rows = torch.isin(data.positions[:, 0], block)
        views[name] = replace(
            data,
            test={h: t[rows] for h, t in data.test.items()},
            positions=data.positions[rows],
            token_ids=data.token_ids[rows],
        )
    return views
