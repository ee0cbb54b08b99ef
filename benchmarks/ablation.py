"""Every piece of the BAE against the bare BAE on LLM states (docs/research/ablation.md): each
piece switched off from ``default`` and switched on from the bare BAE (the paper's equations,
benchmarks/bare_bae.py), each variant at several coefficient scales and seeds, read on held-out
states by ``bae compare``'s definitions (EV, KL spliced into the model, dense, constant,
activated features) and compared at matched L0 and at matched KL.

    python benchmarks/ablation.py train --dataset TEXT --layer 15 --out DIR --worker 0/2
    python benchmarks/ablation.py train ... --worker 1/2      # beside it, one thread each
    python benchmarks/ablation.py synthetic --model MODEL --scales 215,431,861 --out DIR2
    python benchmarks/ablation.py report DIR

Every run appends its row to ``DIR/rows-W.jsonl`` as it ends, so a rerun goes on from the next
run. ``report`` writes ``ablation.md``, ``ablation.json`` and ``ablation.png``.

The pieces and how a variant switches one (the package's training otherwise, ``train_sae`` at
the default's constant rate):

* ``scale`` and ``shift``: the input frame ``k (x + t)`` (``saes.input_frame``). With both on,
  the config's own frame; with one, the states are transformed by it here (k and t from the
  rows ``train_sae`` fixes a frame on) and the transformation is folded into the weights
  after training, so every variant is read on the same states.
* ``entropy_off``: the entropy term off for the first quarter of the steps (the default
  recipe's phase, ``bae_config(..., training_steps=steps)``) against on from the first.
  ``clip``: SAETrainer's gradient clip to norm 1, switched off by replacing
  ``torch.nn.utils.clip_grad_norm_`` with a no-op for that run in this process only.
* ``schedule``: SAELens' warm-up over 5% of steps and linear decay to 0 over the last 20%
  (the schedule ``bae compare`` trains every family with) against a constant rate.
* ``t0.3``: the sigmoid surrogate at temperature 0.3 (the entropy recipe's) against the paper's
  1.

Coefficients: a variant without the frame's scale has its a_e and a_c multiplied by 1 / k^2 (k
as the frame would set it), which is what the frame does to its penalties, so every variant
weighs them against the same squared error per unit of variance, and the coefficient scales of
the ladder mean one thing for all.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from sae_lens_bae.experiments.compare import CompareConfig
from sae_lens_bae.experiments.compare_study import Study
from sae_lens_bae.plots import save_figure, subplots
from sae_lens_bae.reports import markdown_table, write_json, write_text
from sae_lens_bae.saes.bae_recipes import DEFAULT_BATCH_SIZE, DEFAULT_LR, bae_config
from sae_lens_bae.saes.input_frame import frame_sample, placement
from sae_lens_bae.training import train_sae
from sae_lens_bae.training.trainer import NORM_ESTIMATE_BATCHES

PIECES = ("scale", "shift", "clip", "entropy_off", "schedule", "t0.3")
DEFAULT_PIECES = frozenset({"scale", "shift", "clip", "entropy_off"})
"""The pieces ``default`` has; the bare BAE has none."""


def variants() -> dict[str, frozenset[str]]:
    """Every variant by name: its set of pieces. ``default-X`` lacks a piece the default has,
    ``default+X`` adds one it lacks; ``bare+X`` adds one to the bare BAE."""
    named = {"default": DEFAULT_PIECES, "bare": frozenset()}
    for piece in PIECES:
        if piece in DEFAULT_PIECES:
            named[f"default-{piece}"] = DEFAULT_PIECES - {piece}
        else:
            named[f"default+{piece}"] = DEFAULT_PIECES | {piece}
        named[f"bare+{piece}"] = frozenset({piece})
    return named


def pieces_of(name: str) -> frozenset[str]:
    """A variant's pieces from its name: ``default`` or ``bare``, then ``+piece`` or ``-piece``
    any number of times (``bare+clip+entropy_off``). ValueError names what is wrong."""
    base, *changes = name.replace("-", "\0-").replace("+", "\0+").split("\0")
    if base not in ("default", "bare"):
        raise ValueError(f"{name!r}: a variant starts with 'default' or 'bare'")
    pieces = set(DEFAULT_PIECES if base == "default" else ())
    for change in changes:
        sign, piece = change[0], change[1:]
        if piece not in PIECES:
            raise ValueError(f"{name!r}: unknown piece {piece!r}; pieces: {', '.join(PIECES)}")
        (pieces.add if sign == "+" else pieces.discard)(piece)
    return frozenset(pieces)


def chosen_variants(text: str) -> dict[str, frozenset[str]]:
    """The variants ``--variants`` names (every grid variant when empty), with their pieces;
    exits with one line on a bad name."""
    if not text:
        return variants()
    try:
        return {name: pieces_of(name) for name in text.split(",")}
    except ValueError as error:
        sys.exit(str(error))


def groups(names: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """(variant, seed) in the order given, each variant's seeds together: a group trains at
    every scale, then is read and spliced as one (the clean and ablated passes shared)."""
    return [(v, seed) for v in names for seed in seeds]


def frame_of(rows: torch.Tensor, variance_per_dim: float = 1.0) -> tuple[float, torch.Tensor]:
    """(k, t) as ``saes.input_frame.fix_frame`` sets them from ``rows``."""
    variance, shift = placement(rows.double())
    return math.sqrt(variance_per_dim * rows.shape[1] / float(variance)), shift.float()


@torch.no_grad()
def fold(sae: Any, k: float, t: torch.Tensor) -> None:
    """Fold a transformation ``k (x + t)`` of the states into the weights (as
    ``fold_input_scale`` does), so the model reads the untransformed states."""
    if sae.cfg.apply_b_dec_to_input:  # the shift would belong to b_dec there
        raise ValueError("fold takes a BAE without apply_b_dec_to_input")
    sae.W_enc.data *= k
    sae.b_enc.data += t @ sae.W_enc.data
    sae.W_dec.data /= k
    sae.b_dec.data = sae.b_dec.data / k - t


def train_variant(
    pieces: frozenset[str],
    train: torch.Tensor,
    scale: float,
    seed: int,
    steps: int,
    d_sae: int | None = None,
) -> Any:
    """One variant trained by ``train_sae`` (see the module docstring for each piece), of
    width ``d_sae`` (2 d_in unless given)."""
    d_in = train.shape[1]
    k, t = frame_of(frame_sample(train, NORM_ESTIMATE_BATCHES * DEFAULT_BATCH_SIZE, seed))
    framed = {"scale", "shift"} <= pieces
    k_here = k if "scale" in pieces and not framed else 1.0
    t_here = t if "shift" in pieces and not framed else torch.zeros_like(t)
    weight = scale if "scale" in pieces else scale / k**2  # the frame's 1 / k^2
    fields: dict[str, Any] = {"input_variance": 1.0 if framed else None}
    if "entropy_off" not in pieces:
        fields["entropy_off_steps"] = 0  # on from the first step, not the recipe's quarter
    if "t0.3" in pieces:
        fields["surrogate_temperature"] = 0.3
    cfg = bae_config(
        d_in, d_sae or 2 * d_in, coefficient_scale=weight, training_steps=steps, **fields
    )
    schedule: dict[str, Any] = {}
    if "schedule" in pieces:
        schedule = {"lr_end": DEFAULT_LR / 10, "lr_warm_up_steps": steps // 20,
                    "lr_decay_steps": steps // 5}  # fmt: skip
    with _clip(pieces, k_here):
        run = train_sae(
            (train + t_here) * k_here, cfg, training_samples=steps * DEFAULT_BATCH_SIZE,
            seed=seed, record_every=max(1, steps // 100), **schedule,
        )  # fmt: skip
    fold(run.sae, k_here, t_here)
    return run


def _clip(pieces: frozenset[str], k: float) -> Any:
    """SAETrainer's clip as the piece asks: off (a no-op for this run), or on at norm 1 in the
    loss the BAE's own frame would have. States scaled here by k make the loss k^2 times the
    frame's (which reads the squared error in the inputs' units and divides the penalties by
    k^2), so the clip there is k^2."""
    if "clip" not in pieces:
        return mock.patch("torch.nn.utils.clip_grad_norm_")
    if k == 1.0:
        return nullcontext()
    clip_grad_norm = torch.nn.utils.clip_grad_norm_

    def clipped(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
        return clip_grad_norm(parameters, max_norm * k**2, *args, **kwargs)

    return mock.patch("torch.nn.utils.clip_grad_norm_", clipped)


LATE = ("reconstruction_loss", "dense", "dead", "constant")
"""History columns whose movement over the last quarter a row reports (any logged name holding
``dense`` or ``dead`` / ``constant``)."""


def late_movement(history: list[dict[str, float]]) -> dict[str, float]:
    """Each followed column's mean over the last 5% of training less its mean around 75%
    (70-75%): how far it still moved over the last quarter (relative for the loss)."""
    n = len(history)
    if n < 20:
        return {}
    at75, end = history[int(0.70 * n) : int(0.75 * n)], history[int(0.95 * n) :]
    moved: dict[str, float] = {}
    for key in history[-1]:
        if not any(word in key for word in LATE):
            continue
        before = statistics.fmean(r[key] for r in at75)
        after = statistics.fmean(r[key] for r in end)
        relative = key == "reconstruction_loss" and before != 0
        moved[key] = (after - before) / before if relative else after - before
    return moved


def train_command(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    index, count = (int(x) for x in args.worker.split("/"))
    cfg = CompareConfig(
        dataset=args.dataset, layer=args.layer, max_sequences=args.max_sequences,
        context_size=128, families=("bae",), seeds=(0,), out=args.out,
    )  # fmt: skip
    study = Study(cfg, args.out, progress=False)
    named = chosen_variants(args.variants)
    scales = [float(s) for s in args.scales.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    rows_file = args.out / f"rows-{index}.jsonl"
    done = {(r["variant"], r["scale"], r["seed"], r["steps"]) for r in read_rows(args.out)}
    for variant, seed in groups(list(named), seeds)[index::count]:
        todo = [s for s in scales if (variant, s, seed, args.steps) not in done]
        rows = [train_and_read(study, named[variant], variant, s, seed, args) for s in todo]
        if not rows:
            continue
        study.splice([r["name"] for r in rows], ("test",))  # KL, replicates beside the others
        study.rows = []
        with rows_file.open("a") as handle:
            for row in rows:  # nothing of a written run stays in memory
                row.pop("replicates")
                for held in (study.models, study.records, study.frequencies):
                    held.pop(row["name"], None)
                handle.write(json.dumps(row) + "\n")
                print(f"{row['name']}: L0 {row['l0']:.1f} EV {row['explained_variance']:.3f} "
                      f"KL {row['kl']:.3f} dense {row['dense']} constant {row['constant']} "
                      f"{row['seconds']:.0f}s", flush=True)  # fmt: skip


def train_and_read(
    study: Study, pieces: frozenset[str], variant: str, scale: float, seed: int, args: Any
) -> dict[str, Any]:
    """One run trained and read on test (its row, in ``study.rows`` for the splice)."""
    start = time.perf_counter()
    run = train_variant(pieces, study.data.train[study.data.hook], scale, seed, args.steps)
    name = f"{variant}-{scale:g}-seed{seed}"
    study.models[name] = run.sae.eval()
    row = {"name": name, "variant": variant, "scale": scale, "seed": seed, "steps": args.steps,
           "layer": args.layer, "dataset": args.dataset}  # fmt: skip
    row.update(study._read(name, "test"))
    row["late"] = late_movement(run.history)
    row["seconds"] = time.perf_counter() - start  # training and reading; the splice is shared
    study.rows.append(row)
    return row


def synthetic_command(args: argparse.Namespace) -> None:
    """The synthetic judge: every variant trained on states drawn from a saved SyntheticModel
    (one training set per seed, one scored set), scored by ``eval_sae_on_synthetic_data`` as
    ``bae bench synth-sae`` scores (MCC, F1, in the BAE's canonical form)."""
    torch.set_num_threads(1)
    from sae_lens.synthetic import SyntheticModel

    from sae_lens_bae.experiments.synth_sae_score import EvalSet, score

    if not (args.model / "synthetic_model_config.json").exists():
        sys.exit(f"{args.model} holds no saved SyntheticModel: build one with "
                 "benchmarks/recipe_study.py build")  # fmt: skip
    model = SyntheticModel.load_from_disk(args.model)
    index, count = (int(x) for x in args.worker.split("/"))
    named = chosen_variants(args.variants)
    scales = [float(s) for s in args.scales.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    scored = EvalSet.draw(model, 16_384, seed=1)
    rows_file = args.out / f"rows-{index}.jsonl"
    done = {(r["variant"], r["scale"], r["seed"], r["steps"]) for r in read_rows(args.out)}
    for variant, seed in groups(list(named), seeds)[index::count]:
        train = EvalSet.draw(model, args.samples, seed=20_000 + seed).hidden
        for scale in scales:
            if (variant, scale, seed, args.steps) in done:
                continue
            start = time.perf_counter()
            run = train_variant(named[variant], train, scale, seed, args.steps, args.d_sae)
            row = {"name": f"{variant}-{scale:g}-seed{seed}", "variant": variant,
                   "scale": scale, "seed": seed, "steps": args.steps, "d_sae": args.d_sae,
                   "model": str(args.model), **score(run.sae.eval(), scored),
                   "late": late_movement(run.history)}  # fmt: skip
            row["seconds"] = time.perf_counter() - start
            with rows_file.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
            print(f"{row['name']}: L0 {row['l0']:.2f} MCC {row['mcc']:.3f} F1 {row['f1']:.3f} "
                  f"{row['seconds']:.0f}s", flush=True)  # fmt: skip


def read_rows(out: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(out.glob("rows-*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


# ----------------------------------------------------------------------------- the verdicts

THRESHOLDS = {"explained_variance": 0.01, "kl": 0.05, "constant": 0.01, "activated": 0.05,
              "dense": 0.02, "mcc": 0.01, "f1": 0.01}  # fmt: skip
"""The smallest gap that counts (written in the record before the runs): EV absolute, KL
relative to the base's, constant and dense bits as a fraction of the code's width, activated
features relative to the base's."""
HIGHER_IS_BETTER = {"explained_variance": True, "kl": False, "constant": False,
                    "activated": True, "dense": False, "mcc": True, "f1": True}  # fmt: skip
MATCHED = {"explained_variance": "l0", "kl": "l0", "constant": "l0", "activated": "kl",
           "dense": "kl", "mcc": "l0", "f1": "l0"}  # fmt: skip
JUDGES = {"llm": ("explained_variance", "kl", "constant", "activated", "dense"),
          "synthetic": ("mcc", "f1")}  # fmt: skip
"""Each judge's metrics: LLM states (``train``) and a synthetic model (``synthetic``)."""
"""What each metric is compared at: EV, KL and constant bits at matched L0; activated features
and dense bits at matched KL."""


def curve(rows: list[dict[str, Any]], x: str, y: str) -> tuple[list[float], list[float]]:
    """``y`` against log ``x`` over a variant's scales (one seed), sorted by ``x``; a run at
    ``x`` 0 (a code with every bit constant) has no place on the log axis and is left out."""
    held = sorted((math.log(r[x]), float(r[y])) for r in rows if r[x] > 0)
    return [a for a, _ in held], [b for _, b in held]


def interpolate(xs: list[float], ys: list[float], at: float) -> float:
    for i in range(len(xs) - 1):
        x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
        if x0 <= at <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (at - x0) / (x1 - x0)
    raise ValueError("outside the curve")


def gap(base: list[dict[str, Any]], variant: list[dict[str, Any]], metric: str, width: int):
    """Per seed, the mean of (variant - base) of ``metric`` at 5 log-spaced points of their
    common range of the matched quantity (relative or per bit as ``THRESHOLDS`` reads it); None
    where the ranges do not meet."""
    x = MATCHED[metric]
    seeds = sorted({r["seed"] for r in base} & {r["seed"] for r in variant})
    curves = {}
    for seed in seeds:
        b = curve([r for r in base if r["seed"] == seed], x, metric)
        v = curve([r for r in variant if r["seed"] == seed], x, metric)
        curves[seed] = (b, v)
    if not curves:
        return None
    low = max(max(b[0][0], v[0][0]) for b, v in curves.values())
    high = min(min(b[0][-1], v[0][-1]) for b, v in curves.values())
    if low > high:
        return None
    points = [low + (high - low) * i / 4 for i in range(4)] + [high]  # high itself: no rounding
    gaps = []
    for b, v in curves.values():
        diffs = [interpolate(*v, p) - interpolate(*b, p) for p in points]
        base_mean = statistics.fmean(interpolate(*b, p) for p in points)
        value = statistics.fmean(diffs)
        if metric in ("kl", "activated"):
            value /= abs(base_mean) if base_mean else 1.0
        elif metric in ("constant", "dense"):
            value /= width
        gaps.append(value)
    return {"per_seed": gaps, "range": [math.exp(low), math.exp(high)]}


def verdict(found: dict[str, Any] | None, metric: str) -> str:
    """better / worse (the variant against its base) when every seed's gap has one sign and
    their mean is past the threshold (with one seed: its gap past the threshold); else no
    difference."""
    if found is None:
        return "no overlap"
    gaps, limit = found["per_seed"], THRESHOLDS[metric]
    mean = statistics.fmean(gaps)
    same_sign = all(g > 0 for g in gaps) or all(g < 0 for g in gaps)
    if not same_sign or abs(mean) <= limit:
        return "no difference"
    return "better" if (mean > 0) == HIGHER_IS_BETTER[metric] else "worse"


def comparisons(present: set[str] = frozenset()) -> list[tuple[str, str, str, str]]:
    """(piece, direction, variant, base): each piece off from the default (or on, where the
    default lacks it) and on from the bare BAE; then each variant of ``present`` outside the
    grid (a candidate) against ``default``."""
    outside = sorted(present - set(variants()))
    pairs = [("whole", "against default", v, "default") for v in outside]
    for piece in PIECES:
        sign = "-" if piece in DEFAULT_PIECES else "+"
        direction = "off from default" if sign == "-" else "on from default"
        pairs.append((piece, direction, f"default{sign}{piece}", "default"))
        pairs.append((piece, "on from bare", f"bare+{piece}", "bare"))
    return [*pairs[len(outside):], ("all five", "default against bare", "default", "bare"),
            *pairs[: len(outside)]]  # fmt: skip


def earns_its_place(found: dict[str, str], direction: str) -> bool:
    """Whether a comparison says the piece helps: the variant (which lacks it) worse on some
    metric and better on none, or (which has it) better on some and worse on none."""
    has_piece = not direction.startswith("off")
    helps, hurts = ("better", "worse") if has_piece else ("worse", "better")
    return helps in found.values() and hurts not in found.values()


def report_command(args: argparse.Namespace) -> None:
    rows = read_rows(args.out)
    if not rows:
        sys.exit(f"{args.out} holds no finished runs: run `train` or `synthetic` first")
    metrics = JUDGES["synthetic" if "mcc" in rows[0] else "llm"]
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_variant.setdefault(row["variant"], []).append(row)
    results = []
    for piece, direction, variant, base in comparisons(set(by_variant)):
        if variant not in by_variant or base not in by_variant:
            continue
        found, gaps = {}, {}
        for metric in metrics:
            g = gap(by_variant[base], by_variant[variant], metric, rows[0].get("d_sae", args.d_sae))
            found[metric], gaps[metric] = verdict(g, metric), g
        results.append({"piece": piece, "direction": direction, "variant": variant,
                        "base": base, "verdicts": found, "gaps": gaps,
                        "earns_its_place": earns_its_place(found, direction),
                        "worse_on_none": "worse" not in found.values()})  # fmt: skip
    summary = {"metrics": metrics, "runs": rows, "comparisons": results,
               "late": late_table(by_variant)}  # fmt: skip
    write_json(args.out / "ablation.json", summary)
    write_text(args.out / "ablation.md", markdown(summary))
    plot(by_variant, args.out / "ablation.png", metrics)


def late_table(by_variant: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per variant, the largest movement over the last quarter of each followed column."""
    table = {}
    for variant, rows in by_variant.items():
        keys = {k for r in rows for k in r.get("late", {})}
        table[variant] = {k: max((r["late"].get(k, 0.0) for r in rows), key=abs) for k in keys}
    return table


def _gap_cell(found: dict[str, Any] | None) -> str:
    if found is None:
        return "-"
    return "/".join(f"{g:+.3f}" for g in found["per_seed"])


def markdown(summary: dict[str, Any]) -> str:
    lines = ["# Ablation against the bare BAE", ""]
    columns = [
        ("piece", lambda r: r["piece"]),
        ("direction", lambda r: r["direction"]),
        ("variant vs base", lambda r: f"{r['variant']} vs {r['base']}"),
    ]
    for metric in summary["metrics"]:
        columns.append(
            (
                f"{metric} @{MATCHED[metric]}",
                lambda r, m=metric: f"{r['verdicts'][m]} ({_gap_cell(r['gaps'][m])})",
            )
        )
    columns.append(("helps", lambda r: "yes" if r["earns_its_place"] else "no"))
    columns.append(("worse on none", lambda r: "yes" if r["worse_on_none"] else "no"))
    lines.append(markdown_table(summary["comparisons"], columns))
    lines += ["", "## Runs", ""]
    run_columns = [(k, lambda r, k=k: f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]))
                   for k in dict.fromkeys(("variant", "scale", "seed", "l0", *summary["metrics"],
                                           "explained_variance", "seconds"))
                   if k in summary["runs"][0]]  # fmt: skip
    run_columns.append(
        (
            "late (loss rel., dense, dead)",
            lambda r: ", ".join(f"{k}: {v:+.3f}" for k, v in sorted(r.get("late", {}).items())),
        )
    )
    runs = sorted(summary["runs"], key=lambda r: (r["variant"], r["scale"], r["seed"]))
    lines.append(markdown_table(runs, run_columns))
    return "\n".join(lines) + "\n"


def plot(by_variant: dict[str, list[dict[str, Any]]], path: Path, metrics: tuple) -> None:
    fig, axes = subplots(1, 3, figsize=(16, 5))
    panels = (("l0", "explained_variance"), ("l0", "kl"), ("kl", "activated"))
    if "mcc" in metrics:
        panels = (("l0", "mcc"), ("l0", "f1"), ("l0", "explained_variance"))
    for ax, (x, y) in zip(axes.flat, panels, strict=True):
        for variant, rows in sorted(by_variant.items()):
            means: dict[float, list[tuple[float, float]]] = {}
            for r in rows:
                means.setdefault(r["scale"], []).append((r[x], r[y]))
            held = sorted((statistics.fmean(a for a, _ in v), statistics.fmean(b for _, b in v))
                          for v in means.values())  # fmt: skip
            style = "-" if variant.startswith("default") else "--"
            ax.plot(
                [a for a, _ in held],
                [b for _, b in held],
                style,
                marker="o",
                label=variant,
                alpha=0.8,
            )
        ax.set_xscale("log")
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=6, ncol=2)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train and read every run not yet in OUT")
    train.add_argument("--dataset", required=True, help="text file, folder or HF dataset")
    train.add_argument("--layer", type=int, default=15)
    train.add_argument("--max-sequences", type=int, default=3000)
    train.add_argument("--steps", type=int, default=600)
    train.add_argument("--scales", default="1,3.16,10", help="coefficient scales")
    train.add_argument("--seeds", default="0,1")
    train.add_argument("--variants", default="", help="a subset, comma-separated (default all)")
    train.add_argument("--worker", default="0/1", help="I/N: this process runs every Nth run")
    train.add_argument("--out", type=Path, required=True)
    synth = commands.add_parser("synthetic", help="the synthetic judge's runs into OUT")
    synth.add_argument("--model", type=Path, required=True, help="a saved SyntheticModel")
    synth.add_argument("--steps", type=int, default=12_000)
    synth.add_argument("--samples", type=int, default=500_000, help="training states a seed")
    synth.add_argument("--d-sae", type=int, default=128)
    synth.add_argument("--scales", required=True, help="coefficient scales, comma-separated")
    synth.add_argument("--seeds", default="0,1")
    synth.add_argument("--variants", default="", help="a subset, comma-separated (default all)")
    synth.add_argument("--worker", default="0/1", help="I/N: this process runs every Nth group")
    synth.add_argument("--out", type=Path, required=True)
    report = commands.add_parser("report", help="the verdicts of the runs in OUT")
    report.add_argument("out", type=Path)
    report.add_argument("--d-sae", type=int, default=1152, help="the code's width")
    args = parser.parse_args(argv)
    if args.command == "report":
        report_command(args)
        return
    index, _, count = args.worker.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        parser.error(f"--worker takes I/N with 0 <= I < N, got {args.worker!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    (train_command if args.command == "train" else synthetic_command)(args)


if __name__ == "__main__":
    main()
