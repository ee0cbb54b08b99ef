"""The comparison's rules: disjoint splits, settings chosen on validation rows only, and a
decision that needs a gap larger than the seeds' spread."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sae_lens_bae.activations import sequence_splits
from sae_lens_bae.experiments.protocol import (
    beats,
    choose_on_validation,
    rows_of_choice,
    seed_mean_and_spread,
)


@given(
    n=st.integers(3, 5000),
    fractions=st.lists(st.floats(0.01, 0.3), min_size=1, max_size=3),
)
def test_splits_never_overlap_and_cover_every_sequence(n, fractions):
    held_out = {f"split{i}": f for i, f in enumerate(fractions)}
    if n - sum(max(1, round(f * n)) for f in fractions) < 1:
        with pytest.raises(ValueError, match="leave no training sequence"):
            sequence_splits(n, held_out)
        return
    splits = sequence_splits(n, held_out)
    seen = [i for part in splits.values() for i in part]
    assert sorted(seen) == list(range(n))  # disjoint and complete
    assert list(splits) == ["train", *held_out]
    for name, fraction in held_out.items():
        assert len(splits[name]) == max(1, round(fraction * n))


def test_the_quickstart_split_is_unchanged():
    assert sequence_splits(1536, {"test": 0.1}) == {"train": range(1382), "test": range(1382, 1536)}


def _rows(test_kl_for_small_lr):
    rows = []
    for lr, validation_kl in ((1e-3, 0.20), (5e-4, 0.30)):
        for seed in (0, 1):
            rows.append({"family": "topk", "setting": "k=32", "lr": lr, "seed": seed,
                         "split": "validation", "kl": validation_kl + 0.01 * seed})  # fmt: skip
            test_kl = test_kl_for_small_lr if lr == 5e-4 else 0.25
            rows.append({"family": "topk", "setting": "k=32", "lr": lr, "seed": seed,
                         "split": "test", "kl": test_kl})  # fmt: skip
    return rows


def test_a_setting_is_chosen_from_validation_rows_only():
    """Test data that would favour the other lr changes nothing: only validation rows are read."""

    def score(row):
        assert row["split"] == "validation"
        return row["kl"]

    for test_kl in (0.9, 0.01):
        rows = _rows(test_kl)
        chosen = choose_on_validation(rows, score, group=("family", "setting"))
        assert list(chosen) == [("topk", "k=32")]
        assert chosen["topk", "k=32"]["lr"] == 1e-3 and chosen["topk", "k=32"]["seed"] == 0
        reported = rows_of_choice(rows, chosen["topk", "k=32"], "test")
        assert [(r["lr"], r["seed"]) for r in reported] == [(1e-3, 0), (1e-3, 1)]


def test_one_family_beats_another_only_by_more_than_the_seed_spread():
    assert seed_mean_and_spread([1.0, 3.0]) == (2.0, pytest.approx(2**0.5))
    assert beats([10.0, 10.2], [9.0, 9.1])  # gap 1.05 > spread 0.14
    assert beats([10.0, 12.0], [9.5, 9.6])  # gap 1.45 > spread 1.41, just
    assert not beats([10.0, 13.0], [9.5, 9.6])  # gap 1.95 < spread 2.12
    assert beats([0.10, 0.11], [0.30, 0.31], higher_is_better=False)  # a lower KL wins
    assert not beats([10.0], [1.0])  # one seed decides nothing
