"""What a ComSem run will ask for, before it asks: requests, tokens and dollars.

Prompts are built exactly as the stages build them (the explanation a judge is asked about is not
known yet: a placeholder of ``PLACEHOLDER_WORDS`` words stands in). Tokens are counted at
``CHARS_PER_TOKEN`` characters each (English under GPT-style tokenizers), completions at their
``max_tokens`` cap: an upper bound. Replies already in the cache are not subtracted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sae_lens_bae.comsem.client import ClientConfig
from sae_lens_bae.comsem.prompts import load_templates
from sae_lens_bae.comsem.samples import samples_for
from sae_lens_bae.features.records import FeatureRecords

__all__ = ["CHARS_PER_TOKEN", "RunEstimate", "estimate_run"]

CHARS_PER_TOKEN = 4.0
PLACEHOLDER_WORDS = 8


@dataclass
class RunEstimate:
    """Requests a run sends, about how many prompt tokens, at most how many completion tokens,
    and the cost at the client's prices (0 when it has none)."""

    features: int
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float

    def line(self, config: ClientConfig) -> str:
        price = (
            f"${self.cost_usd:.4f} at ${config.price_input}/${config.price_output} per "
            "million tokens" + (" (Batch API: half)" if config.batch_api else "")
        )
        return (
            f"ComSem on {self.features} features: {self.requests} requests, about "
            f"{self.prompt_tokens} prompt tokens and at most {self.completion_tokens} "
            f"completion tokens; estimated cost {price}"
        )


def _chars(messages: list[dict[str, str]]) -> int:
    return sum(len(message["content"]) for message in messages)


def estimate_run(
    records: FeatureRecords, tokenizer: Any, client: ClientConfig, config: Any
) -> RunEstimate:
    """The estimate for ``comsem(records, tokenizer, client, config)`` (a ``ComSemConfig``)."""
    templates = load_templates(config.templates)
    items = samples_for(records, tokenizer, config)
    placeholder = " ".join(["word"] * PLACEHOLDER_WORDS)
    requests, chars = 0, 0
    for item in items:
        requests += 1
        chars += _chars(templates.explain_messages(item.explain))
        if config.calibrate:
            requests += 1
            chars += _chars(templates.judge_messages(placeholder, None))
        for sample in [*item.test, *item.negatives]:
            requests += 1
            chars += _chars(templates.judge_messages(placeholder, sample))
    prompt = round(chars / CHARS_PER_TOKEN)
    completion = requests * client.max_tokens
    cost = (prompt * client.price_input + completion * client.price_output) / 1e6
    return RunEstimate(
        len(items), requests, prompt, completion, cost * (0.5 if client.batch_api else 1.0)
    )
