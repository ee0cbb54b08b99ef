"""One cell of the position trace (a layer's hidden states at one token position) read by BAEs of
the tracing recipe at several strengths of the entropy and covariance terms: how many bits a code
spends at each reconstruction error, against the cell's ceiling log2(distinct states). The probe
behind docs/entropy.md's reading of why the LLM traces' cells are not reliable: a cell is reliable
only if some strength gives both errors <= 20% and an estimate under the ceiling.

    python benchmarks/trace_frontier.py --dataset ../shared/data/text/wikitext-2 --layer 15 \\
        --position 8 --n-sequences 16384 --multipliers 1,0.25,0.0625,0 --out DIR

A multiplier m trains with a_e and a_c at m times the recipe's (0: the ablation without them,
the most reconstruction the BAE's width allows). Writes ``DIR/trace_frontier.json`` and ``.md``
after each multiplier, so an interrupted run keeps its rows.
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from sae_lens_bae.activations import gather_states
from sae_lens_bae.data import default_corpus, document_windows, iter_texts
from sae_lens_bae.entropy import TRACING_RECIPE, estimate_entropies
from sae_lens_bae.entropy.cells import CELL_COLUMNS
from sae_lens_bae.models import load_model
from sae_lens_bae.reports import markdown_table, write_json, write_text

COLUMNS = [
    ("multiplier", lambda row: f"{row['multiplier']:g}"),
    *CELL_COLUMNS,
    ("seconds", lambda row: f"{row['seconds']:.0f}"),
]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dataset", default=None, help="default: the embedded corpus")
    parser.add_argument("--text-column", default=None)
    parser.add_argument("--layer", type=int, default=15)
    parser.add_argument("--hook", default="hook_resid_post")
    parser.add_argument("--position", type=int, default=8, help="tokens after the BOS")
    parser.add_argument("--n-sequences", type=int, default=16384)
    parser.add_argument("--multipliers", default="1,0.25,0.0625,0")
    parser.add_argument("--expansion", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument(
        "--target-variance",
        type=float,
        default=TRACING_RECIPE.target_variance,
        help="the total variance each set is scaled to (the recipe's: 0.5)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per forward pass")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("runs/trace-frontier"))
    args = parser.parse_args(argv)
    try:
        multipliers = [float(m) for m in args.multipliers.split(",")]
    except ValueError:
        parser.error(f"--multipliers takes numbers separated by commas, got {args.multipliers}")
    if any(m < 0 for m in multipliers):
        parser.error(f"--multipliers must be >= 0, got {args.multipliers}")
    args.out.mkdir(parents=True, exist_ok=True)

    model = load_model(args.model, device=args.device)
    source = args.dataset if args.dataset is not None else default_corpus()
    tokens = document_windows(iter_texts(source, text_column=args.text_column), model.tokenizer,
                              args.position, max_sequences=args.n_sequences)  # fmt: skip
    hook = f"blocks.{args.layer}.{args.hook}"
    index = torch.full((tokens.shape[0], 1), args.position)
    states, _ = gather_states(model, tokens, [hook], index, batch_size=args.batch_size)
    x = states[hook][:, 0]
    report: dict[str, Any] = {
        "info": {"model": args.model, "dataset": str(source), "hook": hook,
                 "position": args.position, "n_states": int(x.shape[0]),
                 "expansion": args.expansion, "steps": args.steps, "seed": args.seed,
                 "target_variance": args.target_variance,
                 "torch": torch.__version__, "threads": torch.get_num_threads(),
                 "machine": platform.processor() or platform.machine()},
        "rows": [],
    }  # fmt: skip
    for m in multipliers:
        recipe = replace(
            TRACING_RECIPE,
            seeds=1,
            expansion=args.expansion,
            steps=args.steps,
            target_variance=args.target_variance,
            entropy_coefficient_2048=TRACING_RECIPE.entropy_coefficient_2048 * m,
            covariance_coefficient_2048=TRACING_RECIPE.covariance_coefficient_2048 * m,
            objective=m > 0,
        )
        start = time.perf_counter()
        [estimate] = estimate_entropies([x], recipe, seeds=[args.seed], bootstrap=0,
                                        device=args.device)  # fmt: skip
        report["rows"].append({"multiplier": m, **estimate.summary(),
                               "seconds": time.perf_counter() - start})  # fmt: skip
        write_json(args.out / "trace_frontier.json", report)
        write_text(args.out / "trace_frontier.md",
                   f"# {args.model} {hook}, position {args.position}, {x.shape[0]} states, "
                   f"{args.expansion}x\n\n" + markdown_table(report["rows"], COLUMNS))  # fmt: skip
    print((args.out / "trace_frontier.md").read_text())
    return report


if __name__ == "__main__":
    main()
