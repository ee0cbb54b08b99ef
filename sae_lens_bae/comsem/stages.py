"""ComSem's LLM stages: explain each feature, optionally calibrate the judge, judge held-out
records, and score; each a plain function of the previous stage's output."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sae_lens_bae.comsem.client import ChatClient, ComSemAPIError, Reply
from sae_lens_bae.comsem.prompts import Templates, parse_explanation, parse_judgement
from sae_lens_bae.comsem.samples import FeatureSamples, Sample

__all__ = ["Explanation", "FeatureScore", "Judgement", "calibrate", "explain", "judge", "score"]


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
