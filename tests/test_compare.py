"""bae compare on the tiny offline Llama: every baseline trains and appears in the table."""

import json

import matplotlib.image
import pytest
import torch
from sae_lens import SAE

import sae_lens_bae  # noqa: F401  (registers the architectures)
from sae_lens_bae.experiments import compare
from sae_lens_bae.experiments.compare import CompareConfig
from sae_lens_bae.saes.gated_relu import GatedReLUSAE, GatedReLUTrainingSAEConfig
from sae_lens_bae.training import BASELINES, train_sae


def test_gated_relu_gate_training_and_round_trip(tmp_path):
    torch.manual_seed(0)
    cfg = GatedReLUTrainingSAEConfig(d_in=8, d_sae=16, gate_threshold=0.5, l1_coefficient=0.1)
    run = train_sae(torch.randn(2048, 8), cfg, training_samples=200 * 256, batch_size=256, lr=3e-3)
    losses = [row["reconstruction_loss"] for row in run.history]
    assert losses[-1] < 0.5 * losses[0]
    sae = run.sae
    x = torch.randn(100, 8)
    pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc  # SAELens applies b_dec to the input
    acts = sae.encode(x)
    assert torch.allclose(acts, torch.where(pre > 0.5, pre, torch.zeros_like(pre)), atol=1e-6)
    z = torch.tensor([-1.0, 0.2, 0.7], requires_grad=True)
    out = sae.get_activation_fn()(z)
    out.sum().backward()
    assert out.tolist() == [0.0, 0.0, pytest.approx(0.7)]
    assert z.grad.tolist() == [0.0, 1.0, 1.0]  # straight-through the gate, not through the ReLU
    sae.save_inference_model(tmp_path / "g")
    loaded = SAE.load_from_disk(tmp_path / "g")
    assert isinstance(loaded, GatedReLUSAE) and loaded.cfg.gate_threshold == 0.5
    assert torch.allclose(loaded.encode(x), acts)
    with pytest.raises(ValueError, match="gate_threshold"):
        GatedReLUTrainingSAEConfig(d_in=8, d_sae=16, gate_threshold=-1.0)


@pytest.mark.slow
def test_compare_trains_every_baseline_and_writes_the_table(
    tiny_hf_llama_dir, tiny_corpus, tmp_path
):
    cfg = CompareConfig(
        dataset=str(tiny_corpus),
        model=str(tiny_hf_llama_dir),
        context_size=32,
        max_sequences=96,
        steps=30,
        batch_size=128,
        records_k=4,
        activated_min_samples=2,
        out=tmp_path,
    )
    summary = compare.run(cfg, progress=False)
    assert list(summary["models"]) == ["bae", *BASELINES]
    table = (tmp_path / "compare.md").read_text()
    assert "probe k=20" in table and "EV (OOD)" in table and "activated (>8)" in table
    for name in ["bae", *BASELINES]:
        assert f"| {name} |" in table
        stats = summary["models"][name]
        assert {"reconstruction_loss", "decoder_covariance_norm", "activated", "activated_firing",
                "constant", "dead", "dense", "frequent", "firing_over_half", "l0",
                "explained_variance", "d_sae"} <= set(stats)  # fmt: skip
        assert 0 <= stats["dead"] <= stats["constant"] <= stats["channels"]
        assert stats["activated"] <= stats["d_sae"]
        assert stats["activated_strict"] <= stats["activated"]  # > 8 records, not >= 6
        if name != "transcoder":  # spliced into the model: SAELens' CE and KL columns
            assert stats["kl_div_with_sae"] >= 0 and "ce_loss_score" in stats
            # the labelled movie-review sentences: probing and out-of-distribution columns
            assert set(stats["probe_accuracy"]) == {"1", "5", "20"}
            assert all(0.0 <= a <= 1.0 for a in stats["probe_accuracy"].values())
            assert stats["ood_dead"] <= stats["d_sae"] and stats["ood_l0"] >= 0
    assert summary["models"]["bae"]["magnitude"] == "burstiness"
    assert summary["models"]["standard_rescaled"]["magnitude"] == "rescaled"
    # the rescaled view reads the same SAE: same reconstruction, other records
    same = ("reconstruction_loss", "l0", "dead", "dense")
    for key in same:
        assert summary["models"]["standard_rescaled"][key] == summary["models"]["standard"][key]
    assert json.loads((tmp_path / "compare.json").read_text())["models"] == summary["models"]
    for png in ("firing_frequency.png", "active_frequency.png", "magnitudes.png",
                "training_curves.png"):  # fmt: skip
        assert matplotlib.image.imread(tmp_path / png).shape[0] > 100
    assert isinstance(SAE.load_from_disk(tmp_path / "models" / "transcoder"), SAE)
    from sae_lens_bae.features import FeatureRecords

    bae_records = FeatureRecords.load(tmp_path / "records" / "bae.safetensors")
    assert bae_records.magnitude == "burstiness" and bae_records.sequences is not None
    with pytest.raises(ValueError, match="Unknown baselines"):
        CompareConfig(baselines=("standard", "gated"))


