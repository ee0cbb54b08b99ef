"""The BAE recipe study of docs/research/recipe-study.md: one departure from the ``default``
recipe at a time, and the paper's recipe, trained beside ``default`` on SynthSAEBench-style
validation models by ``bae bench synth-sae``'s training (one stream per seed, every model scored
by ``eval_sae_on_synthetic_data``), each variant at its own coefficient scales.

    python benchmarks/recipe_study.py build --seed 7 --size 1024,48 --out MODEL
    python benchmarks/recipe_study.py train --model MODEL --seed 100 --out DIR \\
        [--variants all|none|NAME,...] [--scales '{"NAME": [s, ...]}'] [--steps N] [--lr F]
    python benchmarks/recipe_study.py report DIR [DIR ...] --out REPORT

``build`` saves a validation model (``bench_model_config``); ``train`` trains one seed into
``DIR/seed-N.json`` (``default`` is the family ``bae``, a variant ``bae:NAME``); ``report``
writes ``REPORT/study.md``, ``study.json`` and ``study.png``: each folder's table and every
variant's protocol v2 verdicts against ``default`` at matched L0. The width is the ``cpu``
preset's width per dimension; steps and lr default to the preset's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from sae_lens.synthetic import SyntheticModel

import sae_lens_bae  # noqa: F401  (registers the BAE)
from sae_lens_bae.experiments import synth_sae
from sae_lens_bae.experiments.synth_sae_report import (
    plot_frontiers,
    summary_table,
    verdict_table,
    verdicts,
)
from sae_lens_bae.reports import read_json, write_json, write_text
from sae_lens_bae.saes.bae import BAETrainingSAEConfig
from sae_lens_bae.saes.bae_recipes import BAE_RECIPES


def variants(d_in: int) -> dict[str, dict[str, Any]]:
    """Each factor's departure toward the paper (the study's registered table), at ``d_in``."""
    entropy = BAETrainingSAEConfig.__dataclass_fields__["entropy_coefficient"].default
    return {
        "covariance_equal": {"covariance_coefficient": entropy},
        "inputs_at_d_in": {"rescale_inputs_to": float(d_in)},
        "decoder_bias_mean": {"decoder_bias_init": "first_batch_mean"},
        "ste": {"surrogate": "ste"},
        "width_4d": {"d_sae": 4 * d_in},
        "width_2d": {"d_sae": 2 * d_in},
        "no_resampling": {"resample_every": 0},
        "paper": {**BAE_RECIPES["paper"].fields, "d_sae": 4 * d_in},
    }


@dataclasses.dataclass
class StudyConfig(synth_sae.SynthSAEConfig):
    """``bae bench synth-sae``'s config with the preset sized to a validation model."""

    study: synth_sae.Preset | None = None

    @property
    def spec(self) -> synth_sae.Preset:
        assert self.study is not None
        return self.study


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    model = SyntheticModel.load_from_disk(args.model)
    cpu = synth_sae.PRESETS["cpu"]
    d_in = model.cfg.hidden_dim
    table = variants(d_in)
    names = list(table) if args.variants == "all" else [] if args.variants == "none" else (
        args.variants.split(",")
    )  # fmt: skip
    unknown = sorted(set(names) - set(table))
    if unknown:
        sys.exit(f"unknown variants {unknown}; choose from {', '.join(table)}, all or none")
    scales = json.loads(args.scales)
    spec = dataclasses.replace(
        cpu,
        num_features=model.cfg.num_features,
        hidden_dim=d_in,
        width=d_in * cpu.width // cpu.hidden_dim,
        lr=args.lr or cpu.lr,
        settings={**cpu.settings, "bae": tuple(scales.get("default", cpu.settings["bae"]))},
    )
    steps = args.steps or spec.training_samples // spec.batch_size
    cfg = StudyConfig(
        synthetic_model=str(args.model),
        families=("bae",),
        seeds=(args.seed,),
        training_samples=steps * spec.batch_size,
        entropy=False,
        out=args.out,
        study=spec,
    )
    chosen = {
        name: synth_sae.Variant(table[name], tuple(scales[name]) if name in scales else None)
        for name in names
    }
    start = time.time()
    result = synth_sae.train_seed(cfg, args.seed, variants=chosen)
    seconds = time.time() - start
    result["study"] = {
        "model": str(args.model),
        "seed": args.seed,
        "steps": steps,
        "lr": spec.lr,
        "width": spec.width,
        "seconds": seconds,
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_json(Path(args.out) / f"seed-{args.seed}.json", result)


def report(args: argparse.Namespace) -> None:
    lines, held = ["# BAE recipe study", ""], {}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for folder in args.folders:
        paths = sorted(folder.glob("seed-*.json"))
        if not paths:
            sys.exit(f"no seed-*.json in {folder}; run train into it first")
        runs = [read_json(path, "a study run", "run train again") for path in paths]
        rows = [row for run in runs for row in run["rows"]]
        families = sorted({row["family"] for row in rows})
        found = {f: verdicts(rows, ["bae"], ours=f) for f in families if f != "bae"}
        info, seeds = runs[0]["study"], ", ".join(str(run["study"]["seed"]) for run in runs)
        lines += [
            f"## {folder.name}",
            "",
            f"Model {info['model']}, target L0 {runs[0]['model']['target_l0']:.2f}; "
            f"{info['steps']} steps at lr {info['lr']}, width {info['width']}; seeds {seeds}.",
            "",
            summary_table(rows),
            "",
        ]
        for name, found_here in found.items():
            lines += [f"### {name} against default (bae)", "", verdict_table(found_here), ""]
        held[folder.name] = {"rows": rows, "verdicts": found}
        plot_frontiers(rows, families, Path(args.out) / f"study-{folder.name}.png")
    write_json(Path(args.out) / "study.json", held)
    write_text(Path(args.out) / "study.md", "\n".join(lines))


def build(args: argparse.Namespace) -> None:
    features, hidden = (int(v) for v in args.size.split(","))
    SyntheticModel(synth_sae.bench_model_config(features, hidden, seed=args.seed)).save(args.out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("build", help="save a validation model")
    made.add_argument("--seed", type=int, required=True)
    made.add_argument("--size", default="1024,48", help="features,hidden_dim")
    made.add_argument("--out", type=Path, required=True)
    run = commands.add_parser("train", help="one seed of default and the variants")
    run.add_argument("--model", type=Path, required=True)
    run.add_argument("--seed", type=int, required=True)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--variants", default="all")
    run.add_argument("--scales", default="{}", help='JSON {"default"|NAME: [scale, ...]}')
    run.add_argument("--steps", type=int, default=None)
    run.add_argument("--lr", type=float, default=None)
    read = commands.add_parser("report", help="tables and verdicts of study folders")
    read.add_argument("folders", type=Path, nargs="+")
    read.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    {"build": build, "train": train, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
