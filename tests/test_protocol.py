"""The comparison's rules: disjoint splits, settings chosen on validation rows only, and a
decision that needs a gap larger than the seeds' spread."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sae_lens_bae.activations import LayerActivations, held_out_splits, sequence_splits
from sae_lens_bae.experiments.compare import _bae_default
from sae_lens_bae.experiments.compare_report import verdicts
from sae_lens_bae.experiments.protocol import (
    Point,
    beats,
    choose_on_validation,
    frontier,
    frontier_verdict,
    rows_of_choice,
    seed_mean_and_spread,
)
from sae_lens_bae.training import FAMILIES, TRAINED_BASELINES, baseline_configs, family_config


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


def _held_out(n_sequences=10, per_sequence=4, held_from=6):
    """A LayerActivations whose held-out rows are sequences ``held_from``.. of ``n_sequences``."""
    positions = torch.tensor(
        [(s, t) for s in range(held_from, n_sequences) for t in range(1, per_sequence + 1)]
    )
    states = torch.arange(len(positions), dtype=torch.float32)[:, None].repeat(1, 3)
    return LayerActivations(
        hook="h", train={"h": torch.zeros(5, 3)}, test={"h": states}, scales={"h": 2.0},
        positions=positions, token_ids=positions[:, 1] + 100,
        sequences=torch.zeros(n_sequences, per_sequence + 1, dtype=torch.long), tokenizer=None,
        model="m", dataset="d", outliers_dropped=0,
    )  # fmt: skip


def test_validation_and_test_share_no_sequence_and_keep_every_held_out_row():
    data = _held_out()
    views = held_out_splits(data, ("validation", "test"))
    validation, test = views["validation"], views["test"]
    assert validation.positions[:, 0].unique().tolist() == [6, 7]
    assert test.positions[:, 0].unique().tolist() == [8, 9]
    both = torch.cat([validation.test["h"], test.test["h"]])
    assert torch.equal(both, data.test["h"])  # every row once, in order
    for view in views.values():  # each view's rows, ids and positions stay aligned
        assert torch.equal(view.token_ids, view.positions[:, 1] + 100)
        assert view.scales == data.scales and view.train is data.train
    with pytest.raises(ValueError, match="5 splits"):
        held_out_splits(_held_out(held_from=7), ("a", "b", "c", "d", "e"))


def _family_rows(family, split, points):
    """Rows of one family: (setting, seed, x, y) each."""
    return [
        {"family": family, "split": split, "setting": s, "seed": seed, "x": x, "y": y}
        for s, seed, x, y in points
    ]


def test_a_frontier_is_the_mean_and_spread_of_each_setting_over_seeds():
    rows = _family_rows("a", "test", [(1, 0, 2.0, 10.0), (1, 1, 4.0, 12.0), (2, 0, 1.0, 5.0),
                                      (2, 1, 1.0, 5.0)])  # fmt: skip
    rows += _family_rows("a", "ood", [(1, 0, 9.0, 9.0)]) + _family_rows("b", "test", [(1, 0, 0, 0)])
    points = frontier(rows, "a", "test", lambda r: r["x"], lambda r: r["y"])
    assert [p.setting for p in points] == [2, 1]  # sorted by x
    assert points[1] == Point(1, 3.0, pytest.approx(2**0.5), 11.0, pytest.approx(2**0.5), 2)
    assert points[0] == Point(2, 1.0, 0.0, 5.0, 0.0, 2)


def _points(*xy_spread):
    return [Point(i, x, 0.0, y, spread, 2) for i, (x, y, spread) in enumerate(xy_spread)]


def test_a_verdict_reads_the_other_frontier_at_the_same_x_and_needs_more_than_the_spread():
    theirs = _points((0.0, 0.0, 0.1), (10.0, 10.0, 0.1))  # y = x between 0 and 10
    assert frontier_verdict(_points((5.0, 6.0, 0.5)), theirs) == "better"  # 6 > 5 + 0.5
    assert frontier_verdict(_points((5.0, 5.4, 0.5)), theirs) == "no difference"
    assert frontier_verdict(_points((5.0, 4.0, 0.5)), theirs) == "worse"
    assert frontier_verdict(_points((5.0, 4.0, 0.5)), theirs, higher_is_better=False) == "better"
    # a point outside their x range is not compared; none inside: no overlap
    assert frontier_verdict(_points((5.0, 6.0, 0.5), (20.0, 0.0, 0.1)), theirs) == "better"
    assert frontier_verdict(_points((20.0, 0.0, 0.1)), theirs) == "no overlap"
    # better at one point and worse at another: no difference
    assert frontier_verdict(_points((2.0, 4.0, 0.1), (8.0, 6.0, 0.1)), theirs) == "no difference"
    one_seed = [Point(0, 5.0, 0.0, 9.0, 0.0, 1)]
    assert frontier_verdict(one_seed, theirs) == "one seed"


def test_a_verdict_holds_only_where_test_and_ood_agree():
    rows = []
    for split, bae_activated in (("test", 900), ("ood", 500)):
        for seed, wiggle in ((0, 0), (1, 4)):
            rows += [
                {"family": "bae", "split": split, "setting": 1.0, "seed": seed, "kl": 0.3,
                 "activated": bae_activated + wiggle},
                {"family": "topk", "split": split, "setting": 16, "seed": seed, "kl": 0.1,
                 "activated": 600 + wiggle},
                {"family": "topk", "split": split, "setting": 8, "seed": seed, "kl": 0.5,
                 "activated": 600 + wiggle},
            ]  # fmt: skip
    for row in rows:  # the other checks' columns
        row.update(l0_rare=10.0, explained_variance=0.5, probe_accuracy=None, activated_strict=1)
    found = {v["metric"]: v for v in verdicts(rows, ["bae", "topk"]) if v["against"] == "topk"}
    assert found["activated at matched KL"]["test"] == "better"
    assert found["activated at matched KL"]["ood"] == "worse"
    assert found["activated at matched KL"]["verdict"] == "split"


def _default_rows(bae, topk_ev=0.70, test_activated=0):
    """Validation rows (two seeds) of BAE settings {setting: (EV, constant, activated)} and of
    TopK at k = 15 and 64, with test rows that would favour another choice."""
    made = []
    points = {("bae", s): v for s, v in bae.items()}
    points[("topk", 15)], points[("topk", 64)] = (topk_ev, 0, 900), (0.9, 0, 500)
    for (family, setting), (ev, constant, activated) in points.items():
        for seed in (0, 1):
            for split, value in (("validation", activated), ("test", test_activated)):
                made.append({"name": f"{family}-{setting}-{seed}", "family": family,
                             "setting": setting, "seed": seed, "split": split,
                             "explained_variance": ev + 0.001 * seed, "constant": constant,
                             "activated": value + seed})  # fmt: skip
    return made


def test_the_bae_default_meets_the_feature_target_on_validation_rows_only():
    bae = {0.5: (0.75, 2, 1600), 1.0: (0.69, 2, 1900), 2.0: (0.10, 15, 2000)}
    for test_activated in (0, 5000):  # test rows never move the choice
        rows = _default_rows(bae, test_activated=test_activated)
        names = [r["name"] for r in rows]
        # 2.0: EV far below TopK-15's; 1.0: EV 0.69 >= 0.70 - 0.02 and more activated than 0.5
        assert _bae_default(rows, names, d_sae=1000) == 1.0
    bae[1.0] = (0.67, 2, 1900)  # now more than 0.02 below TopK-15
    rows = _default_rows(bae)
    assert _bae_default(rows, [r["name"] for r in rows], d_sae=1000) == 0.5
    bae[0.5] = (0.75, 10, 1600)  # 1% of the channels constant: no setting meets the target
    rows = _default_rows(bae)
    assert _bae_default(rows, [r["name"] for r in rows], d_sae=1000) == 1.0


def test_every_named_baseline_is_a_family_of_the_comparison_with_its_remedy():
    """``baseline_configs`` (the steering benchmark's SAEs) builds each named baseline as the
    comparison builds that family, so it trains with the family's dead-latent remedy, and at
    SAELens' own default k and L0 coefficient (the paper's k = 15 for ``topk15``)."""
    configs = baseline_configs(64, 2, list(TRAINED_BASELINES), steps=1600)
    assert list(configs) == list(TRAINED_BASELINES)
    for name, cfg in configs.items():
        family, setting = TRAINED_BASELINES[name]
        assert cfg == family_config(family, 64, 128, setting, 1600)
        if family in ("topk", "batchtopk", "jumprelu") and name != "topk15":
            default = type(cfg)(d_in=64, d_sae=128)
            assert getattr(cfg, FAMILIES[family]) == getattr(default, FAMILIES[family])
    assert configs["topk15"].k == 15
    assert configs["jumprelu"].pre_act_loss_coefficient > 0  # SAELens leaves it off
    with pytest.raises(ValueError, match="Unknown baselines"):
        baseline_configs(64, 2, ["transcoder"], steps=1600)
