"""The BAE's budget on LLM states (docs/research/recipe-study.md): ``bae compare``'s families at
one setting each, trained for each of several step counts on one harvested layer, each read on
test as ``bae compare`` reads its final models (dense, dead, L0, EV, activated features; KL
spliced into the model), against steps.

    python benchmarks/budget_curve.py --dataset TEXT --steps 600,2000,6000,20000 --out DIR
    python benchmarks/budget_curve.py --dataset TEXT --families bae \
        --bae-fields '{"input_variance": null}' --out DIR   # a BAE variant alone

Every budget is a run of its own (the BAE's phases are fractions of its length), all on one
harvest of the layer (``DIR/activations``); a finished budget is kept in ``DIR/curve.json``, so
a rerun goes on from the next (each budget's final models stay in ``DIR/steps-N``). Writes
``curve.json``, ``curve.md`` and ``curve.png``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from sae_lens_bae import BAETrainingSAEConfig
from sae_lens_bae.experiments.compare import CompareConfig
from sae_lens_bae.experiments.compare_study import Study
from sae_lens_bae.plots import save_figure, subplots
from sae_lens_bae.reports import cell, markdown_table, read_json, write_json, write_text
from sae_lens_bae.training.baselines import family_config

FAMILIES = ("bae", "topk", "jumprelu")
METRICS = ("dense_fraction", "dead", "l0", "explained_variance", "kl", "activated")
"""What the curve follows: each a key of ``bae compare``'s test rows (dense as a fraction)."""


def curve_rows(args: argparse.Namespace, steps: int) -> list[dict[str, Any]]:
    """Every family trained for ``steps`` steps and read on test: one row per family."""
    out = args.out / f"steps-{steps}"
    out.mkdir(parents=True, exist_ok=True)
    for shared in ("activations", "ood-activations"):  # one harvest for every budget
        (args.out / shared).mkdir(exist_ok=True)
        if not (out / shared).exists():
            (out / shared).symlink_to((args.out / shared).resolve(), target_is_directory=True)
    cfg = CompareConfig(
        dataset=args.dataset, model=args.model, layer=args.layer,
        max_sequences=args.max_sequences, context_size=args.context_size, families=args.families,
        bae_scales=(args.bae_scale,), topk_k=(args.topk_k,),
        jumprelu_coefficients=(args.jumprelu_coefficient,), seeds=(args.seed,),
        d_sae=args.d_sae, steps=steps, probe_sentences=0, ladder_extensions=0,
        device=args.device, out=out,
    )  # fmt: skip
    study = Study(cfg, out, progress=True, bae_fields=args.bae_fields)
    study.tried = {family: [args.lr] for family in args.families}
    final = study.train_grid(
        {f: cfg.settings(f) for f in args.families}, dict.fromkeys(args.families, args.lr)
    )
    study.read_final(final)
    keys = (
        "family",
        "setting",
        "lr",
        "l0",
        "dead",
        "dense",
        "explained_variance",
        "kl",
        "activated",
    )
    tokens = study.tokens()["train"]
    return [
        {"steps": steps, "tokens": tokens, **{k: row[k] for k in keys},
         "dense_fraction": row["dense"] / cfg.d_sae}
        for row in study.rows
        if row["split"] == "test"
    ]  # fmt: skip


