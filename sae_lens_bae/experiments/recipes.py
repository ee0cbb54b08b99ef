"""``bae bench recipes``: BAE training recipes against SAELens baselines on one layer's states.

Every variant and baseline trains on the same cached activations (one harvest) and is read on the
same held-out tokens with the columns of ``bae compare`` (the paper's ``activated`` beside ours,
constant/dead/dense channels, explained variance, L0, CE and KL spliced into the model). A
variant is a named change to the default BAE recipe (``VARIANTS``): training length, coefficient
scale, coefficient warm-up, learning-rate schedule, resampling of constant channels,
canonicalisation, the paper's own coefficients. Each row is checked against the feature
target: explained variance within 0.02 of topk15's, at least as many activated features as every
baseline, fewer than 1% constant channels and no dead one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from sae_lens_bae.checks import check_ranges, ranged
from sae_lens_bae.experiments.common import LayerData
from sae_lens_bae.experiments.layer_study import (
    EvaluationSettings,
    add_columns,
    evaluate_model,
    models_table,
    plot_active_frequencies,
    spliced_columns,
)
from sae_lens_bae.features.records import Magnitude
from sae_lens_bae.models import load_model
from sae_lens_bae.plots import plot_training_curves, save_figure, subplots
from sae_lens_bae.reports import Stopwatch, cell, markdown_table, write_json, write_text
from sae_lens_bae.saes.bae_config import BAE_RECIPES, bae_config
from sae_lens_bae.saes.canonical import canonicalise
from sae_lens_bae.training import TRAINED_BASELINES, baseline_configs, train_sae

__all__ = ["REPORT", "VARIANTS", "RecipeStudyConfig", "Variant", "meets_target", "run"]

REPORT = "recipes.md"


@dataclass(frozen=True)
class Variant:
    """A BAE recipe: one of ``BAE_RECIPES`` with config fields replaced (``overrides``),
    SAELens trainer settings (an LR schedule), a multiple of the study's steps, and whether the
    trained BAE is canonicalised before it is read."""

    description: str
    recipe: str = "default"
    overrides: dict[str, Any] = field(default_factory=dict)
    trainer: dict[str, Any] = field(default_factory=dict)
    steps_factor: float = 1.0
    canonical: bool = False


VARIANTS: dict[str, Variant] = {
    "default": Variant("the default recipe (BAETrainingSAEConfig's defaults)"),
    "short_run": Variant("0.1's short-run recipe", recipe="short_run"),
    "paper": Variant("the paper's coefficients and lr 5e-4", recipe="paper"),
    "long_x2": Variant("the default, 2x the steps", steps_factor=2.0),
    "coefficients_x2": Variant("a_e, a_c x2", overrides={"coefficient_scale": 2.0}),
    "coefficients_x0.5": Variant("a_e, a_c x0.5", overrides={"coefficient_scale": 0.5}),
    "sharp_surrogate": Variant(
        "sigmoid surrogate at T = 0.3 instead of 1", overrides={"surrogate_temperature": 0.3}
    ),
    "cosine_lr": Variant(
        "cosine learning-rate decay to 1/10 after 5% warm-up",
        trainer={
            "lr_scheduler_name": "cosineannealing",
            "lr_warm_up_fraction": 0.05,
            "lr_end_fraction": 0.1,
        },
    ),
    "no_resampling": Variant("constant channels never resampled", overrides={"resample_every": 0}),
    "canonical": Variant(
        "the default, canonicalised (rare state = 1) before reading", canonical=True
    ),
}
"""Every recipe the study knows, by name (``--variants`` picks among them)."""

DEFAULT_VARIANTS = (
    "default",
    "short_run",
    "paper",
    "coefficients_x0.5",
    "sharp_surrogate",
    "no_resampling",
)
"""What ``bae bench recipes`` trains by default: six variants and five baselines fit 45 minutes
on 2 CPU cores."""


@dataclass
class RecipeStudyConfig(LayerData):
    """What ``bae bench recipes`` runs; the defaults finish in under 45 minutes on 2 CPU cores."""

    max_sequences: int | None = ranged(None, low=1)
    """Cap on harvested sequences (default: the whole dataset)."""
    variants: Sequence[str] = DEFAULT_VARIANTS
    """BAE recipes to train (see sae_lens_bae.experiments.recipes.VARIANTS)."""
    baselines: Sequence[str] = ("topk15", "standard", "standard_rescaled", "jumprelu", "batchtopk")
    """SAELens baselines trained on the same tokens."""
    expansion: int = ranged(4, low=1)
    """d_sae / d_in of every model."""
    steps: int = ranged(1000, low=1)
    """Training steps of every model (a variant may multiply them)."""
    batch_size: int = ranged(512, low=1)
    """Activations per training step."""
    lr: float = ranged(5e-4, above=0.0)
    """Adam learning rate of the SAEs."""
    l1_coefficient: float = ranged(5.0, low=0.0)
    """L1 coefficient of the standard SAE."""
    records_k: int = ranged(10, low=1)
    """Top-k features kept per token in the records (k)."""
    n_explain: int = ranged(5, low=1)
    """The paper's activated: at least n_explain + 1 records (top-k over all channels)."""
    activated_min_samples: int = ranged(8, low=0)
    """Ours (activated (firing)): more than this many records among firing channels."""
    dense_threshold: float = ranged(0.5, low=0.0, high=1.0)
    """A channel active on more than this fraction of tokens is dense."""
    spliced_sequences: int = ranged(32, low=0)
    """Held-out sequences on which each model is spliced into the LM (CE, KL); 0: skip."""
    seed: int = 0
    """Seed of the models' initialisation and data order."""
    out: Path = Path("runs/recipes")
    """Report folder."""

    def __post_init__(self) -> None:
        check_ranges(self)
        super().__post_init__()
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ValueError(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}")
        bad = [b for b in self.baselines if b not in (*TRAINED_BASELINES, "standard_rescaled")]
        if bad:
            raise ValueError(
                f"baselines {bad}: choose among {', '.join(TRAINED_BASELINES)}, standard_rescaled"
            )


