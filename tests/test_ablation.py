"""The ablation's harness (benchmarks/ablation.py): a frame applied to the states and folded
afterwards trains what the BAE's own frame trains, and the verdicts read gaps as the record's
rules say."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def ablation():
    spec = importlib.util.spec_from_file_location("ablation", BENCHMARKS / "ablation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _states(n: int = 4096, d: int = 16) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, 6, generator=generator) @ torch.randn(6, d, generator=generator) + 3.0


def test_a_frame_applied_outside_and_folded_trains_the_frame_of_the_bae(ablation):
    """Scale and shift applied to the states (clip off) against the config's own frame: one
    set of weights, read in the states' units, up to Adam's epsilon and rounding."""
    states = _states()
    framed = ablation.train_variant(frozenset({"scale", "shift"}), states, 1.0, 0, 60).sae
    k, t = ablation.frame_of(states)  # every row: fewer than train_sae's frame sample
    outside = ablation.train_variant(frozenset(), (states + t) * k, 1.0, 0, 60).sae
    ablation.fold(outside, k, t)
    framed.fold_input_scale()
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        torch.testing.assert_close(
            getattr(outside, name).data, getattr(framed, name).data, rtol=1e-3, atol=1e-4
        )


def test_the_clip_is_where_the_frame_of_the_bae_would_have_it(ablation):
    """States scaled here by k make the loss k^2 times the frame's: SAETrainer's clip to norm 1
    becomes a clip to k^2; off, it clips nothing; at k = 1 it is SAELens' own."""

    def clipped_norm(pieces, k):
        weight = torch.nn.Parameter(torch.zeros(4))
        weight.grad = torch.full((4,), 5.0)  # norm 10
        with ablation._clip(frozenset(pieces), k):
            torch.nn.utils.clip_grad_norm_([weight], 1.0)
        return float(weight.grad.norm())

    assert clipped_norm({"clip"}, 0.5) == pytest.approx(0.25)
    assert clipped_norm({"clip"}, 1.0) == pytest.approx(1.0)
    assert clipped_norm(set(), 0.5) == pytest.approx(10.0)


def test_fold_reads_the_untransformed_states_exactly(ablation):
    from sae_lens.saes.sae import TrainingSAE

    from sae_lens_bae import bae_config

    sae = TrainingSAE.from_dict(bae_config(16, 32, input_variance=None).to_dict())
    states = _states(64)
    k, t = 2.5, torch.linspace(-1, 1, 16)
    before_code = sae.encode_bits((states + t) * k)
    before_out = sae.decode(sae.encode((states + t) * k)) / k - t
    ablation.fold(sae, k, t)
    assert torch.equal(sae.encode_bits(states), before_code)
    torch.testing.assert_close(sae.decode(sae.encode(states)), before_out)


def test_the_variants_are_each_piece_off_the_default_and_on_the_bare_bae(ablation):
    named = ablation.variants()
    assert len(named) == 2 + 2 * len(ablation.PIECES)
    for name, pieces in named.items():
        if name.startswith("bare+"):
            assert pieces == {name[5:]}
        elif name.startswith("default"):
            assert len(pieces ^ ablation.DEFAULT_PIECES) == (name != "default")


def test_a_variant_is_named_by_its_pieces(ablation):
    assert ablation.pieces_of("bare+clip+entropy_off") == {"clip", "entropy_off"}
    assert ablation.pieces_of("default-scale-shift+schedule") == ablation.DEFAULT_PIECES - {
        "scale", "shift"} | {"schedule"}  # fmt: skip
    assert all(ablation.pieces_of(name) == pieces for name, pieces in ablation.variants().items())
    with pytest.raises(ValueError, match="unknown piece 'clips'"):
        ablation.pieces_of("bare+clips")
    with pytest.raises(ValueError, match="starts with 'default' or 'bare'"):
        ablation.pieces_of("paper+clip")


def test_a_candidate_outside_the_grid_is_read_against_default(ablation):
    pairs = ablation.comparisons({"default", "bare", "bare+clip+entropy_off"})
    assert pairs[-1] == ("whole", "against default", "bare+clip+entropy_off", "default")
    assert len(pairs) == 2 * len(ablation.PIECES) + 2


