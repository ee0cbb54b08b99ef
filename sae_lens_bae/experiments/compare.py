"""``bae compare``: a BAE against SAELens' SAE architectures on the same cached activations.

One harvest of one layer; every model trained on the same training tokens with the same
expansion rate and number of steps; every model evaluated on the same held-out tokens: the
reconstruction loss, the spectral norm of the decoder rows' covariance, activated / dead / dense
feature counts, L0 and explained variance, as a markdown table, JSON and plots.

All activations are scaled once by sqrt(d) / (mean training norm), as SAELens'
``expected_average_only_in`` would, and every model trains on the scaled activations with
``normalize_activations="none"``, so their losses are in one unit and comparable.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from torch import Tensor

from sae_lens_bae.checks import check_ranges, ranged, renamed
from sae_lens_bae.comsem import ClientConfig, comsem_columns
from sae_lens_bae.data import default_labelled_sentences, load_labelled_sentences
from sae_lens_bae.experiments.common import TRAINING_CHECKPOINT, LayerData
from sae_lens_bae.experiments.layer_study import (
    EvaluationSettings,
    add_columns,
    evaluate_model,
    heat_map,
    models_table,
    plot_active_frequencies,
    sentence_columns,
    spliced_columns,
)
from sae_lens_bae.features import FeatureRecords
from sae_lens_bae.features.records import Magnitude
from sae_lens_bae.models import load_model
from sae_lens_bae.plots import (
    plot_comsem_scores,
    plot_firing_frequencies,
    plot_firing_frequency_grid,
    plot_magnitude_heatmaps,
    plot_training_curves,
)
from sae_lens_bae.reports import Stopwatch, write_json, write_text
from sae_lens_bae.saes.bae_config import BAE_RECIPES, bae_config
from sae_lens_bae.saes.bae_recipes import RecipeName
from sae_lens_bae.saes.canonical import canonicalise
from sae_lens_bae.training import (
    BASELINES,
    TrainingRun,
    baseline_configs,
    train_sae,
    train_transcoder,
)
from sae_lens_bae.training.checkpoints import COMPLETE_MARKER

__all__ = ["REPORT", "CompareConfig", "run"]

REPORT = "compare.md"


@dataclass
class CompareConfig(LayerData):
    """What ``bae compare`` runs; the defaults fit 45 minutes on a 2-core CPU."""

    max_sequences: int | None = ranged(1536, low=1)
    """Cap on harvested sequences."""
    baselines: Sequence[str] = BASELINES
    """SAELens baselines trained beside the BAE (see sae_lens_bae.training.BASELINES)."""
    expansion: int = ranged(4, low=1)
    """d_sae / d_in of every model."""
    steps: int = ranged(2000, low=1)
    """Training steps of every model."""
    batch_size: int = ranged(512, low=1)
    """Activations per training step."""
    lr: float = ranged(5e-4, above=0.0)
    """Adam learning rate of the SAEs (the BAE trains with its recipe's)."""
    l1_coefficient: float = ranged(5.0, low=0.0)
    """L1 coefficient of standard, gated_relu and the transcoder."""
    records_k: int = ranged(10, low=1)
    """Top-k features kept per token in the records (k)."""
    n_explain: int = ranged(5, low=1)
    """The paper's activated: at least n_explain + 1 records (top-k over all channels)."""
    activated_min_samples: int = ranged(8, low=0)
    """Ours (activated (firing)): more than this many records among firing channels."""
    dense_threshold: float = ranged(0.5, low=0.0, high=1.0)
    """A channel active on more than this fraction of tokens is dense."""
    prior: Literal["training", "evaluation"] = "training"
    """The BAE's burstiness prior: its training mean code or the held-out one."""
    canonicalise: bool = False
    """Flip the BAE's mostly-on bits first, so that every bit's 1 is its rare state (exact)."""
    spliced_sequences: int = ranged(64, low=0)
    """Held-out sequences on which each model is spliced into the LM (CE, KL); 0: skip."""
    probe_dataset: str | None = None
    """Labelled sentences of another text: probing and OOD columns (default: gensim's reviews)."""
    probe_sentences: int = ranged(200, low=0)
    """Labelled sentences read (a seeded sample; the default set has 200); 0: skip."""
    recipe: RecipeName = "default"
    """The BAE's training recipe (sae_lens_bae.saes.bae_recipes)."""
    bae_kwargs: dict[str, Any] = field(default_factory=dict)
    """BAE config fields that replace the recipe's, e.g. entropy_coefficient=1e-6."""
    comsem_llm: str | None = None
    """Add ComSem columns, every model's records judged by this LLM."""
    comsem_base_url: str | None = None
    """The LLM's OpenAI-compatible endpoint (default: OpenAI)."""
    comsem_max_features: int | None = ranged(None, low=1)
    """ComSem on the first N activated features of each model (default: all)."""
    seed: int = 0
    """Seed of the models' initialisation and data order."""
    out: Path = Path("runs/compare")
    """Report folder."""

    bae_preset: RecipeName | None = renamed("recipe")
    """Old name of recipe."""

    def __post_init__(self) -> None:
        check_ranges(self)
        super().__post_init__()
        unknown = [b for b in self.baselines if b not in BASELINES]
        if unknown:
            raise ValueError(f"Unknown baselines {unknown}; choose from {list(BASELINES)}")
        if self.prior not in ("training", "evaluation"):
            raise ValueError(f"prior must be 'training' or 'evaluation', got {self.prior!r}")


def run(cfg: CompareConfig, progress: bool = True) -> dict[str, Any]:
    """Harvest, train every model, evaluate, and write ``compare.md``, ``compare.json`` and the
    plots to ``cfg.out``; returns the summary."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    watch = Stopwatch("compare")
    lap = watch.lap

    mlp_name = "ln2.hook_normalized"
    data = cfg.harvest(
        out, extra_hooks=(mlp_name,) if "transcoder" in cfg.baselines else (), progress=progress
    )
    lap("harvest")
    hook = data.hook
    mlp_in = hook.replace("hook_resid_post", mlp_name)
    train = data.train[hook]
    d_in = train.shape[1]
    samples = cfg.steps * cfg.batch_size
    trainer = {"training_samples": samples, "batch_size": cfg.batch_size, "device": cfg.device}
    trainer["seed"] = cfg.seed

    # every model checkpoints under OUT/training-checkpoint until the results are written: the
    # same command run again after a kill goes on from there and trains no finished model again
    checkpoints = out / TRAINING_CHECKPOINT

    def fit(name: str, sae_cfg: Any, lr: float) -> TrainingRun:
        folder = checkpoints / name
        resume = folder.is_dir() and any(folder.rglob(COMPLETE_MARKER))
        checkpoints_on = {"n_checkpoints": 4, "save_final_checkpoint": True}
        run = train_sae(
            train, sae_cfg, lr=lr, checkpoint_dir=folder, resume=resume, **checkpoints_on, **trainer
        )
        for kept in folder.iterdir():  # the final checkpoint is all a rerun needs
            if kept.is_dir() and not kept.name.startswith("final_"):
                shutil.rmtree(kept)
        return run

    runs: dict[str, Any] = {}
    histories: dict[str, list[dict[str, float]]] = {}
    bae_cfg = bae_config(d_in, cfg.expansion * d_in, recipe=cfg.recipe, **cfg.bae_kwargs)
    run = fit("bae", bae_cfg, BAE_RECIPES[cfg.recipe].lr)
    runs["bae"], histories["bae"] = run.sae, run.history
    if cfg.canonicalise:
        runs["bae"] = canonicalise(run.sae)
    lap("train bae")
    for name, sae_cfg in baseline_configs(
        d_in, cfg.expansion, cfg.baselines, cfg.l1_coefficient
    ).items():
        run = fit(name, sae_cfg, cfg.lr)
        runs[name], histories[name] = run.sae, run.history
        lap(f"train {name}")
    if "transcoder" in cfg.baselines:
        runs["transcoder"], histories["transcoder"] = train_transcoder(
            data.train[mlp_in],
            train,
            cfg.expansion * d_in,
            training_samples=samples,
            l1_coefficient=cfg.l1_coefficient,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            device=cfg.device,
            seed=cfg.seed,
            progress=progress,
            checkpoint=checkpoints / "transcoder.pt",
        )
        lap("train transcoder")

    settings = EvaluationSettings(
        records_k=cfg.records_k,
        n_explain=cfg.n_explain,
        activated_min_samples=cfg.activated_min_samples,
        dense_threshold=cfg.dense_threshold,
        prior=cfg.prior,
        spliced_sequences=cfg.spliced_sequences,
        outlier_norm_ratio=cfg.outlier_norm_ratio,
    )
    rows: dict[str, dict[str, Any]] = {}
    rates: dict[str, Tensor] = {}
    frequencies: dict[str, Tensor] = {}
    heat: dict[str, Tensor] = {}
    records: dict[str, FeatureRecords] = {}
    (out / "records").mkdir(exist_ok=True)
    for name in ["bae", *cfg.baselines]:
        sae = runs["standard" if name == "standard_rescaled" else name]
        inputs, targets = data.test[hook], None
        if name == "transcoder":
            inputs, targets = data.test[mlp_in], data.test[hook]
        magnitude: Magnitude | None = "rescaled" if name == "standard_rescaled" else None
        stats, records[name], prior = evaluate_model(
            name, sae, data, settings, inputs=inputs, targets=targets, magnitude=magnitude
        )
        records[name].save(out / "records" / f"{name}.safetensors")
        rates[name] = stats.pop("firing_rates")
        frequencies[name] = stats.pop("active_frequency")
        heat[name] = heat_map(sae, inputs, stats["magnitude"], prior, rates[name])
        rows[name] = stats
        if name != "standard_rescaled":  # the standard SAE's weights, saved as "standard"
            save = getattr(sae, "save_inference_model", None) or sae.save_model
            save(out / "models" / name)
    lap("evaluate")
    # the models that read and write the studied hook (the transcoder reads another), spliced
    # into the language model and read on the probing sentences: the model loaded once for both
    spliced = {n: runs[n] for n in ["bae", *cfg.baselines] if n in runs and n != "transcoder"}
    language_model = None
    if spliced and (cfg.spliced_sequences > 0 or cfg.probe_sentences > 0):
        language_model = load_model(data.model, device=cfg.device)
    if cfg.spliced_sequences > 0 and language_model is not None:
        add_columns(rows, spliced_columns(spliced, data, settings, language_model))
    lap("spliced into the model")
    if cfg.probe_sentences > 0 and language_model is not None:
        pairs = load_labelled_sentences(cfg.probe_dataset or default_labelled_sentences())
        pairs = random.Random(cfg.seed).sample(pairs, min(cfg.probe_sentences, len(pairs)))
        read = sentence_columns(spliced, data, pairs, settings, language_model, seed=cfg.seed)
        add_columns(rows, read)
        lap("probing and out-of-distribution sentences")
    del language_model
    comsem_scores: dict[str, list[float]] = {}
    if cfg.comsem_llm is not None:
        client = ClientConfig(model=cfg.comsem_llm, base_url=cfg.comsem_base_url)
        comsem_scores = comsem_columns(
            records, data.tokenizer, client, rows, out / "comsem", cfg.comsem_max_features, progress
        )
        lap("comsem")

    summary = {
        "config": asdict(cfg),
        "model": cfg.model,
        "hook": hook,
        "transcoder_input": mlp_in if "transcoder" in cfg.baselines else None,
        "dataset": data.dataset,
        "train_tokens": int(train.shape[0]),
        "held_out_tokens": int(data.test[hook].shape[0]),
        "outliers_dropped": data.outliers_dropped,
        # every model reads states multiplied by this (bae interpret --sae ... --input-scale)
        "activation_scale": data.scales[hook],
        "bae_prior": cfg.prior,
        "models": rows,
        "seconds": watch.seconds,
    }
    write_json(out / "compare.json", summary)  # the results are safe before any plotting
    write_text(out / "compare.md", _report(summary))
    title = f"{cfg.model} {hook}"
    if len(rates) > 1:
        plot_firing_frequency_grid(rates, out / "firing_frequency.png", "bae", cfg.dense_threshold)
    else:  # a BAE-only study: its own histogram
        plot_firing_frequencies(rates, out / "firing_frequency.png", title=title)
    plot_active_frequencies(frequencies, out / "active_frequency.png", title=title)
    plot_magnitude_heatmaps(heat, out / "magnitudes.png", title=title)
    plot_training_curves(histories, out / "training_curves.png", title=title)
    if comsem_scores:
        plot_comsem_scores(comsem_scores, out / "comsem_scores.png", title=title)
    lap("report")
    write_json(out / "compare.json", summary)  # again, with the report's seconds
    shutil.rmtree(checkpoints, ignore_errors=True)  # the results are written
    return summary


def _report(summary: dict[str, Any]) -> str:
    config = summary["config"]
    lines = [
        f"# BAE vs SAEs: {summary['model']} `{summary['hook']}`",
        "",
        f"{summary['train_tokens']} training tokens, {summary['held_out_tokens']} held-out tokens "
        f"(statistics on held-out); BAE magnitudes: burstiness with the {summary['bae_prior']} "
        f"prior. activated: the paper's (top-{config['records_k']} over all channels, at least "
        f"{config['n_explain'] + 1} records, Algorithm 1); activated (>8): the same records, more "
        f"than 8 (Table 1's caption); activated (firing): top-{config['records_k']} over "
        f"firing channels, more than {config['activated_min_samples']} records. constant, dead, "
        "dense, active >10%: on each channel's active frequency (BAE bit: rarity min(p, 1 - p); "
        f"SAE latent: firing rate): below 1e-4, never, above {config['dense_threshold']:.0%}, "
        "above 10%. CE recovered and KL: spliced into the model on "
        f"{config['spliced_sequences']} held-out sequences (SAELens' definitions). OOD: the "
        f"tokens of {config['probe_sentences']} labelled sentences of another text (the probing "
        "set); probe k: held-out accuracy of a logistic-regression probe on the k latents whose "
        "class means differ most on the other half of those sentences (SAEBench's k-sparse "
        "probing).",
        "",
    ]
    return "\n".join(lines) + "\n" + models_table(summary["models"])
