"""How many states it takes to find r planted bits from a random start, for an algorithm built for
exactly that: one-unit FastICA (kurtosis) on r fair bits seen through a random rotation, which is
what a ``planted_cell`` set is once centred and whitened.

Each of ``--starts`` independent unit vectors is iterated ``--iterations`` times; a start counts as
found once its overlap with some planted direction passes ``--overlap``. The BAE that reads
these sets learns from the same higher-order statistics; docs/research/synthetic-entropy.md
compares the two walls.

    python benchmarks/planted_bits_ica.py --ranks 128 256 512 --per-rank-squared 0.25 0.5 1 2 \\
        --out runs/planted-bits-ica

Writes ``DIR/planted_bits_ica.json`` and prints a markdown table (rows: r and n = f r^2).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.reports import markdown_table, write_json


def whitened_bits(r: int, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """n states of r fair +-1 bits through a random rotation, and that rotation [r, r]."""
    rotation = torch.linalg.qr(torch.randn(r, r, generator=generator))[0]
    signs = torch.randint(0, 2, (n, r), generator=generator).float() * 2 - 1
    return signs @ rotation, rotation


def one_unit_fastica(
    z: Float[Tensor, "n r"],
    starts: Float[Tensor, "k r"],
    rotation: Float[Tensor, "r r"],
    iterations: int,
    overlap: float,
) -> list[int | None]:
    """The iteration at which each start first lies within ``overlap`` of a planted direction
    (None if never): w <- E[z (w.z)^3] - 3 w, normalised; the fixed point of a fair bit's
    kurtosis (-2), so every planted direction is one and a random one is not."""
    w = torch.nn.functional.normalize(starts, dim=1)
    found: list[int | None] = [None] * len(w)
    for step in range(iterations):
        y = z @ w.T
        w = torch.nn.functional.normalize((y.pow(3).T @ z) / len(z) - 3 * w, dim=1)
        nearest = (w @ rotation.T).abs().amax(1)
        for unit in range(len(w)):
            if found[unit] is None and nearest[unit] >= overlap:
                found[unit] = step
    return found


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--per-rank-squared", type=float, nargs="+", default=[0.25, 0.5, 1, 2])
    parser.add_argument("--starts", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--overlap", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/planted-bits-ica"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for r in args.ranks:
        for factor in args.per_rank_squared:
            generator = torch.Generator().manual_seed(args.seed)
            n = int(factor * r * r)
            start = time.perf_counter()
            z, rotation = whitened_bits(r, n, generator)
            found = one_unit_fastica(z, torch.randn(args.starts, r, generator=generator),
                                     rotation, args.iterations, args.overlap)  # fmt: skip
            hits = sorted(step for step in found if step is not None)
            rows.append({"r": r, "n": n, "per_rank_squared": factor, "found": len(hits),
                         "starts": args.starts, "first_iterations": hits,
                         "seconds": time.perf_counter() - start})  # fmt: skip
            print(f"r {r}, n {n}: {len(hits)}/{args.starts} starts found a planted bit", flush=True)
    report = {
        "info": {"iterations": args.iterations, "overlap": args.overlap, "seed": args.seed,
                 "torch": torch.__version__, "threads": torch.get_num_threads(),
                 "machine": platform.processor() or platform.machine()},
        "rows": rows,
    }  # fmt: skip
    write_json(args.out / "planted_bits_ica.json", report)
    print(markdown_table(rows, [
        ("r", lambda row: str(row["r"])),
        ("states n", lambda row: str(row["n"])),
        ("n / r^2", lambda row: f"{row['per_rank_squared']:g}"),
        ("starts that found a bit", lambda row: f"{row['found']} / {row['starts']}"),
        ("iterations (median of those)", lambda row: str(row["first_iterations"][
            len(row["first_iterations"]) // 2]) if row["first_iterations"] else "-"),
    ]))  # fmt: skip
    return report


if __name__ == "__main__":
    main()
