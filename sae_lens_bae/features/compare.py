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

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAEConfig
from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAEConfig
from sae_lens.saes.standard_sae import StandardTrainingSAEConfig
from sae_lens.saes.topk_sae import TopKTrainingSAEConfig
from torch import Tensor

from sae_lens_bae.features.burstiness import code_prior
from sae_lens_bae.features.records import FeatureRecords, top_k_records
from sae_lens_bae.features.statistics import feature_statistics
from sae_lens_bae.reports import Stopwatch, cell, markdown_table, write_json
from sae_lens_bae.saes.bae import SHORT_RUN_LR, short_run_config
from sae_lens_bae.saes.gated_relu import GatedReLUTrainingSAEConfig

__all__ = ["BASELINES", "CompareConfig", "baseline_configs", "run_compare"]

BASELINES = (
    "standard",
    "standard_rescaled",
    "topk15",
    "topk",
    "jumprelu",
    "batchtopk",
    "gated_relu",
    "transcoder",
)
"""Every baseline ``bae compare`` knows. ``topk15`` is the paper's k = 15, ``topk`` SAELens'
default k; ``standard_rescaled`` is the standard SAE read through per-channel z-scores (no
training of its own); ``transcoder`` maps the MLP's input to the layer's residual output."""

TABLE_COLUMNS = (
    ("reconstruction_loss", "reconstruction loss", ".4f"),
    ("decoder_covariance_norm", "‖Cov(W_dec)‖", ".4f"),
    ("activated", "activated", ""),
    ("dead", "dead", ""),
    ("dense", "dense", ""),
    ("l0", "L0", ".1f"),
    ("explained_variance", "explained variance", ".3f"),
)


@dataclass
class CompareConfig:
    """What ``bae compare`` runs; the defaults fit 45 minutes on a 2-core CPU."""

    dataset: str | None = None  # None: the embedded corpus
    model: str = "smollm2-135m"
    layer: int | None = None  # None: the middle layer
    text_column: str | None = None
    context_size: int = 128
    max_sequences: int | None = 1536
    held_out_fraction: float = 0.1
    baselines: Sequence[str] = BASELINES
    expansion: int = 4
    steps: int = 2000
    batch_size: int = 512
    lr: float = 5e-4  # the SAEs'; the BAE trains with SHORT_RUN_LR
    l1_coefficient: float = 5.0  # standard, gated_relu, transcoder
    records_k: int = 10
    activated_min_samples: int = 8
    dense_threshold: float = 0.5
    prior: Literal["training", "evaluation"] = "training"
    outlier_norm_ratio: float = 10.0
    bae_kwargs: dict[str, Any] = field(default_factory=dict)
    comsem: Any = None  # a comsem.ClientConfig: interpret every model's records with that LLM
    comsem_max_features: int | None = None  # None: every activated feature
    device: str = "cpu"
    seed: int = 0
    out: Path = Path("runs/compare")

    def __post_init__(self) -> None:
        unknown = [b for b in self.baselines if b not in BASELINES]
        if unknown:
            raise ValueError(f"Unknown baselines {unknown}; choose from {list(BASELINES)}")
        if not 0.0 < self.held_out_fraction < 1.0:
            raise ValueError(f"held_out_fraction must be in (0, 1), got {self.held_out_fraction}")
        if self.prior not in ("training", "evaluation"):
            raise ValueError(f"prior must be 'training' or 'evaluation', got {self.prior!r}")


def baseline_configs(
    d_in: int, expansion: int, names: Sequence[str], l1_coefficient: float = 5.0
) -> dict[str, Any]:
    """Training configs of the SAELens baselines among ``names`` (d_sae = expansion * d_in, no
    activation normalisation: callers scale activations once for every model). ``standard`` comes
    along with ``standard_rescaled``, which reads the same SAE."""
    d_sae = expansion * d_in
    common = {"d_in": d_in, "d_sae": d_sae, "normalize_activations": "none"}
    configs: dict[str, Any] = {
        "standard": StandardTrainingSAEConfig(**common, l1_coefficient=l1_coefficient),
        "topk15": TopKTrainingSAEConfig(**common, k=15),
        "topk": TopKTrainingSAEConfig(**common),
        "jumprelu": JumpReLUTrainingSAEConfig(**common),
        "batchtopk": BatchTopKTrainingSAEConfig(**common),
        "gated_relu": GatedReLUTrainingSAEConfig(**common, l1_coefficient=l1_coefficient),
    }
    wanted = set(names) | ({"standard"} if "standard_rescaled" in names else set())
    return {name: c for name, c in configs.items() if name in wanted}


