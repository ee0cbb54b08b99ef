"""The k-means reference beside a BAE's reading (``entropy.reference``): the smallest K whose
one-active-bit code passes the trust rule, through ``estimate_entropies``, the traces' notes
and plots."""

from __future__ import annotations

import math

import pytest
import torch

from sae_lens_bae.entropy import EntropyRecipe, estimate_entropies
from sae_lens_bae.entropy.reference import (
    kmeans,
    quantizer_reading,
    reference_reading,
    reference_sizes,
)
from sae_lens_bae.entropy.tables import cell_columns, reliability_note


def clusters(n_clusters: int = 64, per_cluster: int = 8, d: int = 16) -> torch.Tensor:
    """Tight clusters far apart: every state distinct, K = n_clusters reads them almost
    exactly, fewer centroids merge clusters."""
    generator = torch.Generator().manual_seed(0)
    centres = 10 * torch.randn(n_clusters, d, generator=generator)
    noise = 1e-3 * torch.randn(n_clusters, per_cluster, d, generator=generator)
    return (centres[:, None, :] + noise).reshape(-1, d)


def test_reference_sizes_double_up_to_the_states_over_e():
    assert reference_sizes(1022) == [16, 32, 64, 128, 256]  # 512 > 1022 / e = 376
    assert reference_sizes(16384) == [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    assert reference_sizes(8) == [8]  # fewer states than the smallest K: one per state


def test_kmeans_with_one_centroid_per_cluster_finds_the_clusters():
    x = clusters()
    centroids, assignment, _ = kmeans(x, 64)
    assert torch.bincount(assignment, minlength=64).tolist() == [8] * 64
    assert (centroids[assignment] - x).abs().max() < 0.01


def test_the_reference_stops_at_the_first_reliable_k():
    """64 clusters of 8 states: 16 and 32 centroids merge clusters (error far over 20%), 64
    read them; the one-hot code of 64 equal clusters sums 64 H_b(1/64) bits, under the ceiling
    log2 512 = 9 (the excess is not resolved: 8 states a code)."""
    x = clusters()
    reading, readings = reference_reading(x)
    assert [r.k for r in readings] == [16, 32, 64]
    assert [r.reads_cell for r in readings] == [False, False, True]
    assert [r.reliable for r in readings] == [False, False, True]  # excess unresolved: same
    assert readings[0].relative_error > 0.2 and readings[1].relative_error > 0.2
    assert reading.k == 64 and reading.relative_error < 1e-6
    expected = 64 * -(1 / 64 * math.log2(1 / 64) + 63 / 64 * math.log2(63 / 64))
    assert reading.bits == pytest.approx(expected, abs=1e-9)
    assert reading.assignment_bits == pytest.approx(6.0, abs=1e-12)
    assert reading.ceiling_bits == 9.0 and reading.excess_bits is None


def test_a_reference_that_passes_nowhere_returns_its_last_reading():
    """Full-rank Gaussian states: no K up to n / e keeps 80% of the variance under the ceiling."""
    x = torch.randn(512, 32, generator=torch.Generator().manual_seed(1))
    reading, readings = reference_reading(x)
    assert not any(r.reads_cell for r in readings)
    assert reading is readings[-1] and reading.k == 128
    one, _ = quantizer_reading(x, 128)
    assert one.bits == pytest.approx(reading.bits)  # one seed, one reading


def test_estimate_entropies_reports_the_reference_beside_an_undersized_bae():
    """An undersized, barely trained BAE misses the clustered cell that 64 centroids read: the
    summary carries both, the table adds the reference's columns and the note says the BAE, not
    the sample, falls short."""
    x = clusters()
    small = EntropyRecipe.of(expansion=1, steps=20, batch_size=128, converge=False, seeds=1)
    (cell,) = estimate_entropies([x], small, progress=False, reference=True)
    summary = cell.summary()
    assert not summary["reliable"]
    assert summary["reference_k"] == 64 and summary["reference_reads_cell"] is True
    row = {"layer": 15, **summary}
    names = [name for name, _ in cell_columns([row])]
    assert names[-5:] == ["k-means K", "k-means bits", "k-means joint bits",
                          "k-means error (typical)", "k-means reads it"]  # fmt: skip
    note = reliability_note([row], lambda r: f"layer {r['layer']}")
    assert "k-means reference: 1 of 1 cells are read by a code" in note
    assert "On 1 of them the BAE is not reliable" in note and "(layer 15)" in note
    (plain,) = estimate_entropies([x], small, progress=False)
    assert plain.summary()["reference_k"] is None
    assert [name for name, _ in cell_columns([plain.summary()])][-1] == "steps"


def test_a_one_hot_codes_resolved_over_count_does_not_stop_the_ladder():
    """64 clusters of 32 states: the sample resolves the 64 codes (32 states each), so the
    rule's excess test sees the one-hot sum over-count its joint entropy (6 bits) by
    63 log2(64/63) = 1.43 bits and calls it unreliable; it still reads the cell, and the ladder
    stops there."""
    x = clusters(per_cluster=32)
    reading, readings = reference_reading(x)
    assert [r.k for r in readings] == [16, 32, 64]
    assert reading.reads_cell and not reading.reliable
    joint = 6.0 + 63 / (2 * 2048 * math.log(2))  # plug-in and Miller-Madow
    assert reading.excess_bits == pytest.approx(63 * math.log2(64 / 63) - (joint - 6.0), abs=1e-9)


def test_the_note_gives_the_figures_of_a_cell_no_k_reads():
    rows = [
        {"layer": 15, "bits": 1.2, "relative_error": 0.01, "typical_relative_error": 0.97,
         "ceiling_bits": 9.0, "reliable": False, "reference_k": 128, "reference_bits": 7.5,
         "reference_relative_error": 0.001, "reference_typical_relative_error": 0.16,
         "reference_reads_cell": True},
        {"layer": 25, "bits": 9.0, "relative_error": 0.74, "typical_relative_error": 0.75,
         "ceiling_bits": 9.96, "reliable": False, "reference_k": 256, "reference_bits": 8.79,
         "reference_relative_error": 0.434, "reference_typical_relative_error": 0.429,
         "reference_reads_cell": False},
    ]  # fmt: skip
    note = reliability_note(rows, lambda row: f"layer {row['layer']}").splitlines()
    assert (
        note[-3] == "On 1 of them the BAE is not reliable: a binary code with a linear "
        "decoder reads those cells at the rule's error, the BAE's encoder does not find one "
        "(layer 15)."
    )
    assert (
        note[-2] == "- not read by k-means either: layer 25: K = 256 (the largest tried) "
        "leaves 0.43 of the variance (0.43 for the typical state) at 8.8 bits, ceiling 10.0"
    )
    assert note[-1].startswith("On that cell no code of this kind reads the states")
