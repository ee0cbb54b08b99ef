import importlib
import json

import pytest
import torch
from sae_lens import SAE, TrainingSAE
from sae_lens.registry import SAE_CLASS_REGISTRY, SAE_TRAINING_CLASS_REGISTRY
from sae_lens.saes.sae import TrainStepInput

import sae_lens_bae
from sae_lens_bae import BAE, BAEConfig, BAETrainingSAE, BAETrainingSAEConfig, bits_to_values
from sae_lens_bae.losses import covariance_penalty, minibatch_entropy
from sae_lens_bae.saes.bae import step


def make_bae(**kwargs) -> BAETrainingSAE:
    torch.manual_seed(0)
    kwargs.setdefault("d_in", 8)
    kwargs.setdefault("entropy_off_steps", 0)
    return BAETrainingSAE(BAETrainingSAEConfig(**kwargs))


def step_input(x, n_training_steps=0, entropy=1e-3, covariance=1e-3, dead=None):
    return TrainStepInput(
        sae_in=x,
        coefficients={"entropy": entropy, "covariance": covariance},
        dead_neuron_mask=dead,
        n_training_steps=n_training_steps,
        is_logging_step=False,
    )


# ------------------------------------------------------------------ step and surrogates


def test_step_forward_is_heaviside_with_step_of_zero_one():
    x = torch.tensor([-1.0, -1e-9, 0.0, 1e-9, 2.0])
    assert step(x).tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert step(x, "sigmoid").tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("temperature", [1.0, 0.3])
def test_sigmoid_surrogate_gradient(temperature):
    x = torch.tensor([-2.0, 0.0, 0.5], requires_grad=True)
    step(x, "sigmoid", temperature).sum().backward()
    s = torch.sigmoid(x.detach() / temperature)
    assert torch.allclose(x.grad, s * (1 - s) / temperature)


def test_straight_through_gradient_is_identity():
    x = torch.tensor([-2.0, 0.0, 0.5], requires_grad=True)
    (step(x, "ste") * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert x.grad.tolist() == [1.0, 2.0, 3.0]


def test_unknown_surrogate_is_rejected():
    with pytest.raises(ValueError, match="Unknown surrogate 'relu'.*sigmoid"):
        step(torch.zeros(2), "relu")
    with pytest.raises(ValueError, match="Unknown surrogate"):
        BAETrainingSAEConfig(d_in=4, surrogate="relu")


# ------------------------------------------------------------------ more-bit decoding


@pytest.mark.parametrize("c", [1, 2, 3, 4])
def test_bits_to_values_matches_formula_on_hand_made_bits(c):
    torch.manual_seed(c)
    bits = torch.randint(0, 2, (5, 3 * c)).float()
    values = bits_to_values(bits, c)
    assert values.shape == (5, 3)
    for row in range(5):
        for k in range(3):
            expected = sum(2**j * bits[row, k * c + j].item() for j in range(c)) / (2**c - 1)
            assert values[row, k].item() == pytest.approx(expected)


def test_bits_to_values_examples():
    values = bits_to_values(torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64), 2)
    assert values.tolist() == [[1 / 3, 2 / 3]]
    assert bits_to_values(torch.tensor([[1.0, 1.0, 1.0]]), 3).tolist() == [[1.0]]


def test_more_bit_bae_shapes_and_decoding():
    bae = make_bae(d_in=8, d_sae=6, bits=3)
    x = torch.randn(10, 8)
    bits = bae.encode_bits(x)
    assert bits.shape == (10, 18) and set(bits.unique().tolist()) <= {0.0, 1.0}
    values = bae.encode(x)
    assert torch.allclose(values, bits_to_values(bits, 3))
    assert torch.allclose(bae.decode(values), values @ bae.W_dec + bae.b_dec)
    assert bae.W_enc.shape == (8, 18) and bae.W_dec.shape == (6, 8)


# ------------------------------------------------------------------ architecture