def run_compare(cfg: CompareConfig, progress: bool = True) -> dict[str, Any]:
    """Harvest, train every model, evaluate, and write ``compare.md``, ``compare.json`` and the
    plots to ``cfg.out``; returns the summary."""
    from sae_lens_bae.activations import harvest_layer
    from sae_lens_bae.plots import (
        plot_firing_frequency_grid,
        plot_magnitude_heatmaps,
        plot_training_curves,
    )
    from sae_lens_bae.saes.transcoder import train_transcoder
    from sae_lens_bae.training import train_sae

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    watch = Stopwatch("compare")
    lap = watch.lap

    mlp_name = "ln2.hook_normalized"
    data = harvest_layer(
        cfg.model,
        cfg.dataset,
        cfg.layer,
        out / "activations",
        extra_hooks=[mlp_name] if "transcoder" in cfg.baselines else [],
        text_column=cfg.text_column,
        context_size=cfg.context_size,
        max_sequences=cfg.max_sequences,
        held_out_fraction=cfg.held_out_fraction,
        outlier_norm_ratio=cfg.outlier_norm_ratio,
        device=cfg.device,
    )
    lap("harvest")
    hook, tokenizer, sequences = data.hook, data.tokenizer, data.sequences
    mlp_in = hook.replace("hook_resid_post", mlp_name)
    train, test = data.train[hook], data.test[hook]
    test_positions, test_tokens = data.positions, data.token_ids
    d_in = train.shape[1]
    samples = cfg.steps * cfg.batch_size
    trainer = {"training_samples": samples, "batch_size": cfg.batch_size, "device": cfg.device}
    trainer["seed"] = cfg.seed

    runs: dict[str, Any] = {}
    histories: dict[str, list[dict[str, float]]] = {}
    bae_cfg = short_run_config(d_in, cfg.expansion * d_in, **cfg.bae_kwargs)
    run = train_sae(train, bae_cfg, lr=SHORT_RUN_LR, **trainer)
    runs["bae"], histories["bae"] = run.sae, run.history
    lap("train bae")
    for name, sae_cfg in baseline_configs(
        d_in, cfg.expansion, cfg.baselines, cfg.l1_coefficient
    ).items():
        run = train_sae(train, sae_cfg, lr=cfg.lr, **trainer)
        runs[name], histories[name] = run.sae, run.history
        lap(f"train {name}")
    x_test = test  # the transcoder's inputs (the MLP input) replace these below
    if "transcoder" in cfg.baselines:
        x_train, x_test = data.train[mlp_in], data.test[mlp_in]
        transcoder, histories["transcoder"] = train_transcoder(
            x_train,
            train,
            cfg.expansion * d_in,
            training_samples=samples,
            l1_coefficient=cfg.l1_coefficient,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            device=cfg.device,
            seed=cfg.seed,
            progress=progress,
        )
        runs["transcoder"] = transcoder
        lap("train transcoder")

    rows: dict[str, dict[str, Any]] = {}
    rates: dict[str, Tensor] = {}
    heat: dict[str, Tensor] = {}
    records: dict[str, FeatureRecords] = {}
    prior = None
    for name in ["bae", *cfg.baselines]:
        sae = runs["standard" if name == "standard_rescaled" else name]
        sae.eval()
        inputs, targets = (x_test, test) if name == "transcoder" else (test, None)
        if name == "bae":
            prior = code_prior(sae, test, source=cfg.prior)
            magnitude = "burstiness"
        else:
            magnitude = "rescaled" if name == "standard_rescaled" else "raw"
        records[name] = top_k_records(
            sae, inputs, test_positions, test_tokens, magnitude, k=cfg.records_k,  # type: ignore[arg-type]
            prior=prior if name == "bae" else None, sequences=sequences,
        )  # fmt: skip
        records[name].info = {"model": cfg.model, "hook": hook, "sae": name}
        (out / "records").mkdir(exist_ok=True)
        records[name].save(out / "records" / f"{name}.safetensors")
        stats = feature_statistics(
            sae,
            inputs,
            records[name],
            dense_threshold=cfg.dense_threshold,
            activated_min_samples=cfg.activated_min_samples,
            targets=targets,
        )
        rates[name] = stats.pop("firing_rates")
        stats["magnitude"] = magnitude
        rows[name] = stats
        heat[name] = _heat_map(sae, inputs, magnitude, prior, rates[name])
        if name != "standard_rescaled":  # the standard SAE's weights, saved as "standard"
            save = getattr(sae, "save_inference_model", None) or sae.save_model
            save(out / "models" / name)
    lap("evaluate")
    comsem_scores: dict[str, list[float]] = {}
    if cfg.comsem is not None:
        from sae_lens_bae.comsem import comsem_columns

        comsem_scores = comsem_columns(
            records, tokenizer, cfg.comsem, rows, out / "comsem", cfg.comsem_max_features, progress
        )
        lap("comsem")

    summary = {
        "config": asdict(cfg),
        "model": cfg.model,
        "hook": hook,
        "transcoder_input": mlp_in if "transcoder" in cfg.baselines else None,
        "dataset": data.dataset,
        "train_tokens": int(train.shape[0]),
        "held_out_tokens": int(test.shape[0]),
        "outliers_dropped": data.outliers_dropped,
        # every model reads states multiplied by this (bae interpret --sae ... --input-scale)
        "activation_scale": data.scales[hook],
        "bae_prior": cfg.prior,
        "models": rows,
        "seconds": watch.seconds,
    }
    write_json(out / "compare.json", summary)  # the results are safe before any plotting
    (out / "compare.md").write_text(_table(summary))
    plot_firing_frequency_grid(rates, out / "firing_frequency.png", "bae", cfg.dense_threshold)
    plot_magnitude_heatmaps(heat, out / "magnitudes.png", title=f"{cfg.model} {hook}")
    plot_training_curves(histories, out / "training_curves.png", title=f"{cfg.model} {hook}")
    if comsem_scores:
        from sae_lens_bae.plots import plot_comsem_scores

        plot_comsem_scores(comsem_scores, out / "comsem_scores.png", title=f"{cfg.model} {hook}")
    lap("report")
    write_json(out / "compare.json", summary)  # again, with the report's seconds
    return summary


