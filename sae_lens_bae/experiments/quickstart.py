"""``bae quickstart``: a BAE and a SAELens topk SAE trained on a real LLM's middle layer.

Loads the embedded SmolLM2-135M, harvests the residual stream of its middle layer on the embedded
Lee news corpus, trains a BAE and a topk SAE on the same cached activations with SAELens'
trainer, evaluates both on held-out sequences and writes ``report.md``, ``metrics.json`` and PNG
plots. Every stage is swappable (model, dataset, hook, steps) through :class:`QuickstartConfig`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sae_lens_bae.checks import ranged
from sae_lens_bae.entropy import code_entropy
from sae_lens_bae.experiments.common import LayerData
from sae_lens_bae.experiments.compare_read import spliced_reads
from sae_lens_bae.features import feature_statistics, frequency_counts
from sae_lens_bae.features.statistics import DENSE_FREQUENCY
from sae_lens_bae.models import load_model
from sae_lens_bae.plots import plot_firing_frequencies, plot_training_curves
from sae_lens_bae.reports import Stopwatch, cell, write_json, write_text
from sae_lens_bae.saes.bae_recipes import BAE_RECIPES, RecipeName, bae_config
from sae_lens_bae.saes.loading import load_sae
from sae_lens_bae.training import TrainingRun, family_config, shared_schedule, train_sae

__all__ = ["REPORT", "QuickstartConfig", "run"]

REPORT = None
"""No report is echoed by the CLI: ``report.md`` holds pictures; its path is printed instead."""


@dataclass
class QuickstartConfig(LayerData):
    """What the quickstart runs; the defaults finish in under 15 minutes on 2 CPU cores."""

    out: Path = Path("runs/quickstart")
    """Report folder."""
    max_sequences: int | None = ranged(None, low=1)
    """Cap on harvested sequences (default: the whole dataset)."""
    expansion: int = ranged(4, low=1)
    """d_sae / d_in of both models."""
    steps: int = ranged(1000, low=1)
    """Training steps per model."""
    batch_size: int = ranged(512, low=1)
    """Activations per training step."""
    recipe: RecipeName = "default"
    """The BAE's training recipe (sae_lens_bae.saes.bae_recipes); its lr unless --bae-lr."""
    bae_lr: float | None = ranged(None, above=0.0)
    """Adam learning rate of the BAE (default: its recipe's)."""
    bae_kwargs: dict[str, Any] = field(default_factory=dict)
    """BAE config fields that replace the recipe's, e.g. entropy_coefficient=1e-6."""
    topk_lr: float = ranged(2e-3, above=0.0)
    """Adam learning rate of the topk SAE (what ``bae compare`` chose on validation here)."""
    topk_k: int = ranged(100, low=1)
    """k of the topk SAE (SAELens' default)."""
    spliced_sequences: int = ranged(32, low=0)
    """Held-out sequences on which each model is spliced into the LM (CE recovered, KL); 0: skip."""
    seed: int = 0
    """Seed of the models' initialisation and data order."""

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        super().__post_init__()