def test_defaults():
    cfg = BAETrainingSAEConfig(d_in=16)
    assert cfg.d_sae == 64
    assert cfg.bits == 1
    assert cfg.entropy_coefficient == 1e-7 and cfg.covariance_coefficient == 1e-7
    assert cfg.entropy_off_fraction == 0.25
    assert cfg.surrogate == "sigmoid"
    assert cfg.apply_b_dec_to_input is False
    assert sae_lens_bae.DEFAULT_LR == 5e-4 and sae_lens_bae.DEFAULT_BATCH_SIZE == 512
    assert BAEConfig(d_in=16).d_sae == 64


def test_forward_is_binary_code_then_linear_decode():
    bae = make_bae(d_in=8, d_sae=32)
    with torch.no_grad():
        bae.b_enc.normal_()
        bae.b_dec.normal_()
    x = torch.randn(20, 8)
    code = bae.encode(x)
    expected_code = ((x @ bae.W_enc + bae.b_enc) >= 0).float()
    assert torch.equal(code, expected_code)
    assert torch.allclose(bae(x), code @ bae.W_dec + bae.b_dec, atol=1e-6)


def test_without_encoder_bias():
    bae = make_bae(d_in=8, encoder_bias=False)
    assert bae.b_enc is None
    assert "b_enc" not in dict(bae.named_parameters())
    x = torch.randn(4, 8)
    assert torch.equal(bae.encode(x), ((x @ bae.W_enc) >= 0).float())


def test_saelens_parameter_names():
    names = dict(make_bae().named_parameters())
    assert {"W_enc", "W_dec", "b_enc", "b_dec"} <= set(names)


# ------------------------------------------------------------------ training step


def test_training_forward_pass_losses_and_metrics():
    bae = make_bae(d_in=8, d_sae=16, entropy_off_steps=5)
    x = torch.randn(64, 8)
    out = bae.training_forward_pass(step_input(x, n_training_steps=0, entropy=0.1, covariance=0.2))
    assert set(out.losses) == {"reconstruction_loss", "entropy_loss", "covariance_loss"}
    assert out.losses["reconstruction_loss"].item() == pytest.approx(
        ((out.sae_out - x) ** 2).mean().item()
    )
    bits = bae.encode_bits(x)
    assert out.losses["entropy_loss"].item() == 0.0  # still in the entropy-off phase
    assert out.losses["covariance_loss"].item() == pytest.approx(
        0.2 * covariance_penalty(bits).item(), rel=1e-5
    )
    assert out.metrics["batch_entropy_bits"].item() == pytest.approx(
        minibatch_entropy(bits).item(), rel=1e-6
    )
    assert out.loss.item() == pytest.approx(sum(v.item() for v in out.losses.values()), rel=1e-6)
    p = bits.mean(0)
    assert out.metrics["dense_fraction"]() == pytest.approx((p > 0.5).float().mean().item())
    assert out.metrics["dead_fraction"]() == pytest.approx((p == 0).float().mean().item())
    dead = torch.zeros(16, dtype=torch.bool)
    dead[:4] = True
    out = bae.training_forward_pass(step_input(x, n_training_steps=5, entropy=0.1, dead=dead))
    assert out.losses["entropy_loss"].item() == pytest.approx(
        0.1 * minibatch_entropy(bits).item(), rel=1e-5
    )
    assert out.metrics["dead_fraction"]() == 0.25


def test_gradients_reach_encoder_through_surrogate():
    bae = make_bae(d_in=8, d_sae=16)
    out = bae.training_forward_pass(step_input(torch.randn(64, 8)))
    out.loss.backward()
    assert bae.W_enc.grad is not None and bae.W_enc.grad.abs().sum() > 0
    assert bae.b_enc.grad.abs().sum() > 0


