"""ComSem's report: the summary numbers (FA, FI, mean score, invalid replies, tokens, cost) and
the files a run writes (``features.jsonl``, ``summary.json``/``.md``, ``scores.png``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sae_lens_bae.comsem.client import ClientConfig
from sae_lens_bae.comsem.stages import FeatureScore
from sae_lens_bae.plots import plot_comsem_scores
from sae_lens_bae.reports import cell, markdown_table, write_json, write_text

__all__ = ["summarise", "summary_markdown", "write_report"]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(
    results: Sequence[FeatureScore],
    *,
    d_sae: int,
    activated: int,
    client_config: ClientConfig,
    usage: dict[str, Any],
) -> dict[str, Any]:
    """FA, FI, mean score (over evaluated features with a usable explanation and judged records),
    invalid replies, tokens and cost of every reply used (cached or not), and this run's usage."""
    scored = [r for r in results if r.score is not None]
    prompt = sum(r.tokens.get("prompt", 0) for r in results)
    completion = sum(r.tokens.get("completion", 0) for r in results)
    balanced = [r.balanced_accuracy for r in results if r.balanced_accuracy is not None]
    return {
        "features": d_sae,
        "activated": activated,
        "evaluated": len(results),
        "explained": sum(r.explanation is not None for r in results),
        "interpretable": sum(r.interpretable for r in results),
        "mean_score": _mean([r.score for r in scored if r.score is not None]),
        "mean_balanced_accuracy": _mean(balanced),
        "detection_scored": len(balanced),  # features with sure negatives and a score
        "judged_records": sum(
            sum(j.activating and j.answer is not None for j in r.judgements) for r in results
        ),
        "invalid_explanations": sum(r.explanation is None for r in results),
        "invalid_judgements": sum(sum(j.answer is None for j in r.judgements) for r in results),
        "tokens": {"prompt": prompt, "completion": completion},
        "cost_usd": (prompt * client_config.price_input + completion * client_config.price_output)
        / 1e6,
        "model": client_config.model,
        "base_url": client_config.base_url,
        "run": usage,  # this run only: requests sent, retries, cache hits, tokens/cost paid
    }


def write_report(
    results: Sequence[FeatureScore], summary: dict[str, Any], out: Path, top: int = 20
) -> None:
    """Per-feature JSONL, the summary (JSON and markdown with the top features) and the plot."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "features.jsonl").open("w") as f:
        for result in results:
            f.write(json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
    write_json(out / "summary.json", summary)
    write_text(out / "summary.md", summary_markdown(results, summary, top))
    plot_comsem_scores([r.score for r in results if r.score is not None], out / "scores.png")


def summary_markdown(results: Sequence[FeatureScore], summary: dict[str, Any], top: int) -> str:
    run = summary["run"]
    lines = [
        f"# ComSem: {summary['magnitude']} records, judged by `{summary['model']}`",
        "",
        f"- features: {summary['features']}, activated (FA): {summary['activated']}, evaluated: "
        f"{summary['evaluated']}, interpretable (FI, score > 0): {summary['interpretable']}",
        f"- mean ComSem score over {summary['explained']} explained features: "
        f"{cell(summary['mean_score'], '.3f')}"
        + (
            f"; mean balanced accuracy (detection): "
            f"{cell(summary['mean_balanced_accuracy'], '.3f')}"
            if summary["mean_balanced_accuracy"] is not None
            else ""
        ),
        f"- judged records: {summary['judged_records']}; invalid replies: "
        f"{summary['invalid_explanations']} explanations, {summary['invalid_judgements']} "
        "judgements (never counted as No)",
        f"- tokens: {summary['tokens']['prompt']} prompt + {summary['tokens']['completion']} "
        f"completion, cost ${summary['cost_usd']:.4f}; this run: {run['requests']} requests, "
        f"{run['retries']} retries, {run['cache_hits']} cache hits, ${run['cost_usd']:.4f}",
        "",
        f"## Top {top} features",
        "",
    ]
    ranked = sorted(
        (r for r in results if r.score is not None),
        key=lambda r: (-(r.score or 0.0), r.feature),
    )[:top]
    columns = [
        ("feature", lambda r: str(r.feature)),
        ("score", lambda r: cell(r.score, ".3f")),
        ("explanation", lambda r: (r.explanation or "").replace("|", "\\|")),
        ("top tokens", lambda r: ", ".join(repr(s.token) for s in r.explain_samples)),
    ]
    return "\n".join(lines) + markdown_table(ranked, columns)
