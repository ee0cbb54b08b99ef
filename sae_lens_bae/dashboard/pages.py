"""What a feature dashboard shows, gathered from the pipeline's outputs: records (contexts,
magnitudes), the SAE or BAE (prior, decoder rows), the model's unembedding (logit lens) and a
ComSem run (explanation, score). Plain data: ``html.py`` renders it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.features.records import FeatureRecords
from sae_lens_bae.features.statistics import rarity as bit_rarity
from sae_lens_bae.reports import read_jsonl

__all__ = ["Context", "FeaturePage", "build_pages", "comsem_results", "logit_lens"]


@dataclass
class Context:
    """One activating token in its text."""

    before: str
    token: str
    after: str
    magnitude: float


@dataclass
class FeaturePage:
    """Everything shown about one feature; ``None`` where its source was not given."""

    feature: int
    records: int  # tokens whose top-k holds the feature
    frequency: float  # records / tokens in the records
    rarity: float | None  # min(p, 1 - p) of the BAE's prior for this feature's bits
    burstiness: float  # mean magnitude of its records
    magnitudes: list[float] = field(default_factory=list)  # every record's, for the histogram
    contexts: list[Context] = field(default_factory=list)  # strongest first
    promoted: list[tuple[str, float]] | None = None  # logit lens: tokens it pushes up
    suppressed: list[tuple[str, float]] | None = None
    explanation: str | None = None
    score: float | None = None


def comsem_results(folder: str | Path) -> dict[int, dict[str, Any]]:
    """Explanation and score per feature of a ComSem run (its ``features.jsonl``)."""
    path = Path(folder) / "features.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"No features.jsonl in {folder}: give the --out of bae interpret")
    fix = "run bae interpret again into a new --out"
    rows = read_jsonl(path, "a ComSem run's features", fix, ("feature",))
    return {int(row["feature"]): row for row in rows}


def logit_lens(
    decoder: Float[Tensor, "d_sae d_in"],
    unembed: Float[Tensor, "d_in vocab"],
    tokenizer: Any,
    top: int = 10,
) -> list[tuple[list[tuple[str, float]], list[tuple[str, float]]]]:
    """Per feature, the tokens its decoder row promotes and suppresses most through the
    unembedding (``W_dec[f] @ W_U``), with their logit changes."""
    logits = decoder.float() @ unembed.float()
    up = logits.topk(min(top, logits.shape[1]), dim=-1)
    down = (-logits).topk(min(top, logits.shape[1]), dim=-1)

    def named(ids: Tensor, values: Tensor) -> list[tuple[str, float]]:
        return [(tokenizer.decode([int(i)]), float(v)) for i, v in zip(ids, values, strict=True)]

    return [
        (named(up.indices[f], up.values[f]), named(down.indices[f], -down.values[f]))
        for f in range(logits.shape[0])
    ]


def build_pages(
    records: FeatureRecords,
    tokenizer: Any,
    *,
    prior: Float[Tensor, " n_bits"] | None = None,
    bits_per_feature: int = 1,
    lens: list[tuple[list[tuple[str, float]], list[tuple[str, float]]]] | None = None,
    comsem: dict[int, dict[str, Any]] | None = None,
    contexts: int = 20,
    features: list[int] | None = None,
) -> list[FeaturePage]:
    """One page per feature that has records (or per ``features`` among them)."""
    counts = records.counts()
    n_tokens = max(records.features.shape[0], 1)
    chosen = features if features is not None else counts.nonzero().flatten().tolist()
    rarity = None if prior is None else bit_rarity(prior).reshape(-1, bits_per_feature).mean(-1)
    pages = []
    for feature in chosen:
        ranked = records.samples(feature)
        if not ranked:
            continue
        magnitudes = [m for _, m in ranked]
        page = FeaturePage(
            feature=feature,
            records=len(ranked),
            frequency=len(ranked) / n_tokens,
            rarity=None if rarity is None else float(rarity[feature]),
            burstiness=sum(magnitudes) / len(magnitudes),
            magnitudes=magnitudes,
            contexts=[
                Context(*records.context_parts(index, tokenizer), magnitude=magnitude)
                for index, magnitude in ranked[:contexts]
            ],
        )
        if lens is not None:
            page.promoted, page.suppressed = lens[feature]
        if comsem is not None and feature in comsem:
            page.explanation = comsem[feature].get("explanation")
            page.score = comsem[feature].get("score")
        pages.append(page)
    return pages
