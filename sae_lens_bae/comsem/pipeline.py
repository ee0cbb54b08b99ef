"""ComSem, stage by stage: records -> explain -> judge -> score, then the report.

``comsem(records, tokenizer, client)`` runs them all. Each stage is a plain function of the
previous one's output (``select_samples``, ``explain``, ``judge``, ``score``), so a user can run,
inspect or replace any of them. The LLM is only asked for phrases and Yes/No answers; every reply
is cached on disk by the client, so a rerun or a resumed run pays for nothing twice.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sae_lens_bae.comsem.client import ChatClient, ClientConfig, ComSemAPIError, Reply
from sae_lens_bae.comsem.prompts import (
    Templates,
    load_templates,
    parse_explanation,
    parse_judgement,
)
from sae_lens_bae.comsem.samples import FeatureSamples, Sample, select_samples
from sae_lens_bae.features.records import FeatureRecords
from sae_lens_bae.reports import cell, markdown_table, write_json

__all__ = [
    "ComSemConfig",
    "Explanation",
    "FeatureScore",
    "Judgement",
    "COMSEM_COLUMNS",
    "acomsem",
    "calibrate",
    "comsem",
    "comsem_columns",
    "explain",
    "judge",
    "score",
    "summarise",
]


@dataclass
class ComSemConfig:
    """What ComSem evaluates. ``detection`` adds as many non-activating records as judged ones and
    a balanced accuracy; ``calibrate`` corrects the judge's Yes/No bias measured on a content-free
    input (needs a server that returns logprobs)."""

    n_explain: int = 5
    n_test: int = 8
    detection: bool = False
    calibrate: bool = False
    features: Sequence[int] | None = None
    max_features: int | None = None
    seed: int = 0
    top: int = 20
    templates: str | Path | None = None


@dataclass
class Explanation:
    feature: int
    reply: str | None
    phrase: str | None  # None: the reply was not one usable phrase
    tokens: tuple[int, int] = (0, 0)  # prompt, completion
    # the judge's (P(Yes), P(No)) on the content-free input, and that request's tokens
    prior: tuple[float, float] | None = None
    prior_tokens: tuple[int, int] = (0, 0)


@dataclass
class Judgement:
    sample: Sample
    activating: bool
    reply: str | None
    answer: bool | None  # None: invalid reply (not Yes/No), never counted as No
    raw_answer: bool | None = None  # before calibration, when calibrating
    tokens: tuple[int, int] = (0, 0)


@dataclass
class FeatureScore:
    feature: int
    explanation: str | None
    explanation_reply: str | None
    explain_samples: list[Sample]
    judgements: list[Judgement]
    score: float | None  # fraction of Yes over validly judged activating records
    balanced_accuracy: float | None = None
    tokens: dict[str, int] = field(default_factory=dict)

    @property
    def interpretable(self) -> bool:
        return self.score is not None and self.score > 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["interpretable"] = self.interpretable
        return data


async def explain(
    client: ChatClient, templates: Templates, items: Sequence[FeatureSamples], progress: bool = True
) -> list[Explanation]:
    """Stage 2: one explainer request per activated feature."""
    replies = await client.complete_many(
        [templates.explain_messages(item.explain) for item in items],
        desc="explain",
        progress=progress,
    )
    return [
        Explanation(
            item.feature,
            reply.text,
            parse_explanation(reply.text, templates),
            tokens=(reply.prompt_tokens, reply.completion_tokens),
        )
        for item, reply in zip(items, replies, strict=True)
    ]


def _yes_no_mass(reply: Reply) -> tuple[float, float]:
    if reply.top_logprobs is None:
        raise ComSemAPIError(
            "Calibration needs the judge's token probabilities, but the server returned no "
            "logprobs; use a server that supports logprobs (OpenAI, vLLM) or run without "
            "calibration"
        )
    yes = no = 0.0
    for token, logprob in reply.top_logprobs.items():
        word = token.strip().lower()
        if word == "yes":
            yes += math.exp(logprob)
        elif word == "no":
            no += math.exp(logprob)
    return yes, no


def _calibrated(reply: Reply, prior: tuple[float, float]) -> bool | None:
    """Contextual calibration: Yes when P(Yes)/P_cf(Yes) > P(No)/P_cf(No), with P_cf the judge's
    probabilities on the content-free input."""
    yes, no = _yes_no_mass(reply)
    if yes + no == 0:
        return None
    prior_yes, prior_no = (max(p, 1e-9) for p in prior)
    return yes / prior_yes > no / prior_no


async def calibrate(
    client: ChatClient,
    templates: Templates,
    explanations: Sequence[Explanation],
    progress: bool = True,
) -> list[Explanation]:
    """Optional stage between explain and judge: the judge's Yes/No probabilities for each usable
    explanation on the content-free input (the explanations come back with their ``prior``)."""
    explained = [e for e in explanations if e.phrase is not None]
    replies = await client.complete_many(
        [templates.judge_messages(e.phrase, None) for e in explained],  # type: ignore[arg-type]
        logprobs=True,
        desc="calibrate",
        progress=progress,
    )
    answers = iter(replies)
    calibrated = []
    for e in explanations:
        if e.phrase is not None:
            r = next(answers)
            e = replace(
                e, prior=_yes_no_mass(r), prior_tokens=(r.prompt_tokens, r.completion_tokens)
            )
        calibrated.append(e)
    return calibrated


async def judge(
    client: ChatClient,
    templates: Templates,
    items: Sequence[FeatureSamples],
    explanations: Sequence[Explanation],
    progress: bool = True,
) -> list[list[Judgement]]:
    """Stage 3: a Yes/No request per test (and non-activating) record of every explained feature;
    features without a usable explanation get no judgements. Explanations that carry a ``prior``
    (see ``calibrate``) have their answers calibrated against it."""
    calibrating = any(e.prior is not None for e in explanations)
    requests, owners = [], []
    for n, (item, explanation) in enumerate(zip(items, explanations, strict=True)):
        if explanation.phrase is None:
            continue
        for activating, samples in ((True, item.test), (False, item.negatives)):
            for sample in samples:
                requests.append(templates.judge_messages(explanation.phrase, sample))
                owners.append((n, sample, activating))
    replies = await client.complete_many(
        requests, logprobs=calibrating, desc="judge", progress=progress
    )
    judgements: list[list[Judgement]] = [[] for _ in items]
    for (n, sample, activating), reply in zip(owners, replies, strict=True):
        answer = parse_judgement(reply.text)
        tokens = (reply.prompt_tokens, reply.completion_tokens)
        judgement = Judgement(sample, activating, reply.text, answer, answer, tokens)
        prior = explanations[n].prior
        if prior is not None:
            judgement.answer = _calibrated(reply, prior)
        judgements[n].append(judgement)
    return judgements


def score(
    items: Sequence[FeatureSamples],
    explanations: Sequence[Explanation],
    judgements: Sequence[Sequence[Judgement]],
) -> list[FeatureScore]:
    """Stage 4: per feature, the fraction of Yes over validly judged activating records and, with
    non-activating records, the balanced accuracy (mean of the Yes rate on activating records and
    the No rate on the others)."""
    results = []
    for n, (item, explanation) in enumerate(zip(items, explanations, strict=True)):
        answers = judgements[n]
        positive = [j.answer for j in answers if j.activating and j.answer is not None]
        negative = [j.answer for j in answers if not j.activating and j.answer is not None]
        value = sum(positive) / len(positive) if positive else None
        balanced = None
        if value is not None and negative:
            balanced = (value + sum(not a for a in negative) / len(negative)) / 2
        used = [explanation.tokens, explanation.prior_tokens, *(j.tokens for j in answers)]
        results.append(
            FeatureScore(
                feature=item.feature,
                explanation=explanation.phrase,
                explanation_reply=explanation.reply,
                explain_samples=item.explain,
                judgements=list(answers),
                score=value,
                balanced_accuracy=balanced,
                tokens={"prompt": sum(t[0] for t in used), "completion": sum(t[1] for t in used)},
            )
        )
    return results


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
        "mean_score": _mean([r.score for r in scored]),  # type: ignore[misc]
        "mean_balanced_accuracy": _mean(balanced),  # type: ignore[arg-type]
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


async def acomsem(
    records: FeatureRecords,
    tokenizer: Any,
    client: ChatClient | ClientConfig,
    config: ComSemConfig | None = None,
    *,
    out: str | Path | None = None,
    cache: str | Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """``comsem`` for callers already inside an event loop (notebooks)."""
    config = config or ComSemConfig()
    if isinstance(client, ClientConfig):
        if cache is None and out is not None:
            cache = Path(out) / "replies.sqlite"
        client = ChatClient(client, cache)
    templates = load_templates(config.templates)
    items = select_samples(
        records,
        tokenizer,
        n_explain=config.n_explain,
        n_test=config.n_test,
        negatives=config.detection,
        features=config.features,
        max_features=config.max_features,
        seed=config.seed,
    )
    activated = int((records.counts() >= config.n_explain + 1).sum())
    try:
        explanations = await explain(client, templates, items, progress)
        if config.calibrate:
            explanations = await calibrate(client, templates, explanations, progress)
        judgements = await judge(client, templates, items, explanations, progress)
    finally:
        await client.aclose()
    results = score(items, explanations, judgements)
    summary = summarise(
        results,
        d_sae=records.d_sae,
        activated=activated,
        client_config=client.config,
        usage=asdict(client.usage),
    )
    summary["config"] = {k: v for k, v in asdict(config).items() if k != "features"}
    summary["magnitude"] = records.magnitude
    if out is not None:
        write_report(results, summary, Path(out), top=config.top)
    return summary


def comsem(
    records: FeatureRecords,
    tokenizer: Any,
    client: ChatClient | ClientConfig,
    config: ComSemConfig | None = None,
    *,
    out: str | Path | None = None,
    cache: str | Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Interpret and score the activated features of ``records`` with an LLM (see the module).

    ``client``: a ``ClientConfig`` (then replies are cached in ``cache``, by default
    ``out/replies.sqlite``) or a ready ``ChatClient``. Writes ``features.jsonl``,
    ``summary.json``, ``summary.md`` and ``scores.png`` to ``out``; returns the summary.
    """
    return asyncio.run(
        acomsem(records, tokenizer, client, config, out=out, cache=cache, progress=progress)
    )


