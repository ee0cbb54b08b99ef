"""Entropy of held-out fair-bit sets made outside the synthetic presets' generator, read through
both paths a user takes: ``estimate_entropies`` with its default ``EntropyRecipe``, and a BAE of
the registry's ``entropy`` recipe trained by SAELens' ``SAETrainer`` (``train_sae``), then
``code_entropy``. The check behind docs/research/heldout-sets.md's held-out tables: defaults
that are right on sets no recipe was tuned on, whatever their scale and wherever they sit.

    python benchmarks/heldout_entropy.py --cases 16:3,32:6,48:12 --shifts 0,10 --out DIR

A case ``d:r`` is x = b W + o: b uniform on {0,1}^r, W an r x d Gaussian matrix (its bit
directions are not orthonormal, unlike ``directional_data``), o a Gaussian offset of scale 0.5;
``--n-train`` training and ``--n-test`` held-out states. The recipe path trains with the default
``EntropyRecipe`` or, with ``--recipe-base long_run``, ``EntropyRecipe.long_run(d)``; ``--recipe
'{"lr": 2e-3}'`` changes its fields. A shift s moves every state by s times the
set's root mean squared norm along a random direction (entropy does not change). Writes
``DIR/heldout_entropy.json`` and ``.md`` after each row, so an interrupted run keeps its rows.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sae_lens_bae.entropy import EntropyRecipe, code_entropy, estimate_entropies, recovered_bits
from sae_lens_bae.reports import cell, markdown_table, write_json, write_text
from sae_lens_bae.saes.bae_recipes import BAE_RECIPES, bae_config
from sae_lens_bae.training import train_sae

COLUMNS = [
    ("path", lambda row: row["path"]),
    ("d", lambda row: str(row["d"])),
    ("r", lambda row: str(row["r"])),
    ("seed", lambda row: str(row["seed"])),
    ("shift", lambda row: f"{row['shift']:g}"),
    ("bits", lambda row: cell(row["bits"], ".2f")),
    ("relative error", lambda row: cell(row["relative_error"], ".4f")),
    ("typical error", lambda row: cell(row["typical_relative_error"], ".4f")),
    ("reliable", lambda row: "yes" if row["reliable"] else "no"),
    ("planted bits copied", lambda row: cell(row.get("recovered_bits"), "d")),
    ("repaired", lambda row: cell(row.get("knocked_out_bits"), "")),
    ("steps", lambda row: str(row["steps"])),
    ("repair steps", lambda row: str(row.get("repair_steps", 0))),
    ("seconds", lambda row: f"{row['seconds']:.0f}"),
]


def fair_bit_set(
    d: int, r: int, n_train: int, n_test: int, seed: int, shift: float
) -> tuple[Tensor, Tensor]:
    """Training and held-out states x = b W + o (+ a shift), r fair bits in d dimensions."""
    train, test, _ = planted_fair_bit_set(d, r, n_train, n_test, seed, shift)
    return train, test


def planted_fair_bit_set(
    d: int, r: int, n_train: int, n_test: int, seed: int, shift: float
) -> tuple[Tensor, Tensor, Tensor]:
    """``fair_bit_set`` and the held-out states' planted bits b (to count those a code copies)."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(r, d, generator=generator)
    offset = 0.5 * torch.randn(d, generator=generator)
    bits = torch.randint(0, 2, (n_train + n_test, r), generator=generator).float()
    states = bits @ weights + offset
    direction = torch.randn(d, generator=generator)
    rms = states.pow(2).sum(-1).mean().sqrt()
    states = states + shift * rms * direction / direction.norm()
    return states[:n_train], states[n_train:], bits[n_train:]


def parse_cases(text: str) -> list[tuple[int, int]]:
    """``d:r,d:r`` -> [(d, r), ...], refusing r > d or non-positive sizes."""
    cases = []
    for item in text.split(","):
        d, sep, r = item.partition(":")
        if not sep or not d.isdigit() or not r.isdigit() or not 0 < int(r) <= int(d):
            raise argparse.ArgumentTypeError(f"a case is d:r with 0 < r <= d, got {item!r}")
        cases.append((int(d), int(r)))
    return cases


