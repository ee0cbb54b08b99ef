"""``bae interpret``: ComSem on feature records, read from a file or made with a saved SAE/BAE.

An LLM says what each feature's top tokens have in common, then judges held-out tokens.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sae_lens_bae.activations.hooks import hook_point
from sae_lens_bae.checks import check_ranges, existing, ranged
from sae_lens_bae.comsem.client import ClientConfig
from sae_lens_bae.comsem.estimate import estimate_run
from sae_lens_bae.comsem.pipeline import ComSemConfig, comsem
from sae_lens_bae.data import iter_texts, tokenize_texts
from sae_lens_bae.features.records import FeatureRecords, records_from_text
from sae_lens_bae.models import load_model, load_tokenizer
from sae_lens_bae.saes.loading import load_sae

__all__ = ["InterpretConfig", "interpret", "records_from_sae"]


@dataclass
class InterpretConfig:
    """What ``bae interpret`` runs: the records to read, the LLM that judges them, and how."""

    records: Path | None = existing("file", "bae compare writes records/<model>.safetensors", None)
    """Records file (bae compare writes them)."""
    sae: Path | None = existing("folder", "give the folder a BAE or SAE was saved to", None)
    """Or a saved SAE/BAE folder, read on --dataset."""
    dataset: str | None = None
    """With --sae: text file, folder or HF dataset."""
    hook: str | None = None
    """With --sae: hook point, a full name or one inside block --layer (default: the SAE's)."""
    layer: int | None = ranged(None, low=0)
    """With --sae: block of a --hook inside a block."""
    sentences: int = ranged(8192, low=1)
    """With --sae: evaluation rows (N)."""
    context_size: int = ranged(64, low=1)
    """With --sae: tokens per row."""
    k: int = ranged(10, low=1)
    """With --sae: top-k features kept per token."""
    magnitude: Literal["burstiness", "raw", "rescaled"] | None = None
    """With --sae: burstiness, raw or rescaled (default: burstiness for a BAE, raw for an SAE)."""
    input_scale: float = ranged(1.0, above=0.0)
    """With --sae: the factor its training activations were multiplied by."""
    base_url: str | None = None
    """OpenAI-compatible endpoint (vLLM, Ollama, llama.cpp server); default OpenAI."""
    llm: str = "gpt-4o-mini"
    """Model name the server serves."""
    api_key: str | None = None
    """API key (default: $OPENAI_API_KEY; local servers need none)."""
    model: str | None = None
    """LM whose tokenizer reads the records (default: the one recorded in them)."""
    out: Path = Path("runs/interpret")
    """Report folder (also holds the reply cache)."""
    cache: Path | None = None
    """Reply cache (sqlite); default OUT/replies.sqlite."""
    concurrency: int = ranged(16, low=1)
    """Requests in flight at once."""
    max_features: int | None = ranged(None, low=1)
    """Evaluate only the first N activated features."""
    n_explain: int = ranged(5, low=1)
    """Records shown to the explainer (n_I)."""
    n_test: int = ranged(8, low=1)
    """Records judged per feature (n_T)."""
    detection: bool = False
    """Also judge as many non-activating records; balanced accuracy."""
    calibrate: bool = False
    """Calibrate the judge on a content-free input (needs logprobs)."""
    batch_api: bool = False
    """Use the OpenAI Batch API (half price, slower)."""
    price_input: float = ranged(0.0, low=0.0)
    """USD per million prompt tokens, for the cost report."""
    price_output: float = ranged(0.0, low=0.0)
    """USD per million completion tokens."""
    templates: Path | None = existing("folder", "give a folder with explain.json/judge.json", None)
    """Folder with explain.json/judge.json overrides."""
    top: int = ranged(20, low=1)
    """Rows of the top-features table."""
    yes: bool = False
    """Start a paid run (OpenAI, or prices given) without asking after its estimate."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if (self.records is None) == (self.sae is None):
            raise ValueError("pass either --records FILE or --sae FOLDER (with --dataset)")
        if self.sae is not None and self.dataset is None:
            raise ValueError("--sae needs --dataset (the text whose tokens are interpreted)")


def records_from_sae(cfg: InterpretConfig) -> FeatureRecords:
    """ComSem's records made from the saved SAE ``cfg.sae`` over ``cfg.dataset`` (saved to
    OUT/records.safetensors)."""
    assert cfg.sae is not None and cfg.dataset is not None
    sae = load_sae(cfg.sae)  # a missing, corrupt or foreign folder: one clear error
    hook = cfg.hook or sae.cfg.metadata.hook_name
    name = cfg.model or sae.cfg.metadata.model_name or "smollm2-135m"
    if hook is None:
        raise ValueError("this SAE does not name its hook point: pass --hook")
    texts = iter_texts(cfg.dataset)  # a missing path fails before the model loads
    model = load_model(name)
    hook = hook_point(model, hook, cfg.layer)
    tokens = tokenize_texts(texts, model.tokenizer, cfg.context_size, max_sequences=cfg.sentences)
    records = records_from_text(
        model,
        sae,
        tokens,
        hook,
        cfg.out / "activations",
        k=cfg.k,
        magnitude=cfg.magnitude,
        input_scale=cfg.input_scale,
    )
    records.info["model"] = name
    cfg.out.mkdir(parents=True, exist_ok=True)
    records.save(cfg.out / "records.safetensors")
    return records


def interpret(cfg: InterpretConfig, progress: bool = True) -> dict[str, Any]:
    """Run ComSem and write its report to ``cfg.out``; returns the summary."""
    records = FeatureRecords.load(cfg.records) if cfg.records is not None else records_from_sae(cfg)
    source = cfg.model or records.info.get("model")
    if source is None:
        raise ValueError("these records do not say which model made them: pass --model")
    client = ClientConfig(
        model=cfg.llm,
        base_url=cfg.base_url,
        api_key=cfg.api_key,
        concurrency=cfg.concurrency,
        price_input=cfg.price_input,
        price_output=cfg.price_output,
        batch_api=cfg.batch_api,
    )
    config = ComSemConfig(
        n_explain=cfg.n_explain,
        n_test=cfg.n_test,
        detection=cfg.detection,
        calibrate=cfg.calibrate,
        max_features=cfg.max_features,
        top=cfg.top,
        templates=cfg.templates,
    )
    tokenizer = load_tokenizer(source)
    estimate = estimate_run(records, tokenizer, client, config)
    print(estimate.line(client), flush=True)
    paid = cfg.base_url is None or cfg.price_input > 0 or cfg.price_output > 0
    if paid and not cfg.yes and not _confirmed():
        raise ValueError("a paid ComSem run starts only once confirmed: answer y, or pass --yes")
    return comsem(
        records, tokenizer, client, config, out=cfg.out, cache=cfg.cache, progress=progress
    )


def _confirmed() -> bool:
    """Ask on the terminal; without one (a script, CI) there is nobody to ask: not confirmed."""
    if not sys.stdin.isatty():
        return False
    return input("Start it? [y/N] ").strip().lower() in ("y", "yes")
