"""The models of one ``bae compare`` run and what is read of them: training (resumable from its
checkpoints), the learning-rate bracketing, the reads on validation, test and OOD with their
bootstrap replicates, and the files written at the end."""

from __future__ import annotations

import functools
import random
import shutil
import statistics
from pathlib import Path
from typing import Any

from sae_lens_bae.activations import harvest_layer, held_out_splits
from sae_lens_bae.data import default_labelled_sentences, load_labelled_sentences
from sae_lens_bae.evaluation import spliced_scores
from sae_lens_bae.experiments.common import TRAINING_CHECKPOINT
from sae_lens_bae.experiments.compare_objective import training_objective
from sae_lens_bae.experiments.compare_read import (
    SplitSums,
    probe_reads,
    read_split,
    row_of_metrics,
    sequence_weights,
    spliced_reads,
)
from sae_lens_bae.experiments.compare_report import plot_density, plot_frontiers, report
from sae_lens_bae.experiments.protocol import SPLITS, bracket_learning_rate
from sae_lens_bae.models import load_model
from sae_lens_bae.plots import plot_comsem_scores, plot_training_curves
from sae_lens_bae.reports import Stopwatch, write_json, write_text
from sae_lens_bae.training import family_config, save_in_input_units, shared_schedule, train_sae
from sae_lens_bae.training.checkpoints import COMPLETE_MARKER

__all__ = ["Study", "task_name"]


