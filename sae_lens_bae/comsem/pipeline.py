"""ComSem end to end: records -> samples -> explain -> judge -> score -> report, with one client.

``comsem(records, tokenizer, client)`` runs them all. Each stage is a plain function of the
previous one's output (``select_samples``, ``explain``, ``judge``, ``score``), so a user can run,
inspect or replace any of them. The LLM is only asked for phrases and Yes/No answers; every reply
is cached on disk by the client, so a rerun or a resumed run pays for nothing twice.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from sae_lens_bae.comsem.client import ChatClient, ClientConfig
from sae_lens_bae.comsem.prompts import load_templates
from sae_lens_bae.comsem.report import summarise, write_report
from sae_lens_bae.comsem.samples import samples_for
from sae_lens_bae.comsem.stages import calibrate, explain, judge, score
from sae_lens_bae.features.records import FeatureRecords
from sae_lens_bae.reports import read_jsonl

T = TypeVar("T")

__all__ = ["COMSEM_COLUMNS", "ComSemConfig", "acomsem", "comsem", "comsem_columns"]


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
    items = samples_for(records, tokenizer, config)
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
    Callable from inside a running event loop (Jupyter): it then runs on its own thread; in
    async code, ``await acomsem(...)`` instead.
    """
    return run_sync(
        acomsem(records, tokenizer, client, config, out=out, cache=cache, progress=progress)
    )


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run``, also where an event loop is already running in this thread (a Jupyter
    kernel's), by running the coroutine's own loop on a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


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
        fix = f"delete {folder} to judge {name} again"
        judged = read_jsonl(folder / "features.jsonl", "a ComSem run's features", fix, ("score",))
        scores[name] = [row["score"] for row in judged if row["score"] is not None]
    return scores
