"""ComSem: interpret features by what their activating tokens have in common, judged by an LLM.

Stages, each a plain function: ``select_samples`` (records -> what each prompt shows),
``explain`` (one phrase per feature), optionally ``calibrate`` (the judge's bias), ``judge``
(Yes/No per held-out record) and ``score``; ``comsem`` runs them all with a ``ChatClient`` (any
OpenAI-compatible server, cached on disk).
"""

from sae_lens_bae.comsem.cache import ReplyCache
from sae_lens_bae.comsem.client import ChatClient, ClientConfig, ComSemAPIError, Reply, Usage
from sae_lens_bae.comsem.interpret import InterpretConfig
from sae_lens_bae.comsem.pipeline import (
    COMSEM_COLUMNS,
    ComSemConfig,
    acomsem,
    comsem,
    comsem_columns,
)
from sae_lens_bae.comsem.prompts import (
    Templates,
    load_templates,
    parse_explanation,
    parse_judgement,
)
from sae_lens_bae.comsem.report import summarise, summary_markdown, write_report
from sae_lens_bae.comsem.samples import FeatureSamples, Sample, select_samples
from sae_lens_bae.comsem.stages import (
    Explanation,
    FeatureScore,
    Judgement,
    calibrate,
    explain,
    judge,
    score,
)

__all__ = [
    "COMSEM_COLUMNS",
    "ChatClient",
    "ClientConfig",
    "ComSemAPIError",
    "ComSemConfig",
    "Explanation",
    "FeatureSamples",
    "FeatureScore",
    "InterpretConfig",
    "Judgement",
    "Reply",
    "ReplyCache",
    "Sample",
    "Templates",
    "Usage",
    "acomsem",
    "calibrate",
    "comsem",
    "comsem_columns",
    "explain",
    "judge",
    "load_templates",
    "parse_explanation",
    "parse_judgement",
    "score",
    "select_samples",
    "summarise",
    "summary_markdown",
    "write_report",
]
