"""bae compare on the tiny offline Llama: the protocol's choices, rows, tables and plots."""

import json

import matplotlib.image
import pytest
import torch
from sae_lens import SAE

import sae_lens_bae  # noqa: F401  (registers the architectures)
from sae_lens_bae.experiments import compare, compare_study
from sae_lens_bae.experiments.compare import CompareConfig
from sae_lens_bae.experiments.protocol import _rung, frontier, ladder_shortfalls
from sae_lens_bae.saes.gated_relu import GatedReLUSAE, GatedReLUTrainingSAEConfig
from sae_lens_bae.training import train_sae


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


def _tiny_compare(model, corpus, out, **changes):
    settings = dict(dataset=str(corpus), model=str(model), context_size=32, max_sequences=96,
                    held_out_fraction=0.15, families=("bae", "topk"),
                    bae_scales=(0.5, 0.7071, 1.0), d_sae=32, steps=12, lrs=(1e-3, 2e-3),
                    lr_extensions=1, ladder_extensions=1, seeds=(0, 1, 2), bootstrap=20,
                    batch_size=64, records_k=4, spliced_sequences=2, probe_sentences=40,
                    out=out)  # fmt: skip
    return CompareConfig(**{**settings, **changes})


@pytest.mark.slow
def test_compare_runs_the_protocol_and_writes_rows_tables_and_frontiers(
    tiny_hf_llama_dir, tiny_corpus, tmp_path
):
    cfg = _tiny_compare(tiny_hf_llama_dir, tiny_corpus, tmp_path, topk_k=(4, 6, 8))
    summary = compare.run(cfg, progress=False)
    rows = summary["rows"]
    assert json.loads((tmp_path / "compare.json").read_text())["rows"] == rows
    # the lr search: each family's middle setting at every rate tried, first two seeds, read on
    # validation only; the grid extended once beyond an edge that wins
    for family, middle in (("bae", 0.7071), ("topk", 6.0)):
        tried = summary["lr_candidates"][family]
        assert set(cfg.lrs) <= set(tried) and len(tried) in (2, 3)
        search = [r for r in rows if r["family"] == family and r["setting"] == middle
                  and r["seed"] in (0, 1) and r["split"] == "validation"]  # fmt: skip
        assert sorted({r["lr"] for r in search}) == pytest.approx(tried)
        means = {lr: sum(r["objective"] for r in search if r["lr"] == lr) / 2 for lr in tried}
        assert summary["chosen_lr"][family] == min(means, key=means.get)
        final = [r for r in rows if r["family"] == family and r["split"] == "test"]
        assert {(r["setting"], r["seed"]) for r in final} == {
            (s, seed) for s in summary["settings"][family] for seed in cfg.seeds
        }
        assert {r["lr"] for r in final} == {summary["chosen_lr"][family]}
        assert all(r["lr_candidates"] == tried for r in final)
    # one round of rungs (the tiny models' ranges miss each other), each exactly one sqrt(2)
    # beyond an end of the ladder as given; what the rule still finds short is recorded
    assert summary["settings_added"]
    for family, given in ((f, cfg.settings(f)) for f in cfg.families):
        added = summary["settings_added"].get(family, [])
        assert summary["settings"][family] == sorted([*given, *added])
        whole = family == "topk"
        beyond = {_rung(given[0] / 2**0.5, whole), _rung(given[-1] * 2**0.5, whole)}
        assert set(added) <= beyond
    final_names = {r["name"] for r in rows if r["split"] == "test"}
    judged = [r for r in rows if r["name"] in final_names]
    assert summary["ladder_shortfalls"] == ladder_shortfalls(judged, ["bae", "topk"])
    assert summary["bae_default"] in summary["settings"]["bae"]  # its rule: test_protocol.py
    names = {r["name"] for r in rows if r["split"] == "test"}
    assert names == {r["name"] for r in rows if r["split"] == "ood"}
    for row in rows:
        assert "replicates" not in row
        assert set(row["activated_by_magnitude"]) == {"native", "rescaled", "support"}
        assert row["activated_by_magnitude"]["native"] == row["activated"]
        assert row["activated_strict_by_magnitude"]["native"] == row["activated_strict"]
        assert 0 <= row["dead"] <= row["constant"] <= cfg.d_sae
        assert row["activated_strict"] <= row["activated"] <= cfg.d_sae
        if row["split"] == "validation":  # no probe; the final grid spliced, for its ladders
            assert row["probe_accuracy"] is None
            assert (row["kl"] is None) == (row["name"] not in names)
        else:
            assert row["kl"] >= 0
        if row["split"] == "test":  # one probe task: its own held-out half, with its error
            (task,) = row["probe_accuracy"]
            assert set(row["probe_accuracy"][task]) == {"1", "5", "20"}
            accuracy = row["probe_accuracy"][task]["5"]
            assert row["probe_standard_error"][task]["5"] == pytest.approx(
                (accuracy * (1 - accuracy) / 20) ** 0.5
            )
        if row["split"] == "ood":  # one task: no probe of its own on OOD, none copied
            assert row["probe_accuracy"] is None
    # the probe is a frontier like any metric (its task's key has no dot to break the path);
    # with one task only the test split carries a probe verdict
    (task,) = next(r for r in rows if r["split"] == "test")["probe_accuracy"]
    assert task == "pang_lee_polarity"
    probe = f"probe_accuracy.{task}.5"
    assert len(frontier(rows, "bae", "test", "l0", probe)) == len(summary["settings"]["bae"])
    probed = {v["split"] for v in summary["verdicts"] if v["metric"].startswith("probe")}
    assert probed == {"test"}
    tokens = summary["tokens"]
    assert min(tokens.values()) > 0 and summary["ood_dataset"].endswith("ood-text.txt")
    for verdict in summary["verdicts"]:
        assert verdict["against"] == "topk"
        assert verdict["verdict"] in ("better", "worse", "no difference", "no overlap",
                                      "too few points")  # fmt: skip
        decided = verdict["verdict"] in ("better", "worse", "no difference")
        assert decided == (verdict["points_in_overlap"] >= 3)
    table = (tmp_path / "compare.md").read_text()
    assert table.index("## The decision rule") < table.index("## Test") < table.index("## OOD")
    dropped = summary["outliers_dropped"]  # the harvests' extreme states, counted and reported
    assert set(dropped) == {"harvest", "ood"} and min(dropped.values()) >= 0
    assert f"set aside: {dropped['harvest']} of the harvest, {dropped['ood']} of the OOD" in table
    for png in ("frontier_kl_l0.png", "frontier_activated_kl.png", "density.png",
                "training_curves.png"):  # fmt: skip
        assert matplotlib.image.imread(tmp_path / png).shape[0] > 100
    name = next(r["name"] for r in rows if r["family"] == "bae" and r["split"] == "test")
    assert isinstance(SAE.load_from_disk(tmp_path / "models" / name), SAE)
    from sae_lens_bae.features import FeatureRecords

    held = FeatureRecords.load(tmp_path / "records" / f"{name}.safetensors")
    assert held.magnitude == "burstiness" and held.sequences is not None
    assert (tmp_path / "models" / "bae" / "cfg.json").exists()
    with pytest.raises(ValueError, match="unknown families"):
        CompareConfig(families=("standard", "gated"))
    with pytest.raises(ValueError, match="share task names"):
        CompareConfig(probe_datasets=("a/sst2", "b/sst2.tsv"))
    with pytest.raises(ValueError, match="at least 2 rates"):
        CompareConfig(lrs=(1e-3,))


