"""ComSem's first stage: from top-k feature records to the samples each prompt shows.

A feature with at least ``n_explain + 1`` records is *activated* (FA). Its ``n_explain`` strongest
records go to the explainer; the next ``n_test`` (at most) are judged. Equal magnitudes (every
token a BAE bit fires on has the same burstiness) are ordered at random, seeded per feature. For
the optional detection score, as many *non-activating* samples are drawn at random (seeded per
feature) from tokens on which the feature is surely off (``FeatureRecords.surely_off``: not merely
outside the top-k), so that a vague explanation that fits everything cannot score 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from sae_lens_bae.features.records import FeatureRecords

__all__ = ["FeatureSamples", "Sample", "samples_for", "select_samples"]


@dataclass(frozen=True)
class Sample:
    """One token as a prompt shows it: the token's text, its position in its sequence, and the
    text around it with the token marked ``<<token>>``."""

    index: int  # row of the records
    token: str
    position: int
    sentence: str
    magnitude: float | None = None

    def prompt_fields(self) -> dict[str, Any]:
        return {"token": self.token, "position": self.position, "sentence": self.sentence}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FeatureSamples:
    """What ComSem shows about one activated feature."""

    feature: int
    explain: list[Sample]
    test: list[Sample]
    negatives: list[Sample] = field(default_factory=list)


def _sample(records: FeatureRecords, tokenizer: Any, index: int, magnitude: float | None) -> Sample:
    seq, pos = (int(v) for v in records.token_positions[index])
    token_id = int(records.token_ids[index])
    return Sample(
        index=index,
        token=tokenizer.decode([token_id]),
        position=pos,
        sentence=records.context(index, tokenizer),
        magnitude=magnitude,
    )


def select_samples(
    records: FeatureRecords,
    tokenizer: Any,
    *,
    n_explain: int = 5,
    n_test: int = 8,
    negatives: bool = False,
    features: Sequence[int] | None = None,
    max_features: int | None = None,
    seed: int = 0,
) -> list[FeatureSamples]:
    """The samples of every activated feature (or of ``features``, those of them activated),
    in feature order; ``max_features`` keeps the first ones. Deterministic given ``seed``.
    ``negatives``: also draw, per feature, ``n_test`` tokens on which it is surely off (for the
    detection score); a feature with fewer gets none and no detection score."""
    if n_explain < 1 or n_test < 1:
        raise ValueError(f"n_explain and n_test must be >= 1, got {n_explain} and {n_test}")
    if records.sequences is None:
        raise ValueError(
            "ComSem shows each token in its text, but these records were saved without their "
            "token rows; make them with top_k_records(..., sequences=...) (bae compare does)"
        )
    vocabulary = len(tokenizer) if hasattr(tokenizer, "__len__") else None
    largest = int(records.token_ids.max()) if records.token_ids.numel() else -1
    if vocabulary is not None and largest >= vocabulary:
        model = records.info.get("model", "the model that made them")
        raise ValueError(
            f"these records hold token id {largest}, beyond this tokenizer's {vocabulary} tokens: "
            f"they were made with another model ({model}); read them with its tokenizer (--model)"
        )
    counts = records.counts()
    activated = (counts >= n_explain + 1).nonzero().flatten().tolist()
    if features is not None:
        unknown = [f for f in features if not 0 <= f < records.d_sae]
        if unknown:
            raise ValueError(f"features {unknown} outside 0..{records.d_sae - 1}")
        wanted = set(features)
        activated = [f for f in activated if f in wanted]
    if max_features is not None:
        activated = activated[:max_features]
    selected = []
    for feature in activated:
        ranked = records.samples(feature, limit=n_explain + n_test, seed=seed * 1_000_003 + feature)
        shown = [_sample(records, tokenizer, i, m) for i, m in ranked]
        item = FeatureSamples(feature, explain=shown[:n_explain], test=shown[n_explain:])
        if negatives:
            # A feature with too few sure negatives gets none: its detection score is left out
            # (balanced accuracy None) rather than judged on tokens that may hold it.
            generator = torch.Generator().manual_seed(seed * 1_000_003 + feature)
            free = records.surely_off(feature).nonzero().flatten()
            if free.numel() >= len(item.test):
                picks = free[torch.randperm(free.numel(), generator=generator)[: len(item.test)]]
                item.negatives = [_sample(records, tokenizer, int(i), None) for i in picks]
        selected.append(item)
    if negatives and selected and not any(item.negatives for item in selected):
        raise ValueError(
            f"none of the {len(selected)} features has {n_test} tokens on which it is surely off "
            "(see FeatureRecords.surely_off), so none can get a detection score; make the "
            "records with a larger k (bae compare --records-k)"
        )
    return selected


def samples_for(records: FeatureRecords, tokenizer: Any, config: Any) -> list[FeatureSamples]:
    """``select_samples`` with the sample settings of a ``ComSemConfig`` (what a run asks the
    LLM about, and what its estimate counts)."""
    return select_samples(
        records,
        tokenizer,
        n_explain=config.n_explain,
        n_test=config.n_test,
        negatives=config.detection,
        features=config.features,
        max_features=config.max_features,
        seed=config.seed,
    )