def parse_recipe(text: str) -> dict[str, Any]:
    """A JSON object of ``EntropyRecipe`` fields (the recipe path's changes), refusing others."""
    try:
        return EntropyRecipe.changes_from_json(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--recipe: {error}") from None


def recipe_for(d: int, base: str, steps: int | None, overrides: dict[str, Any]) -> EntropyRecipe:
    """The recipe path's ``EntropyRecipe`` for sets of dimension ``d``."""
    changes = {**({} if steps is None else {"steps": steps}), **overrides}
    return EntropyRecipe.based_on(base, d, **changes)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=parse_cases, default=parse_cases("16:3,32:6,48:12"))
    parser.add_argument("--seeds", default="0", help="comma-separated data and BAE seeds")
    parser.add_argument("--shifts", default="0", help="comma-separated shifts (x rms norm)")
    parser.add_argument("--paths", default="recipe,registry", help="recipe and/or registry")
    parser.add_argument("--n-train", type=int, default=8192)
    parser.add_argument("--n-test", type=int, default=4096)
    parser.add_argument(
        "--recipe-base",
        choices=("default", "long_run"),
        default="default",
        help="EntropyRecipe() or EntropyRecipe.long_run(d) for the recipe path",
    )
    parser.add_argument(
        "--recipe-steps",
        type=int,
        default=None,
        help="the recipe path's step budget (default: its base recipe's)",
    )
    parser.add_argument(
        "--recipe",
        type=parse_recipe,
        default={},
        help="JSON object of EntropyRecipe fields for the recipe path",
    )
    parser.add_argument("--registry-steps", type=int, default=16000)
    parser.add_argument("--out", type=Path, default=Path("runs/heldout-entropy"))
    args = parser.parse_args(argv)
    paths = args.paths.split(",")
    if set(paths) - {"recipe", "registry"}:
        parser.error(f"--paths takes recipe and/or registry, got {args.paths!r}")
    try:  # every case's recipe before any training: a bad field fails now, in one line
        recipes = {d: recipe_for(d, args.recipe_base, args.recipe_steps, args.recipe)
                   for d, _ in args.cases}  # fmt: skip
    except ValueError as error:
        parser.error(f"--recipe: {error}")
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "info": {"n_train": args.n_train, "n_test": args.n_test,
                 "recipe_base": args.recipe_base, "recipe_steps": args.recipe_steps,
                 "recipe": args.recipe,
                 "registry_steps": args.registry_steps,
                 "torch": torch.__version__, "threads": torch.get_num_threads(),
                 "machine": platform.processor() or platform.machine()},
        "rows": [],
    }  # fmt: skip
    for d, r in args.cases:
        for seed in (int(s) for s in args.seeds.split(",")):
            for shift in (float(s) for s in args.shifts.split(",")):
                train, test, test_bits = planted_fair_bit_set(d, r, args.n_train, args.n_test,
                                                              seed, shift)  # fmt: skip
                for path in paths:
                    start = time.perf_counter()
                    if path == "recipe":
                        [estimate] = estimate_entropies([train], recipes[d], eval_sets=[test],
                                                        seeds=[seed], progress=False)  # fmt: skip
                        steps, repaired = estimate.steps, estimate.knocked_out_bits
                        repair_steps = estimate.repair_steps
                        copied = recovered_bits(estimate.codes(test).cpu(), test_bits)
                    else:
                        steps, repaired, repair_steps = args.registry_steps, None, 0
                        cfg = bae_config(d, recipe="entropy", training_steps=steps)
                        run = train_sae(train, cfg, training_samples=steps * 512, batch_size=512,
                                        lr=BAE_RECIPES["entropy"].lr, seed=seed)  # fmt: skip
                        bae = run.sae.eval()
                        estimate = code_entropy(bae, test)
                        with torch.no_grad():
                            copied = recovered_bits(bae.encode_bits(test).cpu(), test_bits)
                    report["rows"].append({
                        "path": path, "d": d, "r": r, "seed": seed, "shift": shift,
                        "bits": estimate.bits, "relative_error": estimate.relative_error,
                        "typical_relative_error": estimate.typical_relative_error,
                        "reliable": estimate.reliable, "steps": steps, "recovered_bits": copied,
                        "knocked_out_bits": repaired, "repair_steps": repair_steps,
                        "seconds": time.perf_counter() - start,
                    })  # fmt: skip
                    write_json(args.out / "heldout_entropy.json", report)
                    write_text(args.out / "heldout_entropy.md",
                               markdown_table(report["rows"], COLUMNS))  # fmt: skip
    print((args.out / "heldout_entropy.md").read_text())
    return report


if __name__ == "__main__":
    main()
