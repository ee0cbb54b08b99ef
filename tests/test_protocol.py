"""The comparison's rules: disjoint splits, settings chosen on validation rows only, and a
decision that needs a gap larger than the seeds' spread."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sae_lens_bae.activations import LayerActivations, held_out_splits, sequence_splits
from sae_lens_bae.experiments.compare import _bae_default
from sae_lens_bae.experiments.protocol import (
    Point,
    bracket_learning_rate,
    choose_on_validation,
    extend_ladders,
    frontier,
    frontier_verdict,
    ladder,
    ladder_shortfalls,
    rows_of_choice,
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
    points = frontier(rows, "a", "test", "x", "y")
    assert [p.setting for p in points] == [2, 1]  # sorted by x
    assert points[1][:6] == (1, 3.0, pytest.approx(2**0.5), 11.0, pytest.approx(2**0.5), 2)
    assert points[0][:6] == (2, 1.0, 0.0, 5.0, 0.0, 2)
    assert points[0].xs == ()  # rows without replicates: no bootstrap


def test_a_frontier_point_bootstraps_its_seeds_over_the_shared_sequence_replicates():
    rows = _family_rows("a", "test", [(1, 0, 2.0, 10.0), (1, 1, 4.0, 12.0)])
    rows[0]["replicates"] = {"x": [1.0, 2.0, 3.0] * 100, "y": [10.0] * 300}
    rows[1]["replicates"] = {"x": [5.0, 6.0, 7.0] * 100, "y": [12.0] * 300}
    (point,) = frontier(rows, "a", "test", "x", "y")
    # replicate b: the mean of b's values over a resample of the two seeds
    for b, x in enumerate(point.xs):
        assert x in {(1, 2, 3)[b % 3] + d for d in (0.0, 2.0, 4.0)}
        assert point.ys[b] in {10.0, 11.0, 12.0}
    assert {round(x - (1, 2, 3)[b % 3], 6) for b, x in enumerate(point.xs)} == {0.0, 2.0, 4.0}


def _points(xy, noise=0.05, x_noise=None, seed=0):
    """A frontier of hand-made points with 400 bootstrap replicates: Gaussian noise on y
    (sd ``noise``) and on x (sd ``x_noise``, default the same)."""
    rng = np.random.default_rng(seed)
    x_noise = noise if x_noise is None else x_noise
    return [
        Point(i, x, 0.0, y, 0.0, 3, tuple(x + x_noise * rng.standard_normal(400)),
              tuple(y + noise * rng.standard_normal(400)))
        for i, (x, y) in enumerate(xy)
    ]  # fmt: skip


THEIRS = [(0.0, 0.0), (5.0, 5.0), (10.0, 10.0)]  # y = x between 0 and 10


@pytest.mark.parametrize("shift, higher, expected", [
    (1.0, True, "better"), (-1.0, True, "worse"), (1.0, False, "worse"), (-1.0, False, "better"),
])  # fmt: skip
def test_a_verdict_on_many_points_reads_both_frontiers_in_both_directions(shift, higher, expected):
    ours = _points([(x, x + shift) for x in (2.0, 4.0, 6.0, 8.0)], seed=1)
    found = frontier_verdict(ours, _points(THEIRS), higher_is_better=higher)
    # the overlap [2, 8] holds our 4 points and their point at 5
    assert found["points_in_overlap"] == 5
    assert found["verdict"] == expected
    assert found["gap"] == pytest.approx(shift if higher else -shift)
    low, high = found["interval"]
    assert low < found["gap"] < high


def test_a_verdict_needs_three_points_in_the_overlap():
    theirs = _points(THEIRS)
    two = _points([(9.0, 12.0), (10.5, 13.0), (12.0, 14.0)])  # overlap [9, 10]: 9 and their 10
    assert frontier_verdict(two, theirs) == {
        "points_in_overlap": 2, "gap": None, "interval": None, "verdict": "too few points"
    }  # fmt: skip
    three = _points([(8.0, 11.0), (9.5, 12.0), (12.0, 14.0)])  # 8, 9.5 and their 10
    found = frontier_verdict(three, theirs)
    assert (found["points_in_overlap"], found["verdict"]) == (3, "better")
    # their 10 read on our frontier between 9.5 and 12: 12 + 0.5 / 2.5 * 2 = 12.4
    assert found["gap"] == pytest.approx((3.0 + 2.5 + 2.4) / 3)
    far = _points([(20.0, 0.0), (30.0, 1.0), (40.0, 2.0)])
    assert frontier_verdict(far, theirs)["verdict"] == "no overlap"
    assert frontier_verdict(far, theirs)["points_in_overlap"] == 0


def test_the_uncertainty_of_x_can_undo_a_verdict():
    ours = [(x, x + 0.5) for x in (2.0, 4.0, 6.0, 8.0)]
    assert frontier_verdict(_points(ours, x_noise=0.05), _points(THEIRS))["verdict"] == "better"
    # the same means with x known to +-1.5: their frontier, read at x, moves by as much
    found = frontier_verdict(_points(ours, x_noise=1.5), _points(THEIRS, x_noise=1.5))
    assert found["verdict"] == "no difference" and found["gap"] == pytest.approx(0.5)


def test_crossing_frontiers_make_no_difference():
    ours = _points([(2.0, 4.0), (5.0, 5.0), (8.0, 6.0)])  # above at 2, below at 8
    assert frontier_verdict(ours, _points(THEIRS))["verdict"] == "no difference"


def test_a_learning_rate_grid_is_extended_while_its_edge_wins():
    def valley(best):
        calls = []

        def score(lr):
            calls.append(lr)
            return (math.log(lr) - math.log(best)) ** 2

        return score, calls

    grid = [2.5e-4, 5e-4, 1e-3, 2e-3]
    score, calls = valley(8e-3)  # beyond the top: two more rungs, 4e-3 and 8e-3, then 1.6e-2
    chosen, tried = bracket_learning_rate(grid, score)
    assert chosen == pytest.approx(8e-3)
    assert tried == pytest.approx([2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2])
    assert tried[0] < chosen < tried[-1]  # bracketed
    score, calls = valley(1e-3)  # inside: nothing added
    assert bracket_learning_rate(grid, score) == (1e-3, grid) and len(calls) == 4
    score, _ = valley(1e-9)  # below the grid: extended at most max_extensions times
    chosen, tried = bracket_learning_rate(grid, score, max_extensions=2)
    assert tried[:2] == pytest.approx([6.25e-5, 1.25e-4]) and chosen == tried[0]
    # a diverged run (NaN objective) never wins
    nan_top = bracket_learning_rate(grid, lambda lr: math.nan if lr > 1e-3 else -lr)
    assert nan_top == (1e-3, grid)


def test_settings_climb_a_square_root_of_two_ladder():
    assert ladder(0.25, 5) == [0.25, 0.3536, 0.5, 0.7071, 1.0]
    assert ladder(16, 5, whole=True) == [16.0, 23.0, 32.0, 45.0, 64.0]


def _ladder_rows(points):
    """Validation rows, two seeds each, of {family: {setting: (kl, l0)}} (seed 1 a hair off)."""
    return [
        {"family": family, "setting": setting, "seed": seed, "split": split,
         "kl": kl + 0.001 * seed, "l0": l0 + 0.1 * seed}
        for family, settings in points.items()
        for setting, (kl, l0) in settings.items()
        for seed in (0, 1)
        for split in ("validation", "test")
    ]  # fmt: skip


def test_ladders_that_overlap_three_points_each_way_gain_no_rung():
    topk = {32: (0.5, 32), 45: (0.4, 45), 64: (0.3, 64), 91: (0.2, 91)}
    bae = {0.3536: (0.48, 35), 0.5: (0.4, 50), 0.7071: (0.3, 70), 1.0: (0.19, 95)}
    ladders = {"topk": sorted(topk), "bae": sorted(bae)}
    assert extend_ladders(_ladder_rows({"topk": topk, "bae": bae}), ladders, whole=("topk",)) == {}


def test_a_ladder_climbs_towards_the_range_it_misses_from_the_end_nearer_it():
    """JumpReLU's L0 falls as its coefficient rises and lies below the BAE's: it gains the rung
    below its smallest coefficient (the largest L0); the BAE, above JumpReLU's, the rung above
    its largest scale. On KL both span the same range, so only L0 asks."""
    jumprelu = {0.125: (0.30, 60), 0.1768: (0.35, 45), 0.25: (0.40, 33)}
    bae = {0.5: (0.30, 170), 0.7071: (0.35, 120), 1.0: (0.40, 82)}
    rows = _ladder_rows({"jumprelu": jumprelu, "bae": bae})
    ladders = {"jumprelu": sorted(jumprelu), "bae": sorted(bae)}
    assert extend_ladders(rows, ladders, axes=("kl",)) == {}
    assert extend_ladders(rows, ladders) == {"jumprelu": [0.08839], "bae": [1.414]}
    # test rows that would ask for other rungs are never read
    shifted = [  # test rows that put JumpReLU above the BAE would ask for the other rungs
        dict(r, l0=r["l0"] + 500 * (r["family"] == "jumprelu")) if r["split"] == "test" else r
        for r in rows
    ]
    assert extend_ladders(shifted, ladders) == {"jumprelu": [0.08839], "bae": [1.414]}


def test_a_range_missed_on_both_sides_widens_and_one_setting_grows_both_ways():
    """TopK's points miss the BAE's L0 range twice below and once above: the BAE's range is
    the narrow one and widens at both ends (climbing TopK past its top would move away). A
    family of one setting, whose direction is unknown, gains a rung each way."""
    topk = {16: (0.6, 16), 23: (0.5, 23), 64: (0.2, 64)}
    bae = {0.7071: (0.41, 30), 1.0: (0.39, 34), 1.414: (0.38, 36)}
    rows = _ladder_rows({"topk": topk, "bae": bae})
    ladders = {"topk": sorted(topk), "bae": sorted(bae)}
    assert extend_ladders(rows, ladders, ("l0",), ("topk",)) == {"bae": [0.5, 2.0]}
    alone = _ladder_rows({"topk": {64: (0.2, 64)}, "bae": bae})
    grown = extend_ladders(alone, {"topk": [64], "bae": sorted(bae)}, ("l0",), ("topk",))
    assert grown["topk"] == [45.0, 91.0]
    shortfalls = ladder_shortfalls(alone, ["topk", "bae"], ("l0",))
    assert {(g["family"], g["points"], g["below"], g["above"]) for g in shortfalls} == {
        ("topk", 0, 0, 1),
        ("bae", 0, 3, 0),
    }


def test_a_narrow_range_widens_and_a_short_ladder_grows_at_both_ends():
    """TopK's rungs straddle the BAE's narrow L0 range, one inside: the BAE gains a rung at
    both ends. Two TopK rungs, both inside the BAE's range, gain one at each end (whole
    numbers); a rung already on the ladder is never added."""
    topk = {16: (0.6, 16), 32: (0.4, 32), 64: (0.2, 64)}
    bae = {0.7071: (0.41, 30), 1.0: (0.39, 34), 1.414: (0.38, 36)}
    rows = _ladder_rows({"topk": topk, "bae": bae})
    ladders = {"topk": sorted(topk), "bae": sorted(bae)}
    assert extend_ladders(rows, ladders, axes=("l0",), whole=("topk",)) == {"bae": [0.5, 2.0]}
    short = {23: (0.45, 31), 32: (0.4, 33)}
    rows = _ladder_rows({"topk": short, "bae": bae})
    grown = extend_ladders(rows, {"topk": [23, 32], "bae": sorted(bae)}, ("l0",), ("topk",))
    assert grown["topk"] == [16.0, 45.0]
    tiny = _ladder_rows({"topk": {1: (0.45, 31), 2: (0.4, 33)}, "bae": bae})
    # k = 1 / sqrt(2) rounds back to 1, already on the ladder: only the rung above is added
    assert extend_ladders(tiny, {"topk": [1, 2], "bae": sorted(bae)}, ("l0",), ("topk",)) == {
        "topk": [3.0]
    }


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
    bae[0.5] = (0.75, 10, 1600)  # 1% of the latents constant: no setting meets the target
    rows = _default_rows(bae)
    assert _bae_default(rows, [r["name"] for r in rows], d_sae=1000) == 1.0


def test_family_config_takes_bae_fields_for_the_bae_family_only():
    """``bae_fields`` replace the BAE's config fields and leave the rest as the family builds
    them (the recipe's phase in the run's steps); another family given one is refused by
    name."""
    plain = family_config("bae", 64, 128, 0.5, 1600)
    variant = family_config("bae", 64, 128, 0.5, 1600, input_variance=1.0)
    assert plain.input_variance is None
    assert variant.input_variance == 1.0
    assert plain.entropy_off_steps == variant.entropy_off_steps == 400  # a quarter of the steps
    replaced = {"input_variance", "metadata"}  # metadata repeats the fields
    assert {k: v for k, v in vars(variant).items() if k not in replaced} == {
        k: v for k, v in vars(plain).items() if k not in replaced
    }
    with pytest.raises(ValueError, match="topk takes no BAE fields, got input_variance"):
        family_config("topk", 64, 128, 8, 1600, input_variance=1.0)
    with pytest.raises(ValueError, match="bae sets coefficient_scale, recipe from its setting"):
        family_config("bae", 64, 128, 0.5, 1600, recipe="paper", coefficient_scale=2.0)
    with pytest.raises(ValueError, match="bae sets covariance_coefficient from its setting"):
        family_config("bae", 64, 128, 0.5, 1600, covariance_coefficient=1e-7)


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