@pytest.mark.slow
def test_compare_killed_midway_trains_no_finished_model_again(
    tiny_hf_llama_dir, tiny_corpus, tmp_path, monkeypatch
):
    """Killed while the second model trains, then while reading on test, ``bae compare`` run
    again goes on from its checkpoints: the finished models train no step again, the interrupted
    one only the steps after its last checkpoint, and the rows are those of a run never killed."""
    from sae_lens_bae.training.trainer import RecordingTrainer

    steps = {"sae": 0, "kill_at": None}
    step = RecordingTrainer.step

    def counted(trainer, batch):
        if steps["kill_at"] is not None and steps["sae"] >= steps["kill_at"]:
            raise KeyboardInterrupt
        steps["sae"] += 1
        return step(trainer, batch)

    monkeypatch.setattr(RecordingTrainer, "step", counted)

    def run(out, kill_at=None):
        steps.update(sae=0, kill_at=kill_at)
        cfg = _tiny_compare(tiny_hf_llama_dir, tiny_corpus, out, families=("bae", "topk"),
                            bae_scales=(1.0,), topk_k=(8,), lr_extensions=0,
                            ladder_extensions=0, seeds=(0,),
                            steps=20, probe_sentences=0, bootstrap=10)  # fmt: skip
        return compare.run(cfg, progress=False)

    never_killed = run(tmp_path / "whole")
    assert steps == {"sae": 80, "kill_at": None}  # two rates per family, the final grid reused
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed", kill_at=60 + 12)  # the BAE done, topk's second rate at step 12
    read = compare_study.read_split
    calls = {"n": 0}

    def killed_on_test(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 4:  # the four validation reads done: killed on the first test read
            raise KeyboardInterrupt
        return read(*args, **kwargs)

    monkeypatch.setattr(compare_study, "read_split", killed_on_test)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed")
    # topk went on from its last checkpoint: SAELens checkpoints once past each fifth of the
    # 1280 samples, i.e. after steps 5, 9, 13 and 17 of 64 rows
    assert steps["sae"] == 20 - 9
    monkeypatch.setattr(compare_study, "read_split", read)
    finished = run(tmp_path / "killed")
    assert steps["sae"] == 0  # every model read from its checkpoint
    assert finished["rows"] == never_killed["rows"]
    assert not (tmp_path / "killed" / "training-checkpoint").exists()  # removed with the results


def test_the_training_objective_of_a_topk_sae_is_its_summed_squared_error():
    """The lr rule's score: for TopK (no penalty, no dead-latent term without a mask) the loss
    SAELens trains on is the squared error summed over d, averaged over whole minibatches."""
    from sae_lens.saes.topk_sae import TopKTrainingSAEConfig

    from sae_lens_bae.experiments.compare_objective import training_objective

    torch.manual_seed(0)
    run = train_sae(torch.randn(512, 8), TopKTrainingSAEConfig(d_in=8, d_sae=16, k=3),
                    training_samples=20 * 64, batch_size=64)  # fmt: skip
    states = torch.randn(100, 8)
    kept = states[:96]  # three whole minibatches of 32; the last 4 rows are left out
    with torch.no_grad():
        expected = ((run.sae(kept) - kept) ** 2).sum(-1).mean().item()
        before = {k: v.clone() for k, v in run.sae.state_dict().items()}
    got = training_objective(run.sae, states, batch_size=32, steps=20)
    assert got == pytest.approx(expected, rel=1e-5)
    assert all(torch.equal(v, run.sae.state_dict()[k]) for k, v in before.items())
    with pytest.raises(ValueError, match="no minibatch of 200"):
        training_objective(run.sae, states, batch_size=200, steps=20)