def write(out: Path, options: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    write_json(out / "curve.json", {"options": options, "rows": rows})
    columns = [("steps", lambda r: str(r["steps"])), ("family", lambda r: r["family"])]
    columns += [
        (m, lambda r, m=m: cell(r[m], ".3f" if isinstance(r[m], float) else "")) for m in METRICS
    ]
    write_text(out / "curve.md", "# Budget curve\n\n" + markdown_table(rows, columns))
    fig, axes = subplots(2, 3, figsize=(12, 7))
    for ax, metric in zip(axes.flat, METRICS, strict=True):
        for family in dict.fromkeys(r["family"] for r in rows):
            held = sorted((r["steps"], r[metric]) for r in rows if r["family"] == family)
            ax.plot([s for s, _ in held], [v for _, v in held], marker="o", label=family)
        ax.set_xscale("log")
        ax.set_xlabel("steps")
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    save_figure(fig, out / "curve.png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, help="text file, folder or HF dataset")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--layer", type=int, default=None, help="default: the middle block")
    parser.add_argument("--steps", default="600,2000,6000,20000", help="budgets, comma-separated")
    parser.add_argument(
        "--families", default=",".join(FAMILIES), help="a subset of " + ",".join(FAMILIES)
    )
    parser.add_argument("--bae-fields", default="{}", help="BAE config fields as JSON")
    parser.add_argument("--max-sequences", type=int, default=5000)
    parser.add_argument("--context-size", type=int, default=128)
    parser.add_argument("--d-sae", type=int, default=1152)
    parser.add_argument("--lr", type=float, default=2e-3, help="every family's Adam rate")
    parser.add_argument("--bae-scale", type=float, default=0.5, help="the BAE's coefficient scale")
    parser.add_argument("--topk-k", type=int, default=64)
    parser.add_argument("--jumprelu-coefficient", type=float, default=0.125)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        budgets = sorted({int(s) for s in args.steps.split(",")})
    except ValueError:
        parser.error(f"--steps takes step counts separated by commas, got {args.steps!r}")
    if not budgets or budgets[0] < 1:
        parser.error(f"--steps must be positive, got {args.steps!r}")
    args.families = tuple(args.families.split(","))
    if not args.families or not set(args.families) <= set(FAMILIES):
        parser.error(
            f"--families takes some of {','.join(FAMILIES)}, got {','.join(args.families)}"
        )
    args.bae_fields = _bae_fields(parser, args)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "curve.json"
    options = {"families": list(args.families), "bae_fields": args.bae_fields, "lr": args.lr}
    kept = read_json(path, "a budget curve", f"delete {path}") if path.exists() else {}
    if kept and kept.get("options") != options:  # a budget of another run is not this run's
        parser.error(f"{path} holds a curve run with other options; give another --out")
    rows = kept.get("rows", [])
    for steps in budgets:
        if any(r["steps"] == steps for r in rows):
            continue
        try:
            rows += curve_rows(args, steps)
        except (ValueError, OSError) as error:  # a model, text or folder that cannot be read
            parser.error(str(error).splitlines()[0])
        write(args.out, options, rows)  # each budget kept as it finishes
    write(args.out, options, rows)


def _bae_fields(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """``--bae-fields`` read as a JSON object of ``BAETrainingSAEConfig`` fields, refused before
    the harvest if no BAE config takes them (the coefficients follow ``--bae-scale``)."""
    try:
        fields = json.loads(args.bae_fields)
    except json.JSONDecodeError:
        fields = None
    if not isinstance(fields, dict):
        parser.error(
            "--bae-fields takes a JSON object such as "
            f"'{{\"input_variance\": null}}', got {args.bae_fields!r}"
        )
    if fields and "bae" not in args.families:
        parser.error("--bae-fields needs the bae family in --families")
    unknown = sorted(set(fields) - set(BAETrainingSAEConfig.__dataclass_fields__))
    if unknown:
        parser.error(f"--bae-fields: {', '.join(unknown)} is not a BAE config field")
    owners = {"d_in": "--layer", "d_sae": "--d-sae"}  # family_config's own arguments
    for name in sorted(set(fields) & set(owners)):
        parser.error(f"--bae-fields: set {name} through {owners[name]}")
    try:
        family_config("bae", 8, 8, args.bae_scale, 1, **fields)
    except (TypeError, ValueError) as error:
        parser.error(
            f"--bae-fields: no BAE config takes {args.bae_fields} ({error})".splitlines()[0]
        )
    return fields


if __name__ == "__main__":
    main()
