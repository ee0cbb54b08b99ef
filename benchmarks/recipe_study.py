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
writes ``REPORT/study.md``, ``study.json`` and a PNG per folder: each folder's table and every
variant's protocol v2 verdicts against ``default`` at matched L0 (with ``--baseline DIR``, also
every family of the other folders against that folder's ``default``). The width is the ``cpu``
preset's width per dimension; steps and lr default to the preset's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch
from sae_lens.synthetic import SyntheticModel

import sae_lens_bae  # noqa: F401  (registers the BAE)
from sae_lens_bae.experiments import synth_sae
from sae_lens_bae.experiments.synth_sae_report import (
    VERDICT_METRICS,
    plot_frontiers,
    summary_table,
    verdict_table,
    verdicts,
)
from sae_lens_bae.reports import read_json, write_json, write_text
from sae_lens_bae.saes.bae import BAETrainingSAEConfig
from sae_lens_bae.saes.bae_recipes import BAE_RECIPES


class Refused(ValueError):
    """Bad input, said in one line (argparse's exit 2)."""


def variants(d_in: int) -> dict[str, dict[str, Any]]:
    """Each factor's departure toward the paper (the study's registered table), at ``d_in``; the
    input scale's is the states as given, since ``default`` frames them at variance 1 per
    dimension."""
    entropy = BAETrainingSAEConfig.__dataclass_fields__["entropy_coefficient"].default
    return {
        "covariance_equal": {"covariance_coefficient": entropy},
        "inputs_as_given": {"input_variance": None},
        "width_4d": {"d_sae": 4 * d_in},
        "width_2d": {"d_sae": 2 * d_in},
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


def _asked(names_given: str, scales_given: str, d_in: int) -> tuple[dict[str, Any], dict]:
    """The variants ``--variants`` names, at the scales ``--scales`` gives, and those scales."""
    table = variants(d_in)
    if names_given in ("all", "none"):
        names = list(table) if names_given == "all" else []
    else:
        names = names_given.split(",")
    unknown = sorted(set(names) - set(table))
    if unknown:
        raise Refused(f"unknown variants {unknown}; choose from {', '.join(table)}, all or none")
    try:
        scales = json.loads(scales_given)
    except json.JSONDecodeError:
        example = '{"width_2d": [724, 861]}'
        raise Refused(f"--scales takes JSON like '{example}', got {scales_given!r}") from None
    stray = sorted(set(scales) - {*names, "default"})
    if stray:
        raise Refused(f"--scales names {stray}, which this run does not train")
    chosen = {
        name: synth_sae.Variant(table[name], tuple(scales[name]) if name in scales else None)
        for name in names
    }
    return chosen, scales


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    if not (args.model / "synthetic_model_config.json").exists():
        raise Refused(f"{args.model} holds no saved SyntheticModel; make one with build")
    model = SyntheticModel.load_from_disk(args.model)
    cpu = synth_sae.PRESETS["cpu"]
    d_in = model.cfg.hidden_dim
    chosen, scales = _asked(args.variants, args.scales, d_in)
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


def beats(found: dict[str, Any]) -> bool:
    """The registered rule: better on MCC or F1, worse on neither, not worse on dense."""
    read = {metric: found[f"bae.{metric}"]["verdict"] for metric in ("mcc", "f1", "dense")}
    better = "better" in (read["mcc"], read["f1"])
    return better and "worse" not in (read["mcc"], read["f1"], read["dense"])


def _load(folder: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    paths = sorted(folder.glob("seed-*.json"))
    if not paths:
        raise Refused(f"no seed-*.json in {folder}; run train into it first")
    runs = [read_json(path, "a study run", "run train again") for path in paths]
    return runs, [row for run in runs for row in run["rows"]]


def _decision_line(label: str, found: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """One variant's verdicts against its default (on converged rows), how many of both
    converged, and the rule's answer."""
    read = [found[f"bae.{metric}"] for metric in VERDICT_METRICS]
    cells = [
        v["verdict"] if v["gap"] is None else f"{v['verdict']} ({v['gap']:+.3f})" for v in read
    ]
    done = sum(bool(r["converged"]) for r in rows)
    answer = "beats" if beats(found) else "does not beat"
    return f"| {label} | {' | '.join(cells)} | {done}/{len(rows)} | {answer} |"


def report(args: argparse.Namespace) -> None:
    """Each folder's table, every variant against its folder's default, and with ``--baseline``
    every family of the other folders against the baseline folder's default."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = _load(args.baseline)[1] if args.baseline else []
    reference = [r for r in base if r["family"] == "bae"]
    decisions = ["| variant (folder) | MCC | F1 | dead | dense | rows converged | rule |",
                 "|---|---|---|---|---|---|---|"]  # fmt: skip
    lines, held = ["# BAE recipe study", ""], {}
    for folder in args.folders:
        runs, rows = _load(folder)
        info, seeds = runs[0]["study"], ", ".join(str(run["study"]["seed"]) for run in runs)
        lines += [
            f"## {folder.name}",
            "",
            f"Model {info['model']}, target L0 {runs[0]['model']['target_l0']:.2f}; "
            f"{info['steps']} steps at lr {info['lr']}, width {info['width']}; seeds {seeds}; "
            f"{max(run['study']['seconds'] for run in runs) / 60:.0f} min a seed on one core.",
            "",
            summary_table(rows),
            "",
        ]
        found, default = {}, [r for r in rows if r["family"] == "bae"]
        for family in sorted({row["family"] for row in rows}):
            mine = [r for r in rows if r["family"] == family]
            pairs = [] if family == "bae" else [("default", default)]
            if reference and folder != args.baseline:
                pairs.append((f"default of {args.baseline.name}", reference))
            for label, theirs in pairs:
                # a row counts only when converged (the registered rule); the rest is reported
                ours = [{**r, "family": "ours"} for r in mine if r["converged"]]
                verdict = verdicts([*ours, *(r for r in theirs if r["converged"])], ["bae"], "ours")
                found[f"{family} vs {label}"] = verdict
                lines += [f"### {family} against the {label}", "", verdict_table(verdict), ""]
                decisions.append(_decision_line(f"{family} vs {label} ({folder.name})", verdict,
                                                [*mine, *theirs]))  # fmt: skip
        held[folder.name] = {"rows": rows, "verdicts": found}
        plot_frontiers(rows, sorted({r["family"] for r in rows}), out / f"{folder.name}.png")
    lines[2:2] = ["## Decisions (the registered rule, each variant against its default)", "",
                  *decisions, ""]  # fmt: skip
    write_json(out / "study.json", held)
    write_text(out / "study.md", "\n".join(lines))


def build(args: argparse.Namespace) -> None:
    features, hidden = (int(v) for v in args.size.split(","))
    SyntheticModel(synth_sae.bench_model_config(features, hidden, seed=args.seed)).save(args.out)


def main(argv: list[str] | None = None) -> None:
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
    read.add_argument("--baseline", type=Path, default=None, help="folder whose default judges")
    read.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        {"build": build, "train": train, "report": report}[args.command](args)
    except Refused as refusal:
        parser.error(str(refusal))


if __name__ == "__main__":
    main()