def test_entropy_schedule_needs_length_of_training():
    bae = BAETrainingSAE(BAETrainingSAEConfig(d_in=8))
    with pytest.raises(ValueError, match="total_training_steps"):
        bae.training_forward_pass(step_input(torch.randn(16, 8)))
    cfg = BAETrainingSAEConfig(d_in=8, total_training_steps=100)
    assert cfg.resolved_entropy_off_steps() == 25
    assert BAETrainingSAEConfig(d_in=8, entropy_off_fraction=0).resolved_entropy_off_steps() == 0


def test_code_mean_is_running_mean_then_ema():
    bae = make_bae(d_in=8, d_sae=16, code_mean_decay=0.5)
    xs = [torch.randn(32, 8) for _ in range(3)]
    means = [bae.encode_bits(x).mean(0) for x in xs]
    for x in xs[:2]:
        bae.training_forward_pass(step_input(x))
    assert torch.allclose(bae.code_mean, (means[0] + means[1]) / 2)
    bae.training_forward_pass(step_input(xs[2]))  # rate max(0.5, 1/3) = 0.5
    assert torch.allclose(bae.code_mean, 0.5 * (means[0] + means[1]) / 2 + 0.5 * means[2])
    prior = bae.prior
    prior += 1
    assert not torch.equal(prior, bae.code_mean)  # a copy, never an alias


# ------------------------------------------------------------------ registration


def test_registered_for_inference_and_training():
    assert SAE_CLASS_REGISTRY["bae"] == (BAE, BAEConfig)
    assert SAE_TRAINING_CLASS_REGISTRY["bae"] == (BAETrainingSAE, BAETrainingSAEConfig)


def test_registration_is_idempotent_across_reimport_and_reload():
    importlib.import_module("sae_lens_bae")
    sae_lens_bae.registry.register_all()
    module = importlib.import_module("sae_lens_bae.saes.bae")
    original_namespace = dict(vars(module))
    reloaded = importlib.reload(module)
    try:
        sae_lens_bae.registry.register_all()
        assert SAE_CLASS_REGISTRY["bae"][0] is reloaded.BAE
        cfg = reloaded.BAETrainingSAEConfig(d_in=4)  # looks up the inference config
        assert cfg.metadata.training_architecture == "bae"
    finally:  # the rest of the suite uses the originally imported classes
        vars(module).update(original_namespace)
        sae_lens_bae.registry.register_all()
    assert SAE_CLASS_REGISTRY["bae"][0] is BAE


def test_foreign_architecture_with_same_name_is_refused():
    from sae_lens.saes.standard_sae import (
        StandardSAE,
        StandardSAEConfig,
        StandardTrainingSAE,
        StandardTrainingSAEConfig,
    )

    from sae_lens_bae.registry import register_architecture

    with pytest.raises(ValueError, match="already registered"):
        register_architecture(
            "bae", StandardSAE, StandardSAEConfig, StandardTrainingSAE, StandardTrainingSAEConfig
        )


# ------------------------------------------------------------------ bad input


def test_wrong_d_in_names_the_problem():
    bae = make_bae(d_in=8)
    with pytest.raises(ValueError, match=r"d_in=8, got shape \(3, 5\)"):
        bae.encode(torch.randn(3, 5))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_activations_are_rejected(bad):
    bae = make_bae(d_in=8)
    x = torch.randn(3, 8)
    x[1, 2] = bad
    with pytest.raises(ValueError, match="1 NaN/Inf"):
        bae.encode(x)
    with pytest.raises(ValueError, match="NaN/Inf"):
        bae.training_forward_pass(step_input(x))


