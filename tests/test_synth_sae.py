"""``bae bench synth-sae``: the BAE in SAELens' synthetic runner, its canonical scoring, the
binary ceiling, the convergence rule, the verdicts, the entropy cells and a whole tiny run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from sae_lens import BatchTopKTrainingSAEConfig, LoggingConfig
from sae_lens.synthetic import (
    SyntheticModel,
    SyntheticModelConfig,
    SyntheticSAERunner,
    SyntheticSAERunnerConfig,
    eval_sae_on_synthetic_data,
)

from sae_lens_bae import BAE, BAEConfig, BAETrainingSAE, BAETrainingSAEConfig, bae_config
from sae_lens_bae.entropy import TRACING_RECIPE
from sae_lens_bae.experiments import synth_sae
from sae_lens_bae.experiments.synth_entropy import cell_model, entropy_rows, within_tolerance
from sae_lens_bae.experiments.synth_sae_report import verdicts
from sae_lens_bae.experiments.synth_sae_score import (
    EvalSet,
    _Replay,
    binary_ceiling,
    converged,
    score,
    target_l0,
)


def _tiny_model(features: int = 4, hidden: int = 4, seed: int = 0) -> SyntheticModel:
    return SyntheticModel(
        SyntheticModelConfig(num_features=features, hidden_dim=hidden, bias=False, seed=seed)
    )


def _runner_config(sae_cfg, model: SyntheticModel, tmp_path) -> SyntheticSAERunnerConfig:
    return SyntheticSAERunnerConfig(
        synthetic_model=model.cfg, sae=sae_cfg, training_samples=12 * 64, batch_size=64,
        lr=1e-3, eval_samples=256, output_path=str(tmp_path / sae_cfg.architecture()),
        checkpoint_path=None, logger=LoggingConfig(log_to_wandb=False),
    )  # fmt: skip


@pytest.mark.parametrize("family", ["bae", "bae recipe", "batchtopk"])
def test_synthetic_runner_trains_the_bae_as_it_trains_batchtopk(family, tmp_path, phases_applied):
    """SAELens' SyntheticSAERunner trains a BAE config with nothing else called and scores it by
    its own evaluation, as it does a BatchTopK config: a bare config with both terms on from the
    first step, the default recipe's with the entropy term off for its first quarter (3 of the
    runner's 12 steps)."""
    model = _tiny_model(features=16, hidden=8)
    sae_cfg = {
        "bae": lambda: BAETrainingSAEConfig(d_in=8, d_sae=16),
        "bae recipe": lambda: bae_config(8, 16, training_steps=12),
        "batchtopk": lambda: BatchTopKTrainingSAEConfig(d_in=8, d_sae=16, k=2),
    }[family]()
    config = _runner_config(sae_cfg, model, tmp_path)
    result = SyntheticSAERunner(config, override_synthetic_model=model).run()
    assert result.final_eval is not None and 0 <= result.final_eval.mcc <= 1
    entropy_off = {"bae": 0, "bae recipe": 3, "batchtopk": None}[family]
    if entropy_off is None:
        assert phases_applied == []
    else:
        assert config.total_training_steps == 12
        assert result.sae.cfg.entropy_off_steps == entropy_off
        assert phases_applied.phases() == [(n, n >= entropy_off, True) for n in range(12)]


def _hand_made_bae(p0: float, p1: float) -> BAE:
    """Bit 0 detects feature 0 (x_0 >= 1/2); bit 1 is a flipped detector of feature 1: on while
    feature 1 is off, with a decoder row -e1 and b_dec = e1, so the decode is exactly
    x_0 e0 + x_1 e1 for unit magnitudes."""
    bae = BAE(BAEConfig(d_in=4, d_sae=2))
    with torch.no_grad():
        bae.W_enc.zero_()
        bae.W_enc[0, 0], bae.W_enc[1, 1] = 1.0, -1.0
        bae.b_enc.copy_(torch.tensor([-0.5, 0.5]))
        bae.W_dec.zero_()
        bae.W_dec[0, 0], bae.W_dec[1, 1] = 1.0, -1.0
        bae.b_dec.copy_(torch.tensor([0.0, 1.0, 0.0, 0.0]))
        bae.code_mean.copy_(torch.tensor([p0, 1.0 - p1]))
    return bae


