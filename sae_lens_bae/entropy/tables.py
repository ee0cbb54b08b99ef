"""How a trace shows its cells: the markdown columns of a cell's estimate (and of its k-means
reference, when it has one) and the verdict in words, which cells are reliable and why the
others are not (``entropy.cells`` computes what they show)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sae_lens_bae.entropy.estimate import DEFAULT_MAX_RELATIVE_ERROR, unreliable_reasons
from sae_lens_bae.reports import cell

__all__ = ["CELL_COLUMNS", "REFERENCE_COLUMNS", "cell_columns", "reliability_note"]


CELL_COLUMNS = [
    ("bits", lambda row: cell(row["bits"], ".2f")),
    ("± seeds", lambda row: cell(row.get("bits_std"), ".2f")),
    ("ceiling", lambda row: cell(row.get("ceiling_bits"), ".2f")),
    ("excess", lambda row: cell(row.get("excess_bits"), ".2f")),
    ("relative error", lambda row: cell(row["relative_error"], ".4f")),
    ("error as trained", lambda row: cell(row.get("trained_relative_error"), ".4f")),
    ("typical error", lambda row: cell(row.get("typical_relative_error"), ".4f")),
    ("reliable", lambda row: "yes" if row.get("reliable") else "NO"),
    ("steps", lambda row: cell(row.get("steps"))),
]
"""The markdown columns of a cell's estimate, for the traces' tables."""

REFERENCE_COLUMNS = [
    ("k-means K", lambda row: cell(row.get("reference_k"))),
    ("k-means bits", lambda row: cell(row.get("reference_bits"), ".2f")),
    ("k-means joint bits", lambda row: cell(row.get("reference_joint_bits"), ".2f")),
    (
        "k-means error (typical)",
        lambda row: (
            "-"
            if row.get("reference_k") is None
            else f"{cell(row['reference_relative_error'], '.3f')} "
            f"({cell(row['reference_typical_relative_error'], '.3f')})"
        ),
    ),
    (
        "k-means reads it",
        lambda row: (
            "-"
            if row.get("reference_k") is None
            else "yes"
            if row["reference_reads_cell"]
            else "NO"
        ),
    ),
]
"""The markdown columns of a cell's k-means reference (``entropy.reference``), when it has one."""


def cell_columns(rows: Sequence[dict]) -> list:
    """``CELL_COLUMNS``, and ``REFERENCE_COLUMNS`` when some row has a reference reading."""
    with_reference = any(row.get("reference_k") is not None for row in rows)
    return [*CELL_COLUMNS, *(REFERENCE_COLUMNS if with_reference else [])]


def _reasons(row: dict) -> list[str]:
    """The rule's failed conditions of a row written before rows carried their ``reasons``."""
    return unreliable_reasons(
        row["bits"],
        row.get("ceiling_bits", float("inf")),
        row["relative_error"],
        row.get("excess_bits"),
        typical_error=row.get("typical_relative_error"),
    )


def reliability_note(rows: Sequence[dict], name: Callable[[dict], str]) -> str:
    """A trace's verdict in words: how many cells are reliable, which are not and why, and a
    warning when most are not. ``name`` says which cell a row is (e.g. "layer 15, position 4")."""
    bad = [row for row in rows if not row.get("reliable", True)]
    lines = [
        f"{len(rows) - len(bad)} of {len(rows)} cells are reliable (relative "
        f"reconstruction error <= {DEFAULT_MAX_RELATIVE_ERROR:.0%} in total and for the "
        "typical state, estimate within "
        "log2 of the number of distinct states and, where the sample resolves the codes, "
        "within 5% of their joint entropy; the code neither merging the set's states nor "
        "counting bits twice on it by more than max(0.25 bit, 3%))."
    ]
    for row in bad:
        reasons = row.get("reasons") or _reasons(row)
        lines.append(f"- unreliable: {name(row)}: {', '.join(reasons) or 'see the table'}")
    if len(bad) * 2 > len(rows):
        lines.append(
            "\nMost cells are unreliable: their BAEs do not reconstruct the states (or "
            "code them with dependent bits), so these curves are not the states' "
            "entropy. Read instead the set's own plug-in entropy (state_bits in the JSON: "
            "log2 of the states where each is distinct, the ceiling) for the entropy of "
            "these samples, and the k-means reference, where there is one, to compare cells "
            "at the rule's resolution (a rate, not an entropy). On LLM states of known "
            "entropy no BAE reading of the CPU recipe was both reliable and right (bae bench "
            "llm-truth, docs/research/llm-truth.md)."
        )
    referenced = [row for row in rows if row.get("reference_k") is not None]
    if referenced:
        readable = [row for row in referenced if row["reference_reads_cell"]]
        missed = [row for row in readable if not row.get("reliable", True)]
        lines.append(
            f"\nk-means reference: {len(readable)} of {len(referenced)} cells are read by a code "
            "with one active bit of K (the smallest K tried whose errors, in total and for "
            "the typical state, are within the rule's and whose per-bit sum is under the "
            "ceiling; its joint entropy, which that sum over-counts by at most log2 e, is in "
            "the table; entropy.reference)."
        )
        if missed:
            cells = "; ".join(name(row) for row in missed)
            lines.append(
                f"On {len(missed)} of them the BAE is not reliable: a binary code with a linear "
                f"decoder reads those cells at the rule's error, the BAE's encoder does not find "
                f"one ({cells})."
            )
        unread = [row for row in referenced if not row["reference_reads_cell"]]
        for row in unread:
            typical = row["reference_typical_relative_error"]
            lines.append(
                f"- not read by k-means either: {name(row)}: K = {row['reference_k']} (the "
                f"largest tried) leaves {row['reference_relative_error']:.2f} of the variance "
                f"({'-' if typical is None else f'{typical:.2f}'} for the typical state) at "
                f"{row['reference_bits']:.1f} bits, ceiling {row['ceiling_bits']:.1f}"
            )
        if unread:
            lines.append(
                f"On {'that cell' if len(unread) == 1 else f'those {len(unread)} cells'} no "
                "code of this kind reads the states at this sample size: more states per cell "
                "raise the ceiling (log2 of their number)."
            )
    return "\n".join(lines) + "\n"
