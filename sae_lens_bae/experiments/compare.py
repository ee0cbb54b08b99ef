"""``bae compare``: a BAE against SAELens' SAEs by a protocol fixed before any number is read.

Every family (a BAE, TopK, JumpReLU, the standard L1 SAE...) trains on the same tokens with the
same schedule, at several sparsity settings, several seeds and each learning rate of a small
grid; settings are chosen on validation tokens only, and every model is then read once on test
tokens and on another text (out of distribution). A family beats another only where its frontier
lies above the other's by more than the seeds' spread, on test and on OOD.

The protocol, in order:

1. Splits: the corpus's sequences cut into train / validation / test (``held_out_fraction`` each
   for validation and test); OOD: another text, read the same way, every sequence held out.
2. Learning rate, per family: its middle setting at every ``lrs`` candidate (first seed); the
   lowest validation value of the family's own training objective wins (FVU alone would reward
   a run that failed to become sparse). ``bae_no_resampling``, an ablation of the BAE's
   resampling, takes the BAE's rate, so that one thing changes.
3. At that rate, every setting and seed; every model read on validation, test and OOD.
4. The BAE's default setting, on validation (means over seeds): the most ``activated`` features
   among the settings that meet the feature target (EV at least the sparsest TopK's minus 0.02,
   under 1% constant channels); none meets it: the recipe's own coefficients (scale 1).
5. The frontiers and the verdicts of ``experiments.protocol.frontier_verdict``.

All activations are scaled once by sqrt(d) / (mean training norm), as SAELens'
``expected_average_only_in`` would, and every model reads them with
``normalize_activations="none"``, so losses are in one unit.
"""

from __future__ import annotations

import random
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from sae_lens_bae.activations import harvest_layer, held_out_splits
from sae_lens_bae.checks import ranged
from sae_lens_bae.data import default_labelled_sentences, load_labelled_sentences
from sae_lens_bae.experiments.common import TRAINING_CHECKPOINT, ComSemJudge, LayerData
from sae_lens_bae.experiments.compare_report import plot_frontiers, report, verdicts
from sae_lens_bae.experiments.layer_study import (
    EvaluationSettings,
    evaluate_model,
    probe_columns,
    spliced_columns,
    training_objective,
)
from sae_lens_bae.experiments.protocol import SPLITS, choose_on_validation
from sae_lens_bae.features import FeatureRecords
from sae_lens_bae.models import load_model
from sae_lens_bae.plots import plot_comsem_scores, plot_training_curves
from sae_lens_bae.reports import Stopwatch, write_json, write_text
from sae_lens_bae.training import FAMILIES, TrainingRun, family_config, shared_schedule, train_sae
from sae_lens_bae.training.checkpoints import COMPLETE_MARKER

__all__ = ["REPORT", "CompareConfig", "run"]

REPORT = "compare.md"