def test_canonical_form_keeps_ev_and_mcc_and_fixes_a_flipped_detectors_precision():
    """Scoring reads a BAE canonically: a bit on for most samples is flipped. EV and MCC (|cos|
    of decoder rows) are exactly those of the raw BAE; the flipped detector's precision goes
    from 0 (it fires only where its feature is off) to 1, as counted by hand."""
    model = _tiny_model()
    with torch.no_grad():
        model.feature_dict.feature_vectors.copy_(torch.eye(4))
    data = EvalSet.draw(model, 4096, seed=0)
    active = data.feature_acts > 0
    p0, p1 = (float(active[:, i].float().mean()) for i in (0, 1))
    assert 1 - p1 > 0.5  # the flipped bit is on for most samples: canonicalising flips it
    bae = _hand_made_bae(p0, p1)
    scored = score(bae, data)
    raw = eval_sae_on_synthetic_data(
        bae, model.feature_dict, _Replay(data.feature_acts), num_samples=4096, batch_size=4096
    )
    assert scored["explained_variance"] == raw.explained_variance
    assert scored["mcc"] == raw.mcc
    fired = bae.encode(data.hidden)[:, 1] != 0  # the raw bit 1: on where feature 1 is off
    raw_precision_1 = float((fired & active[:, 1]).sum() / fired.sum())
    assert raw_precision_1 == 0.0
    precision_0 = float(active[:, 0].sum() / active[:, 0].sum())  # bit 0 is feature 0 itself
    assert raw.classification.precision == pytest.approx((precision_0 + raw_precision_1) / 2)
    assert scored["precision"] == pytest.approx(1.0)
    assert scored["recall"] == pytest.approx(1.0) and scored["f1"] == pytest.approx(1.0)
    assert scored["l0"] == pytest.approx(p0 + p1, abs=1e-6)  # the canonical code is the support


def test_binary_ceiling_is_exact_for_a_code_of_every_feature_and_partial_below():
    """A code of all the features' support with least-squares rows reconstructs a
    constant-magnitude model exactly (EV 1); a narrower code explains less."""
    model = _tiny_model(features=6, hidden=4)
    fit, test = EvalSet.draw(model, 4096, seed=1), EvalSet.draw(model, 4096, seed=2)
    assert binary_ceiling(fit, test, width=6) == pytest.approx(1.0, abs=1e-6)
    assert binary_ceiling(fit, test, width=2) < 0.99
    # rank-deficient least squares (rare features, exclusive children summing to their
    # parent, constant magnitudes) is still exact
    tree = cell_model(64, 2, hierarchy=True, seed=0)
    fit_tree, test_tree = EvalSet.draw(tree, 4096, seed=1), EvalSet.draw(tree, 4096, seed=2)
    assert binary_ceiling(fit_tree, fit_tree, width=64) == pytest.approx(1.0, abs=1e-9)
    assert binary_ceiling(fit_tree, test_tree, width=64) > 0.99  # features fit never saw
    expected = float((test.feature_acts > 0).float().sum(-1).mean())
    assert target_l0(test.feature_acts, 6) == pytest.approx(expected)


def test_convergence_reads_the_last_quarter():
    history = [{"step": s, "mcc": m, "f1": f} for s, m, f in
               [(25, 0.2, 0.1), (50, 0.5, 0.3), (75, 0.70, 0.50), (100, 0.705, 0.509)]]  # fmt: skip
    assert converged(history)
    history[-1]["f1"] = 0.511  # moved 0.011 since step 75
    assert not converged(history)
    assert not converged(history[:1])


