"""Speed of G BAEs trained as one stacked module against G separate `train_sae` runs.

    python benchmarks/stacked_baes.py [--groups 8,32] [--d-in 64] [--steps 100]

Both sides train the same BAEs on the same data order (the test suite checks that the weights
agree); the figure is the wall-time ratio, measured in this process.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from sae_lens_bae import bae_config, train_sae
from sae_lens_bae.stacks import train_stacked_baes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="8,32")
    parser.add_argument("--d-in", type=int, default=64)
    parser.add_argument("--expansion", type=int, default=4)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    cfg = bae_config(args.d_in, args.expansion * args.d_in, training_steps=args.steps)
    samples = args.steps * args.batch
    rows = []
    for groups in (int(g) for g in args.groups.split(",")):
        sets = [torch.randn(4 * args.batch, args.d_in) for _ in range(groups)]
        start = time.perf_counter()
        for g, x in enumerate(sets):
            train_sae(
                x, cfg, training_samples=samples, batch_size=args.batch, seed=g,
                device=args.device, record_every=args.steps,
            )  # fmt: skip
        separate = time.perf_counter() - start
        start = time.perf_counter()
        train_stacked_baes(
            sets, cfg, training_samples=samples, batch_size=args.batch, device=args.device,
            progress=False,
        )  # fmt: skip
        stacked = time.perf_counter() - start
        row = {"G": groups, "separate_s": separate, "stacked_s": stacked}
        row["speedup"] = separate / stacked
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(
        f"\n| G | separate s | stacked s | speedup |  (d_in={args.d_in}, d_sae={cfg.d_sae}, "
        f"batch {args.batch}, {args.steps} steps, {args.device})\n|---|---|---|---|"
    )
    for r in rows:
        print(f"| {r['G']} | {r['separate_s']:.1f} | {r['stacked_s']:.1f} | {r['speedup']:.2f}x |")


if __name__ == "__main__":
    main()
