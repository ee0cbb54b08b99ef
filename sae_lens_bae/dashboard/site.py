"""``bae dashboard``: a static feature dashboard of a trained BAE or SAE, written to a folder.

Reads the records ``bae compare`` (or ``bae interpret --sae``) wrote, optionally the saved model
(its prior gives each feature's rarity, its decoder rows the logit lens through the language
model's unembedding) and a ComSem run (explanations and scores), and writes ``index.html`` and
one page per feature under ``features/``: open ``index.html`` in a browser, offline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from sae_lens_bae.checks import check_ranges, existing, ranged
from sae_lens_bae.dashboard.html import feature_file, feature_html, index_html
from sae_lens_bae.dashboard.pages import build_pages, comsem_results, logit_lens
from sae_lens_bae.features.records import FeatureRecords
from sae_lens_bae.models import load_model, load_tokenizer
from sae_lens_bae.reports import write_json, write_text
from sae_lens_bae.saes.loading import load_sae

__all__ = ["DashboardConfig", "dashboard"]


@dataclass
class DashboardConfig:
    """What ``bae dashboard`` reads and where it writes the site."""

    records: Path = existing("file", "bae compare writes records/<model>.safetensors")
    """Records file (records/<model>.safetensors from bae compare, or bae interpret's)."""
    out: Path = Path("runs/dashboard")
    """Folder of the site (index.html, features/)."""
    sae: Path | None = existing("folder", "give the folder a BAE or SAE was saved to", None)
    """The saved BAE/SAE the records come from: rarity from its prior, and the logit lens."""
    model: str | None = None
    """Language model for the tokenizer and the unembedding (default: the records' own)."""
    comsem: Path | None = existing("folder", "give the --out of bae interpret", None)
    """A bae interpret / ComSem output folder (features.jsonl): explanations and scores."""
    contexts: int = ranged(20, low=1)
    """Top-activating contexts per feature page."""
    lens_tokens: int = ranged(10, low=0)
    """Tokens promoted and suppressed shown per feature (0: no logit lens)."""
    max_features: int | None = ranged(None, low=1)
    """Pages for the first features with records only (default: every one)."""

    def __post_init__(self) -> None:
        check_ranges(self)


def dashboard(cfg: DashboardConfig, progress: bool = True) -> dict[str, Any]:
    """Write the site; returns its summary (also written as ``dashboard.json``)."""
    records = FeatureRecords.load(cfg.records)
    name = cfg.model or records.info.get("model")
    if name is None:
        raise ValueError("these records do not say which model made them: pass --model")
    sae = None if cfg.sae is None else load_sae(cfg.sae)
    if sae is not None and sae.cfg.d_sae != records.d_sae:
        raise ValueError(
            f"{cfg.sae} has {sae.cfg.d_sae} features, the records {records.d_sae}: "
            "give the model the records were made with"
        )
    prior = getattr(sae, "code_mean", None) if sae is not None else None
    lens = None
    if sae is not None and cfg.lens_tokens > 0:
        model = load_model(name)
        tokenizer = model.tokenizer
        lens = logit_lens(sae.W_dec.detach(), model.W_U.detach(), tokenizer, cfg.lens_tokens)
    else:
        tokenizer = load_tokenizer(name)
    pages = build_pages(
        records,
        tokenizer,
        prior=None if prior is None else prior.detach().float(),
        bits_per_feature=getattr(sae.cfg, "bits_per_feature", 1) if sae is not None else 1,
        lens=lens,
        comsem=None if cfg.comsem is None else comsem_results(cfg.comsem),
        contexts=cfg.contexts,
    )
    if cfg.max_features is not None:
        pages = pages[: cfg.max_features]
    out = Path(cfg.out)
    (out / "features").mkdir(parents=True, exist_ok=True)
    for page in tqdm(pages, desc="Feature pages", disable=not progress):
        write_text(out / feature_file(page.feature), feature_html(page, records.magnitude))
    title = f"Features of {Path(cfg.sae).name if cfg.sae else Path(cfg.records).stem} ({name})"
    write_text(out / "index.html", index_html(pages, title))
    summary = {"config": cfg, "features": len(pages), "index": str(out / "index.html")}
    write_json(out / "dashboard.json", summary)
    print(f"open {out / 'index.html'} in a browser")
    return summary