def _row(family, setting, seed, l0, mcc):
    return {"family": family, "setting": setting, "seed": seed, "split": "test", "l0": l0,
            "mcc": mcc, "f1": mcc, "dead": 0, "dense": 0}  # fmt: skip


def test_verdicts_resample_seeds_at_matched_l0():
    """A BAE frontier above the other's by 0.1 at every seed is better on MCC; the same gap with
    seeds that disagree in sign decides nothing."""
    rows = [
        _row(family, setting, seed, l0=setting, mcc=0.5 + 0.01 * setting + (0.1 if b else 0))
        for family, b in (("bae", True), ("batchtopk", False))
        for setting in (2.0, 4.0, 6.0)
        for seed in (0, 1, 2)
    ]
    found = verdicts(rows, ["bae", "batchtopk"])
    assert found["batchtopk.mcc"]["verdict"] == "better"
    assert found["batchtopk.mcc"]["gap"] == pytest.approx(0.1)
    assert found["batchtopk.dead"]["verdict"] == "no difference"
    noisy = [{**r, "mcc": r["mcc"] + (0.4 if r["seed"] == 0 else -0.3)} if r["family"] == "bae"
             else r for r in rows]  # fmt: skip
    assert verdicts(noisy, ["bae", "batchtopk"])["batchtopk.mcc"]["verdict"] == "no difference"


def test_entropy_cells_hold_the_exact_truth_beside_the_reading():
    rows = entropy_rows(
        cells=[(16, 2, False), (16, 2, True), (16, 4, False)],  # two widths: two stacks
        samples=2048,
        recipe=TRACING_RECIPE.changed(expansion=4, seeds=1, steps=200),
    )
    assert [r["cell"] for r in rows] == ["16f/8d", "16f/8d hierarchy", "16f/4d"]
    for row in rows:
        assert row["truth_bits"] > 0 and row["bits"] >= 0
        assert row["within_tolerance"] == within_tolerance(row["bits"], row["truth_bits"])
    assert rows[1]["truth_bits"] < rows[0]["truth_bits"]  # the hierarchy gates children
    assert within_tolerance(10.2, 10.0) and not within_tolerance(10.4, 10.0)
    assert within_tolerance(103.0, 100.0) and not within_tolerance(103.5, 100.0)


def test_a_tiny_bench_run_writes_its_outputs_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SAE_LENS_BAE_CACHE", str(tmp_path / "cache"))
    cfg = synth_sae.SynthSAEConfig(
        preset="test", families=("bae", "batchtopk"), seeds=(0,), entropy=False, workers=1,
        out=tmp_path / "out",
    )  # fmt: skip
    summary = synth_sae.run(cfg)
    rows = summary["rows"]
    assert {(r["family"], r["setting"]) for r in rows} == {
        (f, s) for f in ("bae", "batchtopk") for s in (0.5, 1.0, 2.0)
    }
    keys = {"family", "setting", "seed", "l0", "mcc", "uniqueness", "f1", "precision", "recall"}
    keys |= {"dead", "dense", "explained_variance", "ev_ceiling", "shrinkage", "converged"}
    assert all(keys <= set(r) for r in rows)
    assert all([h["step"] for h in r["history"]] == [16, 32, 48, 64] for r in rows)
    held = json.loads((tmp_path / "out" / "synth.json").read_text())
    assert set(held) == {"model", "rows", "verdicts", "entropy_rows"}
    assert held["model"]["config"]["num_features"] == 128
    assert (tmp_path / "out" / "synth.png").stat().st_size > 0
    assert "| bae | 0.5 |" in (tmp_path / "out" / "synth.md").read_text()
    again = synth_sae.run(cfg)
    assert "1 of 1 jobs kept" in capsys.readouterr().out
    assert [r["mcc"] for r in again["rows"]] == [r["mcc"] for r in rows]