COMSEM_COLUMNS = (
    ("comsem_activated", "FA", ""),
    ("comsem_interpretable", "FI", ""),
    ("comsem_score", "ComSem", ".3f"),
)
"""(key, title, format) of the ComSem columns ``comsem_columns`` adds to a table's rows."""


def comsem_columns(
    records: dict[str, FeatureRecords],
    tokenizer: Any,
    client: ClientConfig,
    rows: dict[str, dict[str, Any]],
    out: Path,
    max_features: int | None = None,
    progress: bool = True,
) -> dict[str, list[float]]:
    """ComSem on several models' records (one reply cache for all, reports in ``out/<name>``):
    adds FA, FI and the mean score to ``rows[name]`` and returns each model's feature scores."""
    chat = ChatClient(client, out / "replies.sqlite")
    scores = {}
    for name, held in records.items():
        settings = ComSemConfig(max_features=max_features)
        folder = out / name.replace("=", "")
        summary = comsem(held, tokenizer, chat, settings, out=folder, progress=progress)
        rows[name]["comsem_activated"] = summary["activated"]
        rows[name]["comsem_interpretable"] = summary["interpretable"]
        rows[name]["comsem_score"] = summary["mean_score"]
        lines = (folder / "features.jsonl").read_text().splitlines()
        scores[name] = [s for s in (json.loads(x)["score"] for x in lines) if s is not None]
    return scores


def write_report(
    results: Sequence[FeatureScore], summary: dict[str, Any], out: Path, top: int = 20
) -> None:
    """Per-feature JSONL, the summary (JSON and markdown with the top features) and the plot."""
    from sae_lens_bae.plots import plot_comsem_scores

    out.mkdir(parents=True, exist_ok=True)
    with (out / "features.jsonl").open("w") as f:
        for result in results:
            f.write(json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
    write_json(out / "summary.json", summary)
    (out / "summary.md").write_text(summary_markdown(results, summary, top))
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
        key=lambda r: (-r.score, r.feature),  # type: ignore[operator]
    )[:top]
    columns = [
        ("feature", lambda r: str(r.feature)),
        ("score", lambda r: cell(r.score, ".3f")),
        ("explanation", lambda r: (r.explanation or "").replace("|", "\\|")),
        ("top tokens", lambda r: ", ".join(repr(s.token) for s in r.explain_samples)),
    ]
    return "\n".join(lines) + markdown_table(ranked, columns)
