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
    for name in ["bae", *BASELINES]:
        assert f"| {name} |" in table
        stats = summary["models"][name]
        assert {"reconstruction_loss", "decoder_covariance_norm", "activated", "dead", "dense",
                "l0", "explained_variance"} <= set(stats)  # fmt: skip
        assert 0 <= stats["dead"] <= stats["d_sae"] and stats["activated"] <= stats["d_sae"]
    assert summary["models"]["bae"]["magnitude"] == "burstiness"
    assert summary["models"]["standard_rescaled"]["magnitude"] == "rescaled"
    # the rescaled view reads the same SAE: same reconstruction, other records
    same = ("reconstruction_loss", "l0", "dead", "dense")
    for key in same:
        assert summary["models"]["standard_rescaled"][key] == summary["models"]["standard"][key]
    assert json.loads((tmp_path / "compare.json").read_text())["models"] == summary["models"]
    for png in ("firing_frequency.png", "magnitudes.png", "training_curves.png"):
        assert matplotlib.image.imread(tmp_path / png).shape[0] > 100
    assert isinstance(SAE.load_from_disk(tmp_path / "models" / "transcoder"), SAE)
    from sae_lens_bae.features import FeatureRecords

    bae_records = FeatureRecords.load(tmp_path / "records" / "bae.safetensors")
    assert bae_records.magnitude == "burstiness" and bae_records.sequences is not None
    with pytest.raises(ValueError, match="Unknown baselines"):
        CompareConfig(baselines=("standard", "gated"))