def run(cfg: QuickstartConfig, progress: bool = True) -> dict[str, Any]:
    """Run the whole pipeline, write the report folder and return the summary."""
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    watch = Stopwatch("quickstart")
    lap = watch.lap

    data = cfg.harvest(out, progress=progress)
    hook, scale = data.hook, data.scales[data.hook]
    train_acts, test_acts = data.train[hook], data.test[hook]
    lap("load model, tokenise and harvest")

    d_in, d_sae = train_acts.shape[1], cfg.expansion * train_acts.shape[1]
    trainer_args = dict(
        training_samples=cfg.steps * cfg.batch_size,
        batch_size=cfg.batch_size,
        device=cfg.device,
        seed=cfg.seed,
        outlier_norm_ratio=cfg.outlier_norm_ratio,
    )
    runs: dict[str, TrainingRun] = {}
    # both configs before any training, so a k above d_sae is refused before the BAE trains
    bae_cfg = bae_config(d_in, d_sae, recipe=cfg.recipe, training_steps=cfg.steps, **cfg.bae_kwargs)
    topk_cfg = family_config("topk", d_in, d_sae, cfg.topk_k, cfg.steps)
    bae_lr = cfg.bae_lr or BAE_RECIPES[cfg.recipe].lr
    # one schedule for both, as in ``bae compare``: warm-up, decay and TopK's AuxK window
    runs["bae"] = train_sae(
        train_acts, bae_cfg, **shared_schedule(bae_lr, cfg.steps), **trainer_args
    )
    lap("train bae")
    runs["topk"] = train_sae(
        train_acts, topk_cfg, **shared_schedule(cfg.topk_lr, cfg.steps), **trainer_args
    )
    lap("train topk")

    # What a user loads reads the raw activations: the harvest's scale folded into the weights.
    raw_test = test_acts / scale
    metrics: dict[str, Any] = {}
    rates = {}
    saved = {}
    for name, run in runs.items():
        run.sae.eval()
        run.sae.fold_activation_norm_scaling_factor(scale)
        run.sae.save_inference_model(out / name)
        saved[name] = load_sae(out / name, device=cfg.device)
        evaluation = feature_statistics(saved[name], raw_test)  # compare's columns and rules
        rates[name] = evaluation.pop("firing_frequency")  # what the table counts, plotted
        metrics[name] = evaluation
    estimate = code_entropy(saved["bae"], raw_test)
    metrics["bae"].update(
        entropy_estimate_bits=estimate.bits,
        entropy_ceiling_bits=estimate.ceiling_bits,
        distinct_states=estimate.n_distinct,
        entropy_code_bits=estimate.code_bits,
        entropy_excess_bits=estimate.excess_bits,
        typical_relative_error=estimate.typical_relative_error,
        entropy_reliable=estimate.reliable,
    )
    lap("evaluate")
    if cfg.spliced_sequences > 0:
        raw = replace(data, scales={hook: 1.0})  # the saved models read raw activations
        model = load_model(cfg.model, device=cfg.device)
        spliced = spliced_reads(saved, raw, model, cfg.spliced_sequences, cfg.outlier_norm_ratio)
        for name, losses in spliced.items():
            metrics[name].update(losses)
        lap("spliced into the model")

    plot_training_curves(
        {name: run.history for name, run in runs.items()},
        out / "training_curves.png",
        title=f"{cfg.model} {hook}",
    )
    plot_firing_frequencies(
        rates,
        out / "firing_frequency.png",
        {name: frequency_counts(rate) for name, rate in rates.items()},
        DENSE_FREQUENCY,
        title=f"Firing frequency on held-out tokens, {hook}",
    )
    lap("plots")
    summary = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        "model": cfg.model,
        "hook": hook,
        "dataset": data.dataset,
        "sequences": int(data.sequences.shape[0]),
        "context_size": cfg.context_size,
        "train_tokens": int(train_acts.shape[0]),
        "held_out_tokens": int(test_acts.shape[0]),
        "outliers_dropped": data.outliers_dropped,
        "activation_scale": scale,
        "models": metrics,
        "seconds": watch.seconds,
        "total_seconds": round(sum(watch.seconds.values()), 1),
    }
    write_json(out / "metrics.json", summary)
    write_text(out / "report.md", _report(summary))
    print(f"[quickstart] report written to {out / 'report.md'}")
    return summary