@pytest.mark.slow
def test_recipe_study_on_the_tiny_model(tiny_hf_llama_dir, tiny_corpus, tmp_path):
    from sae_lens_bae.experiments import recipes

    cfg = recipes.RecipeStudyConfig(
        dataset=str(tiny_corpus),
        model=str(tiny_hf_llama_dir),
        context_size=32,
        max_sequences=96,
        variants=(
            "default",
            "paper",
            "cosine_lr",
            "canonical",
            "long_x2",
        ),
        baselines=("topk15", "standard", "standard_rescaled"),
        steps=12,
        batch_size=128,
        records_k=4,
        spliced_sequences=2,
        out=tmp_path,
    )
    summary = recipes.run(cfg, progress=False)
    rows = summary["models"]
    assert list(rows) == [*cfg.variants, *cfg.baselines]
    assert rows["long_x2"]["steps"] == 24 and rows["default"]["steps"] == 12
    for name in cfg.variants:
        assert rows[name]["meets_target"] == recipes.meets_target(rows, name, cfg.baselines)
    # canonicalised: the same reconstruction, rarity and burstiness (both symmetric in 0 and 1)
    canonical, default = rows["canonical"], rows["default"]
    assert canonical["explained_variance"] == pytest.approx(default["explained_variance"], abs=1e-6)
    for key in ("activated", "constant", "dead", "frequent"):
        assert canonical[key] == default[key], key
    table = (tmp_path / "recipes.md").read_text()
    assert "| cosine_lr |" in table and "| activated |" in table.replace("activated (firing)", "")
    saved = json.loads((tmp_path / "recipes.json").read_text())
    assert saved["models"] == rows and saved["variants"]["paper"]["recipe"] == "paper"
    for png in ("active_frequency.png", "ev_vs_activated.png", "training_curves.png"):
        assert matplotlib.image.imread(tmp_path / png).shape[0] > 100
    with pytest.raises(ValueError, match="unknown variants"):
        recipes.RecipeStudyConfig(variants=("bigger",))


def test_feature_target_on_hand_made_rows():
    from sae_lens_bae.experiments.recipes import meets_target

    def row(ev, activated, constant=0, dead=0):
        return {"explained_variance": ev, "activated": activated, "constant": constant,
                "dead": dead, "channels": 1000}  # fmt: skip

    rows = {"bae": row(0.80, 900), "topk15": row(0.81, 850), "standard": row(0.7, 880)}
    assert meets_target(rows, "bae", ["topk15", "standard"])
    rows["topk15"]["explained_variance"] = 0.83  # EV more than 0.02 below topk15's
    assert not meets_target(rows, "bae", ["topk15", "standard"])
    rows["topk15"]["explained_variance"] = 0.81
    rows["standard"]["activated"] = 901  # a baseline with more activated features
    assert not meets_target(rows, "bae", ["topk15", "standard"])
    rows["standard"]["activated"] = 880
    rows["bae"]["constant"] = 10  # 1% of the channels constant
    assert not meets_target(rows, "bae", ["topk15", "standard"])
    rows["bae"]["constant"], rows["bae"]["dead"] = 9, 1
    assert not meets_target(rows, "bae", ["topk15", "standard"])


@pytest.mark.slow
def test_compare_killed_midway_trains_no_finished_model_again(
    tiny_hf_llama_dir, tiny_corpus, tmp_path, monkeypatch
):
    """Killed while the second model trains, then while evaluating, ``bae compare`` run again
    goes on from its checkpoints: the finished models train no step again, the interrupted one
    only the steps after its last checkpoint, and the table is the one of a run never killed."""
    from sae_lens_bae.experiments import layer_study
    from sae_lens_bae.training import transcoder as transcoder_module
    from sae_lens_bae.training.trainer import RecordingTrainer

    steps = {"sae": 0, "transcoder": 0, "kill_at": None}
    step = RecordingTrainer.step

    def counted(trainer, batch):
        if steps["kill_at"] is not None and steps["sae"] >= steps["kill_at"]:
            raise KeyboardInterrupt
        steps["sae"] += 1
        return step(trainer, batch)

    def counted_range(*args, **kwargs):
        for i in trange(*args, **kwargs):
            steps["transcoder"] += 1
            yield i

    trange = transcoder_module.trange
    monkeypatch.setattr(RecordingTrainer, "step", counted)
    monkeypatch.setattr(transcoder_module, "trange", counted_range)

    def run(out, kill_at=None):
        steps.update(sae=0, transcoder=0, kill_at=kill_at)
        cfg = CompareConfig(dataset=str(tiny_corpus), model=str(tiny_hf_llama_dir),
                            context_size=32, max_sequences=64, steps=20, batch_size=64,
                            baselines=("topk", "transcoder"), spliced_sequences=4,
                            records_k=4, activated_min_samples=2, out=out)  # fmt: skip
        return compare.run(cfg, progress=False)

    never_killed = run(tmp_path / "whole")
    assert steps == {"sae": 40, "transcoder": 20, "kill_at": None}
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed", kill_at=20 + 12)  # the BAE done, topk at step 12 of 20
    evaluate = layer_study.evaluate_model

    def killed_evaluation(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "evaluate_model", killed_evaluation)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed")
    # topk went on from its last checkpoint: SAELens checkpoints once past each fifth of the
    # 1280 samples, i.e. after steps 5, 9, 13 and 17 of 64 rows
    assert steps["sae"] == 20 - 9 and steps["transcoder"] == 20
    monkeypatch.setattr(compare, "evaluate_model", evaluate)
    finished = run(tmp_path / "killed")
    assert steps["sae"] == 0 and steps["transcoder"] == 0  # every model read from its checkpoint
    assert finished["models"] == never_killed["models"]
    assert not (tmp_path / "killed" / "training-checkpoint").exists()  # removed with the results
