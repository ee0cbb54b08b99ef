"""What a BAE trained on a planted cell holds, in the planted bits' own coordinates: which bits
its code copies, how its held-out error splits between the bits it copies and those it does not,
and what the code bits nearest an uncopied planted bit mix.

A code can read r bits (the sum of its code bits' entropies) without copying the planted ones, and
a read cell can still miss the 2% error bar; this says where that error sits. It reads a BAE that
``synthetic_cell.py --save-bae`` wrote, rebuilds the cell's held-out states from the seed saved
with it and the ``synthetic_cell.json`` beside it, and writes ``NAME_probe.json`` next to the BAE:

    python benchmarks/planted_code_probe.py runs/d1024-r512-n524288-s0/n524288.pt
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.entropy.planted import RECOVERED, bit_agreement, planted_cell
from sae_lens_bae.reports import markdown_table, write_json
from sae_lens_bae.saes.bae import BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.saes.binary import step

AGREEMENT_BINS = (0.5, 0.75, 0.9, 0.95, RECOVERED, 1.0)


@torch.no_grad()
def probe_code(
    bae: BAETrainingSAE,
    states: Float[Tensor, "n d"],
    bits: Float[Tensor, "n r"],
) -> dict[str, Any]:
    """The code of ``states`` (read through the BAE's own input frame) against their planted
    0/1 ``bits`` (``states = bits @ M``, M with orthonormal rows).

    Per planted bit: the best agreement of any code bit with it (or its negation), and the
    fraction of its variance that the BAE's reconstruction loses (the residual along its
    direction of M), and where its nearest code bit's threshold sits between the pre-activation
    means of the bit's two classes (0.5 midway, 1 on the mean of the class it fires on). Per
    firing code bit (on 1-99% of the states): its encoder in the bits' coordinates, as the
    participation ratio and the share of its two largest bits."""
    if bae.cfg.bits_per_feature != 1:
        raise ValueError(
            f"the probe reads one code bit per feature; this BAE has bits_per_feature="
            f"{bae.cfg.bits_per_feature}"
        )
    states, bits = states.double(), bits.double()
    basis = torch.linalg.lstsq(bits, states).solution  # M [r, d], exact for a planted cell
    bae = copy.deepcopy(bae).double()  # the caller's BAE keeps its dtype
    pre = bae.hidden_pre(states)
    codes = step(pre)  # as ``encode_bits``, keeping the pre-activations
    recon = bae.decode(codes)
    residual = states - recon
    centred_total = float((states - states.mean(0)).pow(2).sum())
    along_bits = residual @ basis.T  # [n, r]: the residual in the bits' coordinates
    out_of_span = max(float(residual.pow(2).sum() - along_bits.pow(2).sum()), 0.0)
    bit_variance = bits.var(0, correction=0).clamp_min(1e-12)
    # a bit's squared residual, and as a fraction of its variance (its lost share)
    lost_sse = along_bits.pow(2).sum(0)
    lost = lost_sse / (len(bits) * bit_variance)
    agreement = bit_agreement(codes, bits)  # [r, n_bits]
    best, nearest = agreement.max(1)
    # where each planted bit's nearest code bit puts its threshold (pre-activation 0) between
    # the means of the bit's two classes: 0.5 is midway, 1 the mean of the class the code bit
    # fires on
    along = pre[:, nearest]  # [n, r]
    means = torch.stack([(along * (1 - bits)).sum(0) / (1 - bits).sum(0).clamp_min(1),
                         (along * bits).sum(0) / bits.sum(0).clamp_min(1)])  # fmt: skip
    low, high = means.amin(0), means.amax(0)
    threshold_position = -low / (high - low).clamp_min(1e-12)
    copied = best >= RECOVERED
    rates = codes.mean(0)
    firing = (rates >= 0.01) & (rates <= 0.99)
    # a code bit's encoder seen through M: which planted bits its pre-activation weighs
    weights = torch.nn.functional.normalize((basis @ bae.W_enc)[:, firing], dim=0).pow(2)
    participation = 1 / weights.pow(2).sum(0)
    top_two = weights.topk(min(2, len(weights)), dim=0).values.sum(0)
    copying = agreement[:, firing].amax(0) >= RECOVERED
    # the firing code bits whose heaviest planted bit is one the code does not copy
    on_uncopied = ~copied[weights.argmax(0)] if weights.numel() else torch.zeros(0, dtype=bool)
    r = bits.shape[1]

    def share(mask: Tensor) -> float:
        return float(lost_sse[mask].sum() / centred_total)

    def median(values: Tensor) -> float | None:
        return float(values.median()) if values.numel() else None

    bins = torch.tensor(AGREEMENT_BINS, dtype=torch.float64)
    histogram = torch.bucketize(best, bins[1:-1], right=True).bincount(minlength=len(bins) - 1)
    return {
        "r": r,
        "states": len(states),
        "relative_error": float(residual.pow(2).sum()) / centred_total,
        "error_from_copied_bits": share(copied),
        "error_from_uncopied_bits": share(~copied),
        "error_out_of_span": out_of_span / centred_total,
        "copied_bits": int(copied.sum()),
        "lost_fraction_copied_median": median(lost[copied]),
        "lost_fraction_uncopied_median": median(lost[~copied]),
        "threshold_position_median_copied": median(threshold_position[copied]),
        "threshold_position_median_uncopied": median(threshold_position[~copied]),
        "best_agreement_histogram": {
            f"[{lo:g}, {hi:g})": int(count)
            for lo, hi, count in zip(
                AGREEMENT_BINS[:-1], AGREEMENT_BINS[1:], histogram.tolist(), strict=True
            )
        },
        "firing_code_bits": int(firing.sum()),
        "copying_code_bits": int(copying.sum()),
        "mixing_code_bits_on_uncopied": int((~copying & on_uncopied).sum()),
        "participation_median_copying": median(participation[copying]),
        "participation_median_mixing": median(participation[~copying]),
        "top_two_share_median_mixing_on_uncopied": median(top_two[~copying & on_uncopied]),
        "lost_fraction_per_bit": lost.tolist(),
        "best_agreement_per_bit": best.tolist(),
    }


def load_probe_inputs(path: Path) -> tuple[BAETrainingSAE, Tensor, Tensor]:
    """The BAE saved by ``synthetic_cell.py --save-bae`` (its input frame in its state dict) and
    its cell's held-out states and bits, rebuilt from the saved data seed and the run's
    ``synthetic_cell.json``."""
    saved = torch.load(path, weights_only=False)
    info = json.loads((path.parent / "synthetic_cell.json").read_text())["info"]
    bae = BAETrainingSAE(BAETrainingSAEConfig.from_dict(saved["cfg"]))
    bae.load_state_dict(saved["state_dict"])
    _, test, _, test_bits = planted_cell(
        info["r"], info["d"], info["n_train"], info["n_test"], saved["data_seed"]
    )
    return bae, test, test_bits


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bae", type=Path, nargs="+", help="NAME.pt files from --save-bae")
    args = parser.parse_args(argv)
    reports = {}
    for path in args.bae:
        report = probe_code(*load_probe_inputs(path))
        write_json(path.with_name(f"{path.stem}_probe.json"), report)
        reports[str(path)] = report
    columns = [
        ("BAE", lambda row: row["path"]),
        ("error", lambda row: f"{row['relative_error']:.4f}"),
        (
            "from copied / uncopied / off-span",
            lambda row: " / ".join(
                f"{row[key]:.4f}"
                for key in (
                    "error_from_copied_bits",
                    "error_from_uncopied_bits",
                    "error_out_of_span",
                )
            ),
        ),  # fmt: skip
        ("bits copied", lambda row: f"{row['copied_bits']} of {row['r']}"),
        (
            "lost per bit, copied / uncopied (median)",
            lambda row: " / ".join(
                "-" if row[key] is None else f"{row[key]:.3f}"
                for key in ("lost_fraction_copied_median", "lost_fraction_uncopied_median")
            ),
        ),
        (
            "threshold position, copied / uncopied (median)",
            lambda row: " / ".join(
                "-" if row[key] is None else f"{row[key]:.2f}"
                for key in (
                    "threshold_position_median_copied",
                    "threshold_position_median_uncopied",
                )
            ),
        ),
        (
            "code bits firing / copying",
            lambda row: f"{row['firing_code_bits']} / {row['copying_code_bits']}",
        ),  # fmt: skip
        (
            "code bits mixing uncopied planted bits; their top-2 share",
            lambda row: (
                f"{row['mixing_code_bits_on_uncopied']}; "
                + (
                    "-"
                    if row["top_two_share_median_mixing_on_uncopied"] is None
                    else f"{row['top_two_share_median_mixing_on_uncopied']:.2f}"
                )
            ),
        ),  # fmt: skip
    ]
    rows = [{"path": path, **report} for path, report in reports.items()]
    print(markdown_table(rows, columns))
    return reports


if __name__ == "__main__":
    main()