def test_a_bae_variant_trains_on_the_same_stream_and_is_judged_against_the_bae(
    tmp_path, monkeypatch
):
    """A recipe variant is the family ``bae:NAME`` at the BAE's settings, its fields replacing
    the BAE's (``d_sae`` its width), trained beside the BAE on its stream; verdicts read it
    against the BAE."""
    monkeypatch.setenv("SAE_LENS_BAE_CACHE", str(tmp_path / "cache"))
    built = {}
    make = synth_sae._training_saes

    def keep(configs, names, device):
        built.update({names[key]: config for key, config in configs.items()})
        return make(configs, names, device)

    monkeypatch.setattr(synth_sae, "_training_saes", keep)
    cfg = synth_sae.SynthSAEConfig(preset="test", families=("bae",), seeds=(0,), entropy=False)
    fields = {"d_sae": 64, "covariance_coefficient": 5e-7}
    variants = {
        "sharp": synth_sae.Variant({"surrogate_temperature": 0.3}),
        "wide": synth_sae.Variant(fields),
        "strong": synth_sae.Variant({}, settings=(4.0, 8.0)),
    }
    result = synth_sae.train_seed(cfg, 0, variants=variants)
    settings = (0.5, 1.0, 2.0)
    rows = {(r["family"], r["setting"]): r for r in result["rows"]}
    expected = {(f, s) for f in ("bae", "bae:sharp", "bae:wide") for s in settings}
    assert set(rows) == expected | {("bae:strong", 4.0), ("bae:strong", 8.0)}
    assert built["bae:strong@8.0"].entropy_coefficient == 8 * built["bae@1.0"].entropy_coefficient
    for s in settings:
        bae, sharp, wide = (built[f"{f}@{s}"] for f in ("bae", "bae:sharp", "bae:wide"))
        temperatures = (bae.surrogate_temperature, sharp.surrogate_temperature)
        assert temperatures == (wide.surrogate_temperature, 0.3) and temperatures[0] != 0.3
        assert sharp.entropy_coefficient == bae.entropy_coefficient == wide.entropy_coefficient
        assert (bae.d_sae, wide.d_sae) == (32, 64)
        assert wide.covariance_coefficient == pytest.approx(5e-7 * s)  # scaled like a recipe's
        assert rows["bae:wide", s]["ev_ceiling"] > rows["bae", s]["ev_ceiling"]  # its own width
    twins = [{**r, "family": "bae:twin"} for r in result["rows"] if r["family"] == "bae"]
    found = verdicts([*result["rows"], *twins], ["bae"], ours="bae:twin")
    assert found["bae.mcc"]["gap"] == pytest.approx(0.0, abs=1e-12)
    assert found["bae.mcc"]["verdict"] == "no difference"


def test_bad_families_and_missing_models_are_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="unknown families \\['topk'\\]"):
        synth_sae.SynthSAEConfig(families=("bae", "topk"))
    cfg = synth_sae.SynthSAEConfig(synthetic_model=str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="^cannot load the synthetic model .*SyntheticModel.save"):
        synth_sae.synthetic_model(cfg)


def test_training_bae_scores_like_its_inference_form():
    """A BAE still in training is scored as the same model loaded for inference would be."""
    model = _tiny_model(features=8, hidden=4)
    data = EvalSet.draw(model, 1024, seed=3)
    torch.manual_seed(0)
    training = BAETrainingSAE(BAETrainingSAEConfig(d_in=4, d_sae=8))
    inference = BAE(BAEConfig(d_in=4, d_sae=8))
    state = training.state_dict()
    training.process_state_dict_for_saving_inference(state)  # what save_inference_model writes
    inference.load_state_dict({k: v for k, v in state.items() if not k.startswith("window_")})
    assert score(training, data) == score(inference, data)


def test_a_worker_ends_when_its_run_is_gone():
    """A job's process whose parent is not the run that started it (the run was killed) ends
    by itself instead of training on."""
    code = (
        "import os; from sae_lens_bae.experiments.synth_sae import exit_with_parent; "
        "exit_with_parent(os.getppid() + 1, every=0.05)"  # a parent that is not this one's
    )
    done = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert done.returncode == 1