def _entropy_paragraph(bae: dict[str, Any]) -> str:
    """The held-out set's entropy as this BAE reads it: a headline only where the reading passes
    the trust rule; otherwise what the code spends, and why it is not the set's entropy."""
    spent = (
        f"the sum of the code bits' entropies over the held-out set is "
        f"{bae['entropy_estimate_bits']:.1f} bits; no set of {bae['distinct_states']} distinct "
        f"states holds more than log2 of their number, {bae['entropy_ceiling_bits']:.1f} bits"
    )
    if bae["entropy_reliable"]:
        return (
            f"**Entropy of the held-out hidden states: {bae['entropy_estimate_bits']:.1f} bits** "
            f"({spent}; reconstruction error <= 20% in total and for the typical state)."
        )
    return (
        f"No entropy headline: this BAE does not read the set's entropy "
        f"({spent}, and the reading fails the trust rule: over the ceiling, dependent code bits "
        "counted twice, or a poor reconstruction). `bae entropy estimate` trains BAEs for it "
        "and says which readings to trust."
    )


_ROWS = [
    ("reconstruction loss (mean sq. error, raw scale)", "reconstruction_loss", ".4g"),
    ("relative error (SSE / SST)", "relative_error", ".4f"),
    (
        "typical state's relative error (median error / median spread)",
        "typical_relative_error",
        ".4f",
    ),
    ("explained variance", "explained_variance", ".4f"),
    ("mean active features per token (L0)", "l0", ".1f"),
    ("entropy of firing rates (bits)", "entropy_bits", ".1f"),
    ("dead features (never active on held-out)", "dead", ""),
    ("constant features (active on < 0.01% of tokens)", "constant", ""),
    ("dense features (active on > 10% of tokens)", "dense", ""),
    ("features", "d_sae", ""),
]
"""The report's table: (label, the metric's key, its format)."""
_SPLICED_ROWS = [
    ("CE loss recovered, spliced into the model", "ce_loss_score", ".4f"),
    ("KL divergence from the clean logits (nats/token)", "kl_div_with_sae", ".4f"),
    ("next-token CE loss, spliced in", "ce_loss_with_sae", ".4f"),
    ("next-token CE loss, clean model", "ce_loss_without_sae", ".4f"),
]


def _report(summary: dict[str, Any]) -> str:
    bae, topk = summary["models"]["bae"], summary["models"]["topk"]
    rows = _ROWS + (_SPLICED_ROWS if "ce_loss_score" in bae else [])
    table = "\n".join(
        f"| {label} | {cell(bae.get(key), fmt)} | {cell(topk.get(key), fmt)} |"
        for label, key, fmt in rows
    )
    seconds = ", ".join(f"{k} {v:.0f} s" for k, v in summary["seconds"].items())
    return f"""# BAE quickstart report

Model `{summary["model"]}`, hook `{summary["hook"]}`, dataset `{summary["dataset"]}`: \
{summary["sequences"]} sequences of {summary["context_size"]} tokens, {summary["train_tokens"]} \
training and {summary["held_out_tokens"]} held-out token activations (BOS positions dropped; \
activations with a norm above {summary["config"]["outlier_norm_ratio"]}x the median, the \
model's attention-sink tokens, dropped: {summary["outliers_dropped"]}).

Both models: {summary["config"]["expansion"]}x expansion, {summary["config"]["steps"]} steps of \
{summary["config"]["batch_size"]} activations with SAELens' `SAETrainer` on one schedule (lr \
warm-up over 5% of the steps, decay to 0 over the last 20%, dead-latent window of 1/16 of \
the steps for TopK's AuxK), activations normalised to mean norm sqrt(d_in) during training and \
the scale folded back afterwards.

| held-out metric | BAE | topk (k={summary["config"]["topk_k"]}) |
|---|---|---|
{table}

Active: a SAE latent that fires; a BAE bit in its rarer state (a bit on for 90% of tokens is \
active on the other 10%), as `bae compare` and the firing-frequency plot count them.

{_entropy_paragraph(bae)}

![training curves](training_curves.png)

![firing frequency](firing_frequency.png)

Wall time: {seconds} (total {summary["total_seconds"]:.0f} s).

The trained models are in `bae/` and `topk/` (load with `SAE.load_from_disk` after \
`import sae_lens_bae`); the harvested activations are in `activations/`.
"""