def test_a_dead_code_is_left_off_the_log_axis(ablation):
    rows = [{"l0": 0.0, "mcc": 0.6}, {"l0": 4.0, "mcc": 0.62}, {"l0": 1.0, "mcc": 0.61}]
    xs, ys = ablation.curve(rows, "l0", "mcc")
    assert xs == pytest.approx([0.0, math.log(4.0)]) and ys == [0.61, 0.62]


def test_verdicts_need_one_sign_on_every_seed_and_the_threshold(ablation):
    def rows(seed, shift):
        return [{"seed": seed, "l0": l0, "explained_variance": 0.5 + 0.1 * i + shift}
                for i, l0 in enumerate((10.0, 30.0, 100.0))]  # fmt: skip

    base = rows(0, 0.0) + rows(1, 0.0)
    better = ablation.gap(base, rows(0, 0.02) + rows(1, 0.03), "explained_variance", 100)
    assert better["per_seed"] == pytest.approx([0.02, 0.03])
    assert ablation.verdict(better, "explained_variance") == "better"
    mixed = ablation.gap(base, rows(0, 0.05) + rows(1, -0.01), "explained_variance", 100)
    assert ablation.verdict(mixed, "explained_variance") == "no difference"
    small = ablation.gap(base, rows(0, 0.005) + rows(1, 0.008), "explained_variance", 100)
    assert ablation.verdict(small, "explained_variance") == "no difference"
    alone = ablation.gap(rows(0, 0.0), rows(0, 0.05), "explained_variance", 100)
    assert ablation.verdict(alone, "explained_variance") == "better"  # one seed: the threshold
    barely = ablation.gap(rows(0, 0.0), rows(0, -0.009), "explained_variance", 100)
    assert ablation.verdict(barely, "explained_variance") == "no difference"
    far = [dict(r, l0=r["l0"] * 100) for r in rows(0, 0.0) + rows(1, 0.0)]
    assert ablation.verdict(ablation.gap(base, far, "explained_variance", 100),
                            "explained_variance") == "no overlap"  # fmt: skip
    assert ablation.earns_its_place({"kl": "worse", "dense": "no difference"}, "off from default")
    assert not ablation.earns_its_place({"kl": "worse", "dense": "better"}, "on from bare")


def test_the_synthetic_judge_trains_scores_and_reports(ablation, tmp_path):
    """Two variants at two scales and two seeds on a small saved SyntheticModel: a row per run
    with SAELens' ground-truth scores, a rerun trains nothing, and the report reads MCC and F1
    at matched L0."""
    from sae_lens.synthetic import SyntheticModel

    from sae_lens_bae.experiments.synth_sae import bench_model_config

    model_dir = tmp_path / "model"
    SyntheticModel(bench_model_config(64, 8, seed=0)).save(model_dir)
    out = tmp_path / "synthetic"
    command = ["synthetic", "--model", str(model_dir), "--steps", "8", "--samples", "4096",
               "--d-sae", "16", "--scales", "1,30", "--variants", "default,bare", "--out",
               str(out)]  # fmt: skip
    ablation.main(command)
    rows = ablation.read_rows(out)
    assert sorted((r["variant"], r["scale"], r["seed"]) for r in rows) == sorted(
        (v, s, seed) for v in ("default", "bare") for s in (1.0, 30.0) for seed in (0, 1)
    )
    assert all(0 <= r["mcc"] <= 1 and 0 <= r["f1"] <= 1 and r["d_sae"] == 16 for r in rows)
    ablation.main(command)  # resumed: every run is already there
    assert len(ablation.read_rows(out)) == 8
    ablation.main(["report", str(out)])
    summary = json.loads((out / "ablation.json").read_text())
    assert summary["metrics"] == ["mcc", "f1"]
    compared = {(c["variant"], c["base"]) for c in summary["comparisons"]}
    assert compared == {("default", "bare")}
    assert (out / "ablation.png").stat().st_size > 0