@dataclass
class CompareConfig(ComSemJudge, LayerData):
    """What ``bae compare`` runs; the defaults fit 45 minutes on a 2-core CPU."""

    max_sequences: int | None = ranged(1536, low=1)
    """Cap on harvested sequences."""
    held_out_fraction: float = ranged(0.1, above=0.0, below=0.5)
    """Fraction of the sequences in each of the validation and test splits."""
    ood_dataset: str | None = None
    """Another text for the out-of-distribution split (default: gensim's movie reviews)."""
    families: Sequence[str] = ("bae", "bae_no_resampling", "topk", "jumprelu")
    """Families trained (see sae_lens_bae.training.FAMILIES)."""
    bae_scales: Sequence[float] = (0.5, 1.0, 2.0)
    """The BAE's settings: multiples of its recipe's a_e and a_c."""
    topk_k: Sequence[int] = (15, 32, 64, 100)
    """TopK's and BatchTopK's settings: k."""
    jumprelu_coefficients: Sequence[float] = (0.3, 1.0, 3.0)
    """JumpReLU's settings: its L0 coefficient."""
    l1_coefficients: Sequence[float] = (1.5, 5.0, 15.0)
    """The standard and gated SAEs' settings: their L1 coefficient."""
    lrs: Sequence[float] = (5e-4, 2e-3)
    """Adam learning rates each family chooses from on validation."""
    seeds: Sequence[int] = (0, 1)
    """Seeds of every setting (initialisation and data order)."""
    d_sae: int = ranged(2304, low=1)
    """Latents (code bits) of every model."""
    steps: int = ranged(800, low=1)
    """Training steps of every model."""
    batch_size: int = ranged(256, low=1)
    """Activations per training step."""
    records_k: int = ranged(10, low=1)
    """Top-k features kept per token in the records (k)."""
    n_explain: int = ranged(5, low=1)
    """activated: at least n_explain + 1 records (Algorithm 1); activated_strict: more than 8."""
    dense_threshold: float = ranged(0.5, low=0.0, high=1.0)
    """A channel active on more than this fraction of tokens is dense."""
    prior: Literal["training", "evaluation"] = "evaluation"
    """The BAE's burstiness prior: the mean code of the split read (the paper's) or of training."""
    spliced_sequences: int = ranged(16, low=0)
    """Sequences of test and of OOD on which each model is spliced into the LM (CE, KL)."""
    probe_dataset: str | None = None
    """Labelled sentences for k-sparse probing (default: gensim's movie reviews)."""
    probe_sentences: int = ranged(200, low=0)
    """Labelled sentences read (a seeded sample; the default set has 200); 0: skip."""
    out: Path = Path("runs/compare")
    """Report folder."""

    def __post_init__(self) -> None:
        super().__post_init__()  # LayerData's: every field's range, this class's too
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown or not self.families:
            raise ValueError(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
        for name in ("bae_scales", "topk_k", "jumprelu_coefficients", "l1_coefficients", "lrs"):
            values = getattr(self, name)
            if not values or any(v <= 0 for v in values) or len(set(values)) < len(values):
                raise ValueError(f"{name} must be distinct positive values, got {list(values)}")
        if "bae_no_resampling" in self.families and "bae" not in self.families:
            raise ValueError("bae_no_resampling trains at the BAE's learning rate: add bae")
        if not self.seeds or len(set(self.seeds)) < len(self.seeds):
            raise ValueError(f"seeds must be distinct, got {list(self.seeds)}")
        uses_k = {"topk", "batchtopk"} & set(self.families)
        if uses_k and any(k > self.d_sae for k in self.topk_k):
            raise ValueError(f"topk_k {list(self.topk_k)} exceeds d_sae = {self.d_sae}")

    def settings(self, family: str) -> list[float]:
        """The sparsity settings ``family`` trains at, sorted."""
        grid = {
            "bae": self.bae_scales,
            "topk": self.topk_k,
            "batchtopk": self.topk_k,
            "jumprelu": self.jumprelu_coefficients,
            "standard": self.l1_coefficients,
            "gated_relu": self.l1_coefficients,
        }
        if family == "bae_no_resampling":  # the remedy's effect, at the BAE's middle setting
            return [_middle(sorted(self.bae_scales))]
        return sorted(float(v) for v in grid[family])


def _default_ood_text(out: Path) -> str:
    """The movie-review sentences of gensim's test data as a plain text file (their labels
    dropped): reviews, where the default corpus is news."""
    path = out / "ood-text.txt"
    pairs = load_labelled_sentences(default_labelled_sentences())
    write_text(path, "\n".join(text for text, _ in pairs) + "\n")
    return str(path)


def _middle(values: Sequence[float]) -> float:
    return values[(len(values) - 1) // 2]


def run(cfg: CompareConfig, progress: bool = True) -> dict[str, Any]:
    """Harvest, choose, train, read and write ``compare.md``, ``compare.json`` and the frontier
    plots to ``cfg.out``; returns the summary."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    watch = Stopwatch("compare")
    data = cfg.harvest(out, held_out_parts=2, progress=progress)
    splits = held_out_splits(data, SPLITS[:2])
    n_test_sequences = len(splits["test"].positions[:, 0].unique())
    splits["ood"] = harvest_layer(
        cfg.model,
        cfg.ood_dataset or _default_ood_text(out),
        None,
        out / "ood-activations",
        like=data,
        context_size=cfg.context_size,
        max_sequences=n_test_sequences,
        outlier_norm_ratio=cfg.outlier_norm_ratio,
        device=cfg.device,
        progress=progress,
    )
    watch.lap("harvest")
    train = data.train[data.hook]
    settings = EvaluationSettings(
        records_k=cfg.records_k,
        n_explain=cfg.n_explain,
        dense_threshold=cfg.dense_threshold,
        prior=cfg.prior,
        spliced_sequences=cfg.spliced_sequences,
        outlier_norm_ratio=cfg.outlier_norm_ratio,
    )
    checkpoints = out / TRAINING_CHECKPOINT  # a rerun after a kill trains no finished model again
    models: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    histories: dict[str, list[dict[str, float]]] = {}
    records: dict[str, FeatureRecords] = {}

    def fit(family: str, setting: float, lr: float, seed: int, search: bool = False) -> str:
        """Train one model (or take it from an earlier stage) and read it on validation; the
        runs of the lr search are also scored by their training objective."""
        name = f"{family}-{setting:g}-lr{lr:g}-seed{seed}"
        if name in models:
            return name
        folder = checkpoints / name
        resume = folder.is_dir() and any(folder.rglob(COMPLETE_MARKER))
        sae_cfg = family_config(family, train.shape[1], cfg.d_sae, setting, cfg.steps)
        trained: TrainingRun = train_sae(
            train,
            sae_cfg,
            training_samples=cfg.steps * cfg.batch_size,
            batch_size=cfg.batch_size,
            device=cfg.device,
            seed=seed,
            checkpoint_dir=folder,
            resume=resume,
            n_checkpoints=4,
            save_final_checkpoint=True,
            **shared_schedule(lr, cfg.steps),
        )
        for kept in folder.iterdir():  # the final checkpoint is all a rerun needs
            if kept.is_dir() and not kept.name.startswith("final_"):
                shutil.rmtree(kept)
        models[name], histories[name] = trained.sae, trained.history
        # bae_no_resampling's lr is chosen from the same candidates, on the BAE's runs
        row = {"name": name, "family": family, "setting": setting, "seed": seed, "lr": lr}
        row["lr_candidates"] = list(cfg.lrs)
        read = _read(name, trained.sae, splits["validation"], "validation")
        read["objective"] = None
        if search:
            held = splits["validation"].test[data.hook]
            read["objective"] = training_objective(trained.sae, held, cfg.batch_size, cfg.steps)
        rows.append({**row, **read})
        watch.lap(f"train {name}")
        return name

    def _read(name: str, sae: Any, split: Any, split_name: str) -> dict[str, Any]:
        stats, held, _ = evaluate_model(name, sae, split, settings)
        if split_name == "test":
            records[name] = held
        keys = (
            "explained_variance",
            "l0",
            "l0_rare",
            "dead",
            "constant",
            "activated",
            "activated_strict",
        )
        return {"split": split_name, **{key: stats[key] for key in keys}}

    seeds, families = list(cfg.seeds), list(cfg.families)
    chosen_lr: dict[str, float] = {}
    for family in families:
        if family == "bae_no_resampling":  # an ablation: the BAE's lr, one change only
            chosen_lr[family] = chosen_lr["bae"]
            continue
        middle = _middle(cfg.settings(family))
        candidates = [fit(family, middle, lr, seeds[0], search=True) for lr in cfg.lrs]
        best = choose_on_validation(
            [r for r in rows if r["name"] in candidates], lambda r: r["objective"]
        )
        chosen_lr[family] = best[(family,)]["lr"]
    final = [
        fit(family, setting, chosen_lr[family], seed)
        for family in families
        for setting in cfg.settings(family)
        for seed in seeds
    ]
    bae_default = _bae_default(rows, final, cfg.d_sae) if "bae" in families else None

    # every model of the final grid read once on test and OOD; the language model loaded once
    final_models = {name: models[name] for name in final}
    base = {r["name"]: r for r in rows}
    for split_name in ("test", "ood"):
        for name, sae in final_models.items():
            read = _read(name, sae, splits[split_name], split_name)
            rows.append({**_identity(base[name]), **read})
    watch.lap("read on test and OOD")
    needs_model = cfg.spliced_sequences > 0 or cfg.probe_sentences > 0
    language_model = load_model(data.model, device=cfg.device) if needs_model else None
    read_rows = {(r["name"], r["split"]): r for r in rows}
    for split_name in ("test", "ood") if cfg.spliced_sequences > 0 else ():
        spliced = spliced_columns(final_models, splits[split_name], settings, language_model)
        for name, values in spliced.items():
            row = read_rows[(name, split_name)]
            row["ce_loss_recovered"], row["kl"] = values["ce_loss_score"], values["kl_div_with_sae"]
    watch.lap("spliced into the model")
    if cfg.probe_sentences > 0:
        pairs = load_labelled_sentences(cfg.probe_dataset or default_labelled_sentences())
        pairs = random.Random(seeds[0]).sample(pairs, min(cfg.probe_sentences, len(pairs)))
        probes = probe_columns(final_models, data, pairs, language_model, seed=seeds[0])
        for row in rows:  # labelled sentences, read once per model: on its test and OOD rows
            if row["split"] != "validation":
                row.update(probes[row["name"]])
        watch.lap("k-sparse probing")
    del language_model
    for row in rows:
        for key in ("ce_loss_recovered", "kl", "probe_accuracy"):
            row.setdefault(key, None)
    judged = {n: records[n] for n in final if n.endswith(f"seed{seeds[0]}")}
    by_name = {n: read_rows[(n, "test")] for n in judged}
    comsem_scores = cfg.judge(judged, data.tokenizer, by_name, out, progress)
    if comsem_scores:
        watch.lap("comsem")

    summary = {
        "config": asdict(cfg),
        "hook": data.hook,
        "dataset": data.dataset,
        "ood_dataset": splits["ood"].dataset,
        "tokens": {
            "train": int(train.shape[0]),
            **{s: int(splits[s].test[data.hook].shape[0]) for s in SPLITS},
        },
        "activation_scale": data.scales[data.hook],
        "chosen_lr": chosen_lr,
        "bae_default": bae_default,
        "rows": rows,
        "verdicts": verdicts(rows, families),
        "seconds": watch.seconds,
    }
    write_json(out / "compare.json", summary)  # the results are safe before any plotting
    write_text(out / "compare.md", report(summary))
    (out / "records").mkdir(exist_ok=True)
    for name in final:
        models[name].save_model(out / "models" / name)
        records[name].save(out / "records" / f"{name}.safetensors")
    if bae_default is not None:  # the chosen BAE (first seed) where the other commands look
        chosen = f"bae-{bae_default:g}-lr{chosen_lr['bae']:g}-seed{seeds[0]}"
        models[chosen].save_model(out / "models" / "bae")
        records[chosen].save(out / "records" / "bae.safetensors")
    plot_frontiers(rows, families, out, title=f"{cfg.model} {data.hook}")
    plot_training_curves(
        {n: h for n, h in histories.items() if n.endswith(f"seed{seeds[0]}")},
        out / "training_curves.png",
    )
    if comsem_scores:
        plot_comsem_scores(comsem_scores, out / "comsem_scores.png")
    watch.lap("report")
    summary["seconds"] = watch.seconds
    write_json(out / "compare.json", summary)
    shutil.rmtree(checkpoints, ignore_errors=True)  # the results are written
    return summary


def _identity(row: dict[str, Any]) -> dict[str, Any]:
    keys = ("name", "family", "setting", "seed", "lr", "lr_candidates")
    return {key: row[key] for key in keys}


EV_MARGIN = 0.02
"""The feature target's EV tolerance below the sparsest TopK SAE (the paper's TopK-15)."""


def _bae_default(rows: list[dict[str, Any]], final: list[str], d_sae: int) -> float:
    """The BAE's default setting from validation rows of the final grid (means over seeds): the
    most activated features (ties: the higher EV) among the settings that meet the feature
    target: EV at least the sparsest TopK setting's minus ``EV_MARGIN`` and constant channels
    under 1%; none meets it: the recipe's own coefficients (scale 1). Chosen before any test or
    OOD row exists."""
    held = [r for r in rows if r["split"] == "validation" and r["name"] in final]

    def mean(family: str, setting: float, key: str) -> float:
        values = [r[key] for r in held if r["family"] == family and r["setting"] == setting]
        return statistics.fmean(values)

    topk = sorted({r["setting"] for r in held if r["family"] == "topk"})
    floor = mean("topk", topk[0], "explained_variance") - EV_MARGIN if topk else float("-inf")
    settings = sorted({r["setting"] for r in held if r["family"] == "bae"})
    meets = [
        s
        for s in settings
        if mean("bae", s, "explained_variance") >= floor
        and mean("bae", s, "constant") < 0.01 * d_sae
    ]
    if not meets:
        return 1.0
    return max(
        meets, key=lambda s: (mean("bae", s, "activated"), mean("bae", s, "explained_variance"))
    )
