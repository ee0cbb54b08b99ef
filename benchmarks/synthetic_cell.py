"""One synthetic cell (``directional_data``: r fair bits in d dimensions) read by BAEs trained
with several ``EntropyRecipe`` variants, one after the other in this process: the probe behind
the notes on the ``gpu`` grid (once ``paper``) in docs/research/synthetic-entropy.md, where a
d = 2048 grid does not fit a CPU but a d = 512 cell with the same failure does.

    python benchmarks/synthetic_cell.py --d 512 --r 256 --steps 40000 \\
        --variant 'preset={}' --variant 'warm-up={"lr_warm_up_steps": 1000}' --out DIR

Each variant is a name and a JSON object of ``EntropyRecipe`` fields replacing the base recipe
(expansion 2, ``--steps``, lr 4e-3, the states at their own scale as the synthetic presets train
them); ``--recipe-base long_run`` starts from ``EntropyRecipe.long_run(d)`` instead (its lr rule for
d, T, beta2, schedule and final phase; an lr given alone moves its lr_end with it), so that

    python benchmarks/synthetic_cell.py --d 2048 --r 512 --n-train 524288 --steps 45000 \\
        --recipe-base long_run --variant 'lr2.83e-3={"lr": 0.00283}' --device cuda --out DIR

is the ``gpu`` grid's cell at another lr. Writes ``DIR/synthetic_cell.json`` (every
variant's recipe and estimate, held-out error (and the error with the decoder as trained, before
the recipe's least-squares refit), the planted bits some code bit copies (``recovered_bits``),
steps used, seconds, and its minibatch entropy and reconstruction every ``--every`` steps) and
``.md``, each time a variant finishes, so an interrupted run keeps what it measured;
``--save-bae`` also keeps each trained BAE.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from sae_lens_bae.entropy import EntropyRecipe, estimate_entropies, planted_cell, recovered_bits
from sae_lens_bae.experiments.synthetic import GRIDS, passes_bar
from sae_lens_bae.reports import cell, markdown_table, write_json, write_text

COLUMNS = [
    ("variant", lambda v: v["name"]),
    ("overrides", lambda v: json.dumps(v["overrides"])),
    ("bits", lambda v: cell(v["bits"], ".1f")),
    ("relative error", lambda v: cell(v["relative_error"], ".4f")),
    ("error as trained", lambda v: cell(v.get("trained_relative_error"), ".4f")),
    ("planted bits recovered", lambda v: str(v["recovered_bits"])),
    ("steps", lambda v: str(v["steps"])),
    ("seconds", lambda v: f"{v['seconds']:.0f}"),
    ("bar (within 0.05 r, <= 2%)", lambda v: "met" if v["within_bar"] else "missed"),
]


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``name={"field": value, ...}`` -> (name, overrides), refusing unknown fields."""
    name, sep, overrides = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"a variant is NAME=JSON, got {text!r}")
    try:
        return name, EntropyRecipe.changes_from_json(overrides)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"variant {name!r}: {error}") from None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--r", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=65536)
    parser.add_argument("--n-test", type=int, default=8192)
    parser.add_argument("--expansion", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40000)
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help="base lr (default: 4e-3, or the long_run base's rule)",
    )
    parser.add_argument(
        "--recipe-base",
        choices=("plain", "long_run"),
        default="plain",
        help="plain: EntropyRecipe.of(expansion, steps, lr 4e-3); long_run: .long_run(d)",
    )
    parser.add_argument("--every", type=int, default=500, help="trajectory stride in steps")
    parser.add_argument("--variant", type=parse_variant, action="append", required=True)
    parser.add_argument("--device", default="cpu", help="where the BAEs train (cuda on a GPU)")
    parser.add_argument("--out", type=Path, default=Path("runs/synthetic-cell"))
    parser.add_argument(
        "--save-bae",
        action="store_true",
        help="also write each variant's trained BAE to DIR/NAME.pt (for probes)",
    )
    args = parser.parse_args(argv)
    fixed = {"expansion": args.expansion, "steps": args.steps}
    if args.lr is not None or args.recipe_base == "plain":
        fixed["lr"] = 4e-3 if args.lr is None else args.lr

    base = "long_run" if args.recipe_base == "long_run" else "default"  # plain: the default, fixed
    recipes = {}
    for name, overrides in args.variant:  # every recipe checked before any training
        try:
            recipes[name] = EntropyRecipe.based_on(base, args.d, **{**fixed, **overrides})
        except ValueError as error:
            parser.error(f"variant {name!r}: {error}")
    if not 0 <= args.r <= args.d:
        parser.error(f"--r {args.r} must be in [0, --d {args.d}] (r fair bits in d dimensions)")
    args.out.mkdir(parents=True, exist_ok=True)

    # the synthetic presets' seeding: data seed 1000 r + seed, the BAE's seed
    train, test, _, test_bits = planted_cell(
        args.r, args.d, args.n_train, args.n_test, 1000 * args.r + args.seed
    )

    report: dict[str, Any] = {
        "info": {"d": args.d, "r": args.r, "seed": args.seed, "n_train": args.n_train,
                 "n_test": args.n_test, "expansion": args.expansion, "steps": args.steps,
                 "lr": args.lr, "recipe_base": args.recipe_base, "torch": torch.__version__,
                 "machine": platform.processor() or platform.machine(),
                 "threads": torch.get_num_threads(),
                 "device": args.device},
        "variants": [],
    }  # fmt: skip
    for name, overrides in args.variant:
        recipe = recipes[name]
        start = time.perf_counter()
        [estimate] = estimate_entropies(
            [train],
            recipe,
            eval_sets=[test],
            seeds=[args.seed],
            normalise=False,
            device=args.device,
        )
        if args.save_bae:  # its state dict (with its input frame, if any) and the data seed
            torch.save(
                {
                    "state_dict": estimate.bae.state_dict(),
                    "cfg": estimate.bae.cfg.to_dict(),
                    "data_seed": 1000 * args.r + args.seed,
                },
                args.out / f"{name}.pt",
            )
        history = {key: values[:: args.every] for key, values in estimate.history.items()
                   if key in ("batch_entropy_bits", "reconstruction_loss")}  # fmt: skip
        row = {"r": args.r, "expansion": recipe.expansion, "objective": True,
               "estimate_bits": estimate.bits, "relative_error": estimate.relative_error,
               "reconstruction_mse": estimate.reconstruction_mse}  # fmt: skip
        # the synthetic grids' own bar, at the gpu grid's tolerance (0.05 r)
        verdict = passes_bar([row], min_seeds=1, bar=GRIDS["gpu"].tolerance)
        report["variants"].append({
            "name": name, "overrides": overrides, "recipe": recipe.record(), "bits": estimate.bits,
            "relative_error": estimate.relative_error, "steps": estimate.steps,
            "trained_relative_error": estimate.trained_relative_error,
            "recovered_bits": recovered_bits(estimate.codes(test).cpu(), test_bits),
            "seconds": time.perf_counter() - start, "within_bar": verdict["objective_ok"],
            "every": args.every, "trajectory": history,
            "restart_objectives": estimate.restart_objectives,
            "restart_bits": estimate.restart_bits,
        })  # fmt: skip
        write_json(args.out / "synthetic_cell.json", report)
        write_text(args.out / "synthetic_cell.md",
                   f"# d = {args.d}, r = {args.r}, seed {args.seed}\n\n"
                   + markdown_table(report["variants"], COLUMNS))  # fmt: skip
    print((args.out / "synthetic_cell.md").read_text())
    return report


if __name__ == "__main__":
    main()