@torch.no_grad()
def _heat_map(
    sae: Any, inputs: Tensor, magnitude: str, prior: Tensor | None, rates: Tensor
) -> Tensor:
    """Magnitudes of 64 held-out tokens on the 128 most used channels."""
    from sae_lens_bae.features.records import feature_magnitudes

    channels = torch.argsort(rates, descending=True)[:128]
    values, _ = feature_magnitudes(sae, inputs, magnitude, prior=prior)(0, 64)  # type: ignore[arg-type]
    return values[:, channels]


def _table(summary: dict[str, Any]) -> str:
    lines = [
        f"# BAE vs SAEs: {summary['model']} `{summary['hook']}`",
        "",
        f"{summary['train_tokens']} training tokens, {summary['held_out_tokens']} held-out tokens "
        f"(statistics on held-out); BAE magnitudes: burstiness with the {summary['bae_prior']} "
        "prior; activated: features with more than "
        f"{summary['config']['activated_min_samples']} tokens in the top-"
        f"{summary['config']['records_k']} records; dense: firing on more than "
        f"{summary['config']['dense_threshold']:.0%} of tokens.",
        "",
    ]
    from sae_lens_bae.comsem.pipeline import COMSEM_COLUMNS

    columns = [("model", lambda row: row["model"])]
    columns += [
        (title, lambda row, key=key, spec=spec: cell(row.get(key), spec))
        for key, title, spec in TABLE_COLUMNS
        + (COMSEM_COLUMNS if "comsem_score" in next(iter(summary["models"].values())) else ())
    ]
    rows = [{"model": name, **stats} for name, stats in summary["models"].items()]
    return "\n".join(lines) + "\n" + markdown_table(rows, columns)