@pytest.mark.parametrize("bits", [0, -1, 1.5, True, "2"])
def test_bad_bits(bits):
    with pytest.raises(ValueError, match="bits must be an integer >= 1"):
        BAETrainingSAEConfig(d_in=8, bits=bits)
    with pytest.raises(ValueError, match="bits must be an integer >= 1"):
        BAEConfig(d_in=8, bits=bits)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("d_in", 0, "d_in must be a positive integer"),
        ("surrogate_temperature", 0.0, "surrogate_temperature"),
        ("entropy_coefficient", -1.0, "entropy_coefficient"),
        ("entropy_off_fraction", 1.5, "entropy_off_fraction"),
        ("entropy_off_steps", -3, "entropy_off_steps"),
        ("dense_threshold", 1.0, "dense_threshold"),
    ],
)
def test_bad_training_config_values(field, value, match):
    kwargs = {"d_in": 8, field: value}
    with pytest.raises(ValueError, match=match):
        BAETrainingSAEConfig(**kwargs)


def _saved(tmp_path, **kwargs):
    bae = make_bae(**kwargs)
    bae.save_inference_model(tmp_path)
    return bae


def test_cfg_json_with_unknown_field(tmp_path):
    _saved(tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    cfg["bit"] = 2
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['bit'\]"):
        BAE.load_from_disk(tmp_path)


def test_cfg_json_with_missing_field(tmp_path):
    _saved(tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    del cfg["bits"]
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"missing field\(s\) \['bits'\]"):
        BAE.load_from_disk(tmp_path)


def test_load_from_folder_without_cfg(tmp_path):
    with pytest.raises(FileNotFoundError, match="cfg.json"):
        BAE.load_from_disk(tmp_path)


# ------------------------------------------------------------------ save / load / folding


@pytest.mark.parametrize(
    "kwargs", [{}, {"bits": 2, "d_sae": 12}, {"encoder_bias": False}], ids=["1bit", "2bit", "nob"]
)
def test_save_inference_model_then_load_from_disk_is_identical(tmp_path, kwargs):
    bae = make_bae(d_in=8, **kwargs)
    with torch.no_grad():
        for p in bae.parameters():
            p.add_(0.1 * torch.randn_like(p))
    bae.training_forward_pass(step_input(torch.randn(32, 8)))  # fills code_mean
    bae.save_inference_model(tmp_path)
    x = torch.randn(50, 8)
    for loader in (SAE.load_from_disk, BAE.load_from_disk):
        loaded = loader(tmp_path)
        assert isinstance(loaded, BAE)
        assert torch.equal(loaded.encode_bits(x), bae.encode_bits(x))
        assert torch.equal(loaded.encode(x), bae.encode(x))
        assert torch.equal(loaded(x), bae(x))
        assert torch.equal(loaded.code_mean, bae.code_mean)
        assert loaded.cfg.bits == bae.cfg.bits


def test_training_checkpoint_reloads_as_training_sae(tmp_path):
    bae = make_bae(d_in=8)
    bae.save_model(tmp_path)
    loaded = TrainingSAE.load_from_disk(tmp_path)
    assert isinstance(loaded, BAETrainingSAE)
    assert loaded.cfg.entropy_off_steps == 0
    x = torch.randn(5, 8)
    assert torch.equal(loaded(x), bae(x))


def test_fold_W_dec_norm_is_refused(tmp_path):
    bae = make_bae()
    with pytest.raises(ValueError, match="cannot fold decoder norms"):
        bae.fold_W_dec_norm()
    bae.save_inference_model(tmp_path)
    with pytest.raises(ValueError, match="cannot fold decoder norms"):
        SAE.load_from_disk(tmp_path, fold_W_dec_norm=True)


@pytest.mark.parametrize("apply_b_dec_to_input", [False, True])
def test_activation_norm_scaling_fold_keeps_outputs(apply_b_dec_to_input):
    bae = make_bae(d_in=8, apply_b_dec_to_input=apply_b_dec_to_input)
    with torch.no_grad():
        bae.b_dec.normal_()
        bae.b_enc.normal_()
    x = torch.randn(40, 8, dtype=torch.float64)
    bae = bae.to(torch.float64)
    scale = 3.0
    expected = bae(x * scale) / scale  # trained on scaled inputs, mapped back
    bae.fold_activation_norm_scaling_factor(scale)
    assert torch.allclose(bae(x), expected)