class Study:
    """One comparison's data, models and rows (``cfg`` a ``CompareConfig``; ``bae_fields``
    replace the BAE's config fields, as ``family_config`` takes them)."""

    def __init__(
        self, cfg: Any, out: Path, progress: bool, bae_fields: dict[str, Any] | None = None
    ) -> None:
        self.cfg, self.out, self.progress = cfg, out, progress
        self.bae_fields = bae_fields or {}
        self.watch = Stopwatch("compare")
        self.data = cfg.harvest(out, held_out_parts=2, progress=progress)
        self.splits = held_out_splits(self.data, SPLITS[:2])
        n_test = len(self.splits["test"].positions[:, 0].unique())
        self.splits["ood"] = harvest_layer(
            cfg.model,
            cfg.ood_dataset or _default_ood_text(out),
            None,
            out / "ood-activations",
            like=self.data,
            context_size=cfg.context_size,
            max_sequences=n_test,
            outlier_norm_ratio=cfg.outlier_norm_ratio,
            device=cfg.device,
            progress=progress,
        )
        self.watch.lap("harvest")
        self.weights = {  # one resample of the sequences per replicate, shared by every model
            split: sequence_weights(
                len(view.positions[:, 0].unique()), cfg.bootstrap, cfg.seeds[0] + i
            )
            for i, (split, view) in enumerate(self.splits.items())
        }
        self.models: dict[str, Any] = {}
        self.histories: dict[str, list[dict[str, float]]] = {}
        self.rows: list[dict[str, Any]] = []
        self.records: dict[str, Any] = {}
        self.frequencies: dict[str, Any] = {}
        self.tried: dict[str, list[float]] = {}

    @functools.cached_property
    def lm(self) -> Any:
        """The language model, loaded once on first use (splicing and probing)."""
        return load_model(self.data.model, device=self.cfg.device)

    def train_grid(self, ladders: dict[str, list[float]], lr: dict[str, float]) -> list[str]:
        """Every setting of ``ladders`` at every seed, at its family's rate, read on validation
        and spliced there (the KL the ladders are extended on); returns the models' names."""
        cfg = self.cfg
        names = [
            self.fit(family, setting, lr[family], seed)
            for family, settings in ladders.items()
            for setting in settings
            for seed in cfg.seeds
        ]
        by_key = {(r["name"], r["split"]): r for r in self.rows}
        unspliced = [n for n in names if by_key[(n, "validation")].get("kl") is None]
        if cfg.spliced_sequences > 0 and unspliced:
            self.splice(unspliced, ("validation",))
        return names

    def tokens(self) -> dict[str, int]:
        counts = {s: int(self.splits[s].test[self.data.hook].shape[0]) for s in SPLITS}
        return {"train": int(self.data.train[self.data.hook].shape[0]), **counts}

    def outliers_dropped(self) -> dict[str, int]:
        """Extreme states set aside (``sae_lens_bae.outliers``): by the harvest and by the
        harvest of the OOD text."""
        return {"harvest": self.data.outliers_dropped, "ood": self.splits["ood"].outliers_dropped}

    def fit(self, family: str, setting: float, lr: float, seed: int, search: bool = False) -> str:
        """Train one model (or take it from an earlier stage or a checkpoint) and read it on
        validation; the lr search's runs are also scored by their training objective."""
        name = f"{family}-{setting:g}-lr{lr:g}-seed{seed}"
        if name in self.models:
            return name
        cfg, train = self.cfg, self.data.train[self.data.hook]
        folder = self.out / TRAINING_CHECKPOINT / name
        fields = self.bae_fields if family.startswith("bae") else {}
        trained = train_sae(
            train,
            family_config(family, train.shape[1], cfg.d_sae, setting, cfg.steps, **fields),
            training_samples=cfg.steps * cfg.batch_size,
            batch_size=cfg.batch_size,
            device=cfg.device,
            seed=seed,
            checkpoint_dir=folder,
            resume=folder.is_dir() and any(folder.rglob(COMPLETE_MARKER)),
            n_checkpoints=4,
            save_final_checkpoint=True,
            outlier_norm_ratio=cfg.outlier_norm_ratio,
            **shared_schedule(lr, cfg.steps),
        )
        for kept in folder.iterdir():  # the final checkpoint is all a rerun needs
            if kept.is_dir() and not kept.name.startswith("final_"):
                shutil.rmtree(kept)
        self.models[name], self.histories[name] = trained.sae, trained.history
        row = {"name": name, "family": family, "setting": setting, "seed": seed, "lr": lr}
        row.update(self._read(name, "validation"), objective=None)
        if search:
            held = self.splits["validation"].test[self.data.hook]
            row["objective"] = training_objective(trained.sae, held, cfg.batch_size, cfg.steps)
        self.rows.append(row)
        self.watch.lap(f"train {name}")
        return name

    def _read(self, name: str, split: str) -> dict[str, Any]:
        sums, records = read_split(
            self.models[name], self.splits[split], self.cfg.records_k, self.cfg.prior
        )
        if split == "test":
            records.info = {"model": self.data.model, "hook": self.data.hook, "sae": name}
            self.records[name] = records
            self.frequencies[name] = (sums.active.sum(0) / sums.tokens.sum()).float()
        self._sums = sums
        return {"split": split, **row_of_metrics(sums, self.weights[split], self.cfg.n_explain)}

    def choose_learning_rates(self) -> tuple[dict[str, float], dict[str, list[float]]]:
        """Per family, its middle setting's mean validation objective over the first two seeds
        at each rate, the grid extended while its edge wins (``bracket_learning_rate``)."""
        chosen: dict[str, float] = {}
        seeds = list(self.cfg.seeds)[:2]
        for family in self.cfg.families:
            middle = _middle(self.cfg.settings(family))

            def score(lr: float, family: str = family, middle: float = middle) -> float:
                names = [self.fit(family, middle, lr, seed, search=True) for seed in seeds]
                rows = [r for r in self.rows if r["name"] in names and r["split"] == "validation"]
                return statistics.fmean(r["objective"] for r in rows)

            chosen[family], self.tried[family] = bracket_learning_rate(
                self.cfg.lrs, score, self.cfg.lr_extensions
            )
        for row in self.rows:
            row["lr_candidates"] = self.tried[row["family"]]
        return chosen, self.tried

    def read_final(self, final: list[str]) -> None:
        """Every model of the final grid read once on test and OOD, spliced into the language
        model and probed."""
        base = {r["name"]: r for r in self.rows if r["split"] == "validation"}
        sums: dict[tuple[str, str], SplitSums] = {}
        for split in ("test", "ood"):
            for name in final:
                identity = {k: base[name][k] for k in ("name", "family", "setting", "seed", "lr")}
                row = {**identity, "lr_candidates": self.tried[identity["family"]]}
                self.rows.append({**row, **self._read(name, split)})
                sums[(name, split)] = self._sums
        self.watch.lap("read on test and OOD")
        if self.cfg.spliced_sequences > 0:
            self.splice(final, ("test", "ood"))
        if self.cfg.probe_sentences > 0:
            self._probe(final)
        for row in self.rows:
            for key in ("ce_loss_recovered", "kl", "probe_accuracy"):
                row.setdefault(key, None)

    def splice(self, names: list[str], splits: tuple[str, ...]) -> None:
        """CE recovered and KL of ``names`` on the first ``spliced_sequences`` sequences of each
        split, with their bootstrap replicates, into the models' rows of that split."""
        models = {name: self.models[name] for name in names}
        by_key = {(r["name"], r["split"]): r for r in self.rows}
        for split in splits:
            found = spliced_reads(
                models,
                self.splits[split],
                self.lm,
                self.cfg.spliced_sequences,
                self.cfg.outlier_norm_ratio,
            )
            for name, values in found.items():
                weights = self.weights[split][:, : len(values["per_sequence"]["kl_tokens"])]
                row = by_key[(name, split)]
                row["ce_loss_recovered"], row["kl"] = (
                    values["ce_loss_score"],
                    values["kl_div_with_sae"],
                )
                scores = [spliced_scores(values["per_sequence"], w) for w in weights]
                row["replicates"]["kl"] = [s["kl_div_with_sae"] for s in scores]
                row["replicates"]["ce_loss_recovered"] = [s["ce_loss_score"] for s in scores]
        self.watch.lap(f"spliced {len(names)} models into the model ({', '.join(splits)})")

    def _probe(self, final: list[str]) -> None:
        cfg = self.cfg
        by_key = {(r["name"], r["split"]): r for r in self.rows}
        tasks = {}
        for source in cfg.probe_datasets or [str(default_labelled_sentences())]:
            pairs = load_labelled_sentences(source)
            rng = random.Random(cfg.seeds[0])
            tasks[task_name(source)] = rng.sample(pairs, min(cfg.probe_sentences, len(pairs)))
        models = {name: self.models[name] for name in final}
        found = probe_reads(models, self.data, tasks, self.lm, cfg.seeds[0], cfg.bootstrap)
        for name, per_split in found.items():
            for split, per_task in per_split.items():
                if not per_task:  # one task: OOD rows carry no probe of their own
                    continue
                row = by_key[(name, split)]
                row["probe_accuracy"] = {t: v["accuracy"] for t, v in per_task.items()}
                row["probe_standard_error"] = {t: v["standard_error"] for t, v in per_task.items()}
                for task, held in per_task.items():
                    for k, values in held["replicates"].items():
                        row["replicates"][f"probe_accuracy.{task}.{k}"] = values
        self.watch.lap("k-sparse probing")

    def write(self, summary: dict[str, Any], final: list[str]) -> None:
        """compare.json (without the replicates), compare.md, the models, records and plots."""
        cfg, out = self.cfg, self.out
        title = f"{cfg.model} {self.data.hook}"
        plot_frontiers(self.rows, list(cfg.families), out, title=title)
        plot_density(self.frequencies, self.rows, out / "density.png", title=title)
        judged = {n: self.records[n] for n in final if n.endswith(f"seed{cfg.seeds[0]}")}
        by_name = {r["name"]: r for r in self.rows if r["split"] == "test" and r["name"] in judged}
        comsem = cfg.judge(judged, self.data.tokenizer, by_name, out, self.progress)
        for row in self.rows:
            row.pop("replicates", None)
        write_json(out / "compare.json", summary)  # the results are safe before anything else
        write_text(out / "compare.md", report(summary))
        (out / "records").mkdir(exist_ok=True)
        scale = self.data.scales[self.data.hook]  # saved to read the states as harvested
        for name in final:
            save_in_input_units(self.models[name], out / "models" / name, scale)
            self.records[name].save(out / "records" / f"{name}.safetensors")
        if summary["bae_default"] is not None:  # the chosen BAE (first seed) for other commands
            lr, seed = summary["chosen_lr"]["bae"], cfg.seeds[0]
            chosen = f"bae-{summary['bae_default']:g}-lr{lr:g}-seed{seed}"
            save_in_input_units(self.models[chosen], out / "models" / "bae", scale)
            self.records[chosen].save(out / "records" / "bae.safetensors")
        first = {n: h for n, h in self.histories.items() if n.endswith(f"seed{cfg.seeds[0]}")}
        plot_training_curves(first, out / "training_curves.png")
        if comsem:
            plot_comsem_scores(comsem, out / "comsem_scores.png")
        self.watch.lap("report")
        summary["seconds"] = self.watch.seconds
        write_json(out / "compare.json", summary)
        shutil.rmtree(out / TRAINING_CHECKPOINT, ignore_errors=True)  # the results are written


def _middle(values: list[float]) -> float:
    return values[(len(values) - 1) // 2]


def task_name(source: str) -> str:
    """A probe task's key in the rows: the source's last name without suffixes, no dots (the
    verdicts read ``probe_accuracy.TASK.K`` as a dotted path)."""
    return Path(source.rstrip("/")).name.split(".")[0] or source.replace(".", "_")


def _default_ood_text(out: Path) -> str:
    """The movie-review sentences of gensim's test data as a plain text file (their labels
    dropped): reviews, where the default corpus is news."""
    path = out / "ood-text.txt"
    pairs = load_labelled_sentences(default_labelled_sentences())
    write_text(path, "\n".join(text for text, _ in pairs) + "\n")
    return str(path)