def _trainer_settings(variant: Variant, lr: float, steps: int) -> dict[str, Any]:
    """SAELens ``SAETrainerConfig`` fields of a variant (fractions of training as steps)."""
    settings = {k: v for k, v in variant.trainer.items() if not k.endswith("_fraction")}
    if "lr_warm_up_fraction" in variant.trainer:
        settings["lr_warm_up_steps"] = round(variant.trainer["lr_warm_up_fraction"] * steps)
    if "lr_end_fraction" in variant.trainer:
        settings["lr_end"] = lr * variant.trainer["lr_end_fraction"]
    return settings


def meets_target(rows: dict[str, dict[str, Any]], name: str, baselines: Sequence[str]) -> bool:
    """The feature target: explained variance within 0.02 of topk15's (or above it), at least as
    many activated features as every baseline, under 1% constant channels, no dead channel."""
    row = rows[name]
    others = [rows[b] for b in baselines if b in rows]
    ev_ok = "topk15" not in rows or row["explained_variance"] >= (
        rows["topk15"]["explained_variance"] - 0.02
    )
    return bool(
        ev_ok
        and all(row["activated"] >= other["activated"] for other in others)
        and row["constant"] < 0.01 * row["channels"]
        and row["dead"] == 0
    )


def run(cfg: RecipeStudyConfig, progress: bool = True) -> dict[str, Any]:
    """Harvest once, train every variant and baseline, read them on the held-out tokens, and
    write ``recipes.md``, ``recipes.json`` and the figures to ``cfg.out``; returns the summary."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    watch = Stopwatch("recipes")
    data = cfg.harvest(out, progress=progress)
    watch.lap("harvest")
    train = data.train[data.hook]
    d_in = train.shape[1]
    models: dict[str, Any] = {}
    histories: dict[str, list[dict[str, float]]] = {}
    steps_used: dict[str, int] = {}
    for name in cfg.variants:
        variant = VARIANTS[name]
        steps = round(cfg.steps * variant.steps_factor)
        recipe = BAE_RECIPES[variant.recipe]
        bae_cfg = bae_config(
            d_in,
            cfg.expansion * d_in,
            recipe=recipe,
            total_training_steps=steps,
            **variant.overrides,
        )
        trainer = _trainer_settings(variant, recipe.lr, steps)
        result = train_sae(
            train,
            bae_cfg,
            training_samples=steps * cfg.batch_size,
            batch_size=cfg.batch_size,
            lr=recipe.lr,
            device=cfg.device,
            seed=cfg.seed,
            **trainer,
        )
        models[name] = canonicalise(result.sae) if variant.canonical else result.sae
        histories[name], steps_used[name] = result.history, steps
        watch.lap(f"train {name}")
    for name, sae_cfg in baseline_configs(
        d_in, cfg.expansion, cfg.baselines, cfg.l1_coefficient
    ).items():
        result = train_sae(
            train,
            sae_cfg,
            training_samples=cfg.steps * cfg.batch_size,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            device=cfg.device,
            seed=cfg.seed,
        )
        models[name], histories[name], steps_used[name] = result.sae, result.history, cfg.steps
        watch.lap(f"train {name}")

    settings = EvaluationSettings(
        records_k=cfg.records_k,
        n_explain=cfg.n_explain,
        activated_min_samples=cfg.activated_min_samples,
        dense_threshold=cfg.dense_threshold,
        spliced_sequences=cfg.spliced_sequences,
        outlier_norm_ratio=cfg.outlier_norm_ratio,
    )
    rows: dict[str, dict[str, Any]] = {}
    frequencies: dict[str, Tensor] = {}
    for name in [*cfg.variants, *cfg.baselines]:
        sae = models["standard" if name == "standard_rescaled" else name]
        magnitude: Magnitude | None = "rescaled" if name == "standard_rescaled" else None
        stats, _, _ = evaluate_model(name, sae, data, settings, magnitude=magnitude)
        stats.pop("firing_rates")
        frequencies[name] = stats.pop("active_frequency")
        stats["steps"] = steps_used["standard" if name == "standard_rescaled" else name]
        rows[name] = stats
    watch.lap("evaluate")
    if models and cfg.spliced_sequences > 0:
        language_model = load_model(data.model, device=cfg.device)
        add_columns(rows, spliced_columns(models, data, settings, language_model))
        del language_model
    watch.lap("spliced into the model")
    for name in cfg.variants:
        rows[name]["meets_target"] = meets_target(rows, name, cfg.baselines)

    summary = {
        "config": asdict(cfg),
        "variants": {name: asdict(VARIANTS[name]) for name in cfg.variants},
        "hook": data.hook,
        "dataset": data.dataset,
        "train_tokens": int(train.shape[0]),
        "held_out_tokens": int(data.test[data.hook].shape[0]),
        "models": rows,
        "seconds": watch.seconds,
    }
    write_json(out / "recipes.json", summary)
    write_text(out / "recipes.md", _report(summary))
    title = f"{cfg.model} {data.hook}"
    plot_active_frequencies(frequencies, out / "active_frequency.png", title=title)
    plot_ev_vs_activated(rows, cfg.variants, out / "ev_vs_activated.png", title=title)
    plot_training_curves(histories, out / "training_curves.png", title=title)
    watch.lap("report")
    write_json(out / "recipes.json", summary)
    return summary


def _report(summary: dict[str, Any]) -> str:
    config = summary["config"]
    variants = [{"name": name, **v} for name, v in summary["variants"].items()]
    described = markdown_table(
        variants,
        [
            ("variant", lambda v: v["name"]),
            ("what", lambda v: v["description"]),
            (
                "meets the target",
                lambda v: "yes" if summary["models"][v["name"]]["meets_target"] else "no",
            ),
        ],
    )
    lines = [
        f"# BAE recipes: {config['model']} `{summary['hook']}`",
        "",
        f"{summary['train_tokens']} training tokens, {summary['held_out_tokens']} held-out tokens, "
        f"{config['expansion']}x, {config['steps']} steps of {config['batch_size']} (a variant "
        "may multiply them). Columns as in `bae compare` (docs/research/feature-study.md). "
        "Target: EV within 0.02 of topk15's, activated >= every baseline's, "
        "constant < 1% of channels, no dead.",
        "",
        described,
        models_table(summary["models"], first="model"),
        "steps: " + ", ".join(f"{n} {cell(r['steps'])}" for n, r in summary["models"].items()),
    ]
    return "\n".join(lines) + "\n"


def plot_ev_vs_activated(
    rows: dict[str, dict[str, Any]], variants: Sequence[str], path: str | Path, title: str = ""
) -> Path:
    """Explained variance against the paper's activated features, BAE variants as dots and
    baselines as squares, each labelled."""
    fig, ax = subplots(figsize=(7, 5))
    for name, row in rows.items():
        marker = "o" if name in variants else "s"
        ax.scatter(row["activated"], row["explained_variance"], marker=marker, s=40)
        ax.annotate(
            name,
            (row["activated"], row["explained_variance"]),
            fontsize=7,
            textcoords="offset points",
            xytext=(4, 3),
        )
    ax.set(
        xlabel="activated features (paper's definition)",
        ylabel="explained variance",
        title=title or "BAE recipes (dots) and baselines (squares)",
    )
    return save_figure(fig, path)
