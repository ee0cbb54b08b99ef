"""A BAE's constant input scale (``input_variance``): set once on the first training batch, folded
exactly into the saved BAE's weights, and what makes training independent of the states'
scale."""

import json

import pytest
import torch
from sae_lens import SAE, TrainingSAE
from sae_lens.saes.sae import TrainStepInput
from safetensors.torch import load_file

from sae_lens_bae import BAE, BAEConfig, BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.entropy import code_entropy
from sae_lens_bae.entropy.recipe import EntropyRecipe
from sae_lens_bae.features.statistics import decoder_covariance_norm, feature_statistics
from sae_lens_bae.saes.bae_recipes import bae_config
from sae_lens_bae.saes.input_frame import (
    fix_frame_from_set,
    frame,
    in_input_units,
    module_frame,
    weights_in_input_units,
)
from sae_lens_bae.saes.saebench import SAEBenchBAE
from sae_lens_bae.stacks import StackedBAE
from sae_lens_bae.training import train_sae
from sae_lens_bae.training.checkpoints import latest_checkpoint


def fair_bits(n: int = 1024, d: int = 12, r: int = 4, seed: int = 0) -> torch.Tensor:
    """States x = b W + o of r fair bits: raw norms far from 1."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 2, (n, r), generator=g).float()
    return bits @ torch.randn(r, d, generator=g) + torch.randn(d, generator=g)


def trained(x: torch.Tensor, **overrides) -> BAETrainingSAE:
    """The entropy recipe's BAE after 40 steps, as ``train_sae`` returns it: its frame folded."""
    cfg = bae_config(x.shape[-1], recipe="entropy", training_steps=40, **overrides)
    run = train_sae(x, cfg, training_samples=40 * 64, batch_size=64, lr=4e-3, seed=0)
    return run.sae


def in_training(x: torch.Tensor, folder) -> BAETrainingSAE:
    """The same training read from its final checkpoint (written when the 40 steps end, before
    ``train_sae`` folds the frame): a training BAE with its frame on, as a run resumes it."""
    cfg = bae_config(x.shape[-1], recipe="entropy", training_steps=40)
    train_sae(x, cfg, training_samples=40 * 64, batch_size=64, lr=4e-3, seed=0,
              checkpoint_dir=folder, n_checkpoints=0, save_final_checkpoint=True)  # fmt: skip
    return TrainingSAE.load_from_disk(latest_checkpoint(folder))


def _fix(bae: BAETrainingSAE, x: torch.Tensor) -> BAETrainingSAE:
    """The frame fixed on every row of ``x``, as ``train_sae`` fixes it before the first step."""
    fix_frame_from_set(bae, x, max_rows=x.shape[0], seed=0)
    return bae


def test_the_training_set_sets_the_frame_and_steps_keep_it():
    torch.manual_seed(0)
    bae = BAETrainingSAE(BAETrainingSAEConfig(d_in=12, d_sae=48, input_variance=2.0))
    assert bae.input_scale.item() == 0.0  # unset
    x = fair_bits()
    _fix(bae, x)
    # to variance 2 per dimension, 24 in all
    expected = (2.0 * 12 / (x - x.mean(0)).pow(2).sum(-1).mean()).sqrt()
    assert bae.input_scale.item() == pytest.approx(expected.item(), rel=1e-6)
    bae.training_forward_pass(_step(10 * x[:64], 0))
    _fix(bae, 10 * x)  # a set frame is kept
    assert bae.input_scale.item() == pytest.approx(expected.item(), rel=1e-6)


def test_a_step_refuses_an_unset_frame_in_one_line():
    """A frame is estimated on the training set before the first step, never on one minibatch
    inside the step: a step with an unset frame (a SAELens runner, a stream) says what to do."""
    bae = BAETrainingSAE(BAETrainingSAEConfig(d_in=12, d_sae=48, input_variance=1.0))
    with pytest.raises(ValueError, match="input frame .* is unset") as error:
        bae.training_forward_pass(_step(fair_bits()[:64], 0))
    assert "\n" not in str(error.value) and "input_variance=None" in str(error.value)
    stack = StackedBAE(bae.cfg, seeds=[0, 1])
    with pytest.raises(ValueError, match="input frame .* is unset"):
        stack.losses(fair_bits()[:64].expand(2, -1, -1), 0)


def test_a_set_without_variance_gets_the_identity_frame():
    for flat in (torch.zeros(64, 12), torch.full((64, 12), 0.5)):  # no spread, near 0 or far
        bae = _fix(BAETrainingSAE(BAETrainingSAEConfig(d_in=12, d_sae=48, input_variance=1.0)),
                   flat)  # fmt: skip
        assert bae.input_scale.item() == 1.0 and not bae.input_shift.any()
    corners = torch.zeros(64, 12)
    corners[::2] = 1.0  # half the states at 0, half at 1: variance 12 * 0.25, to 12 * 1
    bae = _fix(BAETrainingSAE(BAETrainingSAEConfig(d_in=12, d_sae=48, input_variance=1.0)),
               corners + 7.0)  # fmt: skip
    assert bae.input_scale.item() == pytest.approx(2.0)


def test_the_frame_does_not_depend_on_where_the_states_sit():
    """k is set by the states' spread, not their distance from the origin (LLM states share a
    large mean, which a mean squared norm would count as scale), and t puts the first batch's
    mean at sqrt(variance) along the diagonal: the same encoder input wherever the states sit."""
    x = fair_bits()
    move = 100.0 * torch.randn(12, generator=torch.Generator().manual_seed(5))
    near, far = _first_step(x), _first_step(x + move)
    # the same first batch, moved: equal up to fp32 rounding of states 100 times farther out
    assert far.input_scale.item() == pytest.approx(near.input_scale.item(), rel=1e-4)
    assert torch.allclose(far.input_shift, near.input_shift - move, atol=1e-3)
    framed = frame(x[:64], module_frame(near))
    assert torch.allclose(frame(x[:64] + move, module_frame(far)), framed, atol=1e-4)
    assert framed.mean(0) == pytest.approx(torch.full((12,), 0.5**0.5 / 12**0.5), abs=1e-5)
    assert (framed - framed.mean(0)).pow(2).sum(-1).mean().item() == pytest.approx(0.5, rel=1e-5)


@pytest.mark.slow
def test_a_moved_set_reads_the_same_entropy_through_the_registry():
    """The registry's entropy preset on a 4-bit set and on the same set moved 100 times its
    spread away: 4 bits both (with the inputs scaled by their norm and not moved, before
    2026-11-25, the moved set read 0.00 bits at 101% error; with the biases moved instead of
    the inputs, 1.99 bits at 46%)."""
    x = fair_bits(n=2048)
    move = 100.0 * torch.randn(12, generator=torch.Generator().manual_seed(5))
    for states in (x, x + move):
        cfg = bae_config(12, recipe="entropy", training_steps=2000)
        run = train_sae(states, cfg, training_samples=2000 * 512, batch_size=512, lr=4e-3,
                        seed=0)  # fmt: skip
        estimate = code_entropy(run.sae.eval(), states)
        assert estimate.bits == pytest.approx(4.0, abs=0.05) and estimate.relative_error < 0.01


def test_training_on_scaled_states_is_the_same_training():
    """With the frame fixed on the set, s * x trains as x: SAELens' ``mse_loss`` is in the
    inputs' units, so the whole loss (penalties weighed by 1 / k^2) is s^2 times larger, which
    Adam's steps do not see but through its eps (nor SAELens' clipping at gradient norm 1, which
    these gradients stay below): the same codes, and in input units (the frame folded when
    training ends) the weights of s * x those of x with the encoder's divided by s and the
    decoder's times s, up to float rounding."""
    x = fair_bits()
    small, large = trained(x), trained(64.0 * x)
    assert torch.equal(small.encode_bits(x), large.encode_bits(64.0 * x))
    scales = {"W_enc": 1 / 64.0, "b_enc": 1.0, "W_dec": 64.0, "b_dec": 64.0}
    for name, scale in scales.items():
        expected = getattr(small, name) * scale
        tolerance = 1e-5 * expected.abs().max().item()
        torch.testing.assert_close(getattr(large, name), expected, rtol=0, atol=tolerance)
    torch.testing.assert_close(large(64.0 * x), 64.0 * small(x), rtol=1e-5, atol=64 * 1e-5)


def test_without_the_scale_the_states_scale_changes_what_is_learnt():
    x = fair_bits()
    small, large = trained(x, input_variance=None), trained(64.0 * x, input_variance=None)
    assert not torch.equal(small.encode_bits(x), large.encode_bits(64.0 * x))


def _codes_agree(a: torch.Tensor, b: torch.Tensor, pre: torch.Tensor) -> None:
    """Two codes of one BAE in two forms: equal wherever its pre-activation is not within
    rounding of the step's edge."""
    clear = pre.abs() > 1e-4 * pre.abs().max()
    assert torch.equal(a[clear], b[clear]) and clear.float().mean() > 0.99


def test_the_saved_bae_is_in_input_units(tmp_path):
    """The saved BAE holds SAELens' weights and its prior only, the frame folded into the
    weights: the same codes and outputs on raw states, no frame or training counter."""
    x = fair_bits()
    bae = in_training(x, tmp_path / "run")
    assert bool(bae.input_shift.any()) and bae.input_scale.item() != 1.0
    bae.save_inference_model(tmp_path)
    saved = set(load_file(tmp_path / "sae_weights.safetensors"))
    assert saved == {"W_enc", "b_enc", "W_dec", "b_dec", "code_mean"}
    assert "input_variance" not in json.loads((tmp_path / "cfg.json").read_text())
    loaded = SAE.load_from_disk(tmp_path)  # built on the meta device
    assert isinstance(loaded, BAE) and module_frame(loaded) is None
    _codes_agree(loaded.encode_bits(x), bae.encode_bits(x), bae.hidden_pre(x))
    torch.testing.assert_close(loaded(x), bae(x), rtol=1e-5, atol=1e-5)
    assert torch.equal(loaded.code_mean, bae.code_mean)
    # the weights read directly give the BAE: step(x W_enc + b_enc) W_dec + b_dec
    by_hand = ((x @ loaded.W_enc + loaded.b_enc) >= 0).float() @ loaded.W_dec + loaded.b_dec
    torch.testing.assert_close(by_hand, bae(x), rtol=1e-5, atol=1e-5)


def _framed_bae(apply_b_dec_to_input: bool) -> BAETrainingSAE:
    torch.manual_seed(0)
    bae = BAETrainingSAE(BAETrainingSAEConfig(d_in=6, d_sae=12, input_variance=1.0,
                         apply_b_dec_to_input=apply_b_dec_to_input)).double()  # fmt: skip
    with torch.no_grad():
        bae.b_dec.normal_()
        bae.W_dec.normal_()
        bae.b_enc.normal_()
        bae.input_scale.fill_(0.3)
        bae.input_shift.normal_()
    return bae


@pytest.mark.parametrize("apply_b_dec_to_input", [False, True])
def test_folds_keep_outputs_with_a_scale(apply_b_dec_to_input):
    bae = _framed_bae(apply_b_dec_to_input)
    x = torch.randn(50, 6, dtype=torch.float64)
    expected_norm_fold = bae(3.0 * x) / 3.0
    mean, matrix = torch.randn(6, dtype=torch.float64), torch.randn(6, 6, dtype=torch.float64)
    inverse = torch.linalg.inv(matrix)
    whitened = (x - mean) @ matrix
    codes, expected = bae.encode_bits(whitened), bae.decode(bae.encode(whitened)) @ inverse + mean
    bae.fold_activation_whitening(mean, matrix, inverse)
    assert module_frame(bae) is None and bae.cfg.input_variance is None  # into the weights first
    assert torch.equal(bae.encode_bits(x), codes)
    assert torch.allclose(bae.decode(bae.encode(x)), expected)

    bae = _framed_bae(apply_b_dec_to_input)
    bae.fold_activation_norm_scaling_factor(3.0)  # after the frame's own fold, SAELens'
    assert torch.allclose(bae(x), expected_norm_fold)


@pytest.mark.parametrize("apply_b_dec_to_input", [False, True])
def test_a_training_checkpoint_loads_as_the_saved_bae(apply_b_dec_to_input, tmp_path):
    """A training checkpoint (``save_model``: frame and counters kept, for resuming) read by an
    inference loader gives the BAE ``save_inference_model`` writes."""
    bae = _framed_bae(apply_b_dec_to_input)
    bae.save_model(tmp_path / "checkpoint")
    bae.save_inference_model(tmp_path / "inference")
    from_checkpoint = BAE.load_from_disk(tmp_path / "checkpoint", dtype="float64")
    saved = BAE.load_from_disk(tmp_path / "inference", dtype="float64")
    for name in ("W_enc", "b_enc", "W_dec", "b_dec", "code_mean"):
        torch.testing.assert_close(getattr(from_checkpoint, name), getattr(saved, name))
    x = torch.randn(50, 6, dtype=torch.float64)
    torch.testing.assert_close(from_checkpoint(x), bae(x))


def test_every_weight_reader_reads_input_units():
    """Readers of a framed BAE's weights see its input-unit weights: the frame folded into a
    copy (the BAE keeps training in its frame), SAEBench's wrapper and the decoder statistics
    alike."""
    bae = _framed_bae(False)
    folded = in_input_units(bae)
    assert folded is not bae and bae.input_scale.item() == pytest.approx(0.3)
    x = torch.randn(50, 6, dtype=torch.float64)
    torch.testing.assert_close(folded(x), bae(x))
    expected = weights_in_input_units(bae)
    for name, value in expected.items():
        assert torch.equal(getattr(folded, name), value), name
    torch.testing.assert_close(expected["W_dec"], bae.W_dec / 0.3)
    wrapped = SAEBenchBAE(bae, model_name="m", hook_name="blocks.0.hook_resid_post")
    assert torch.equal(wrapped.W_dec, expected["W_dec"]) and torch.equal(
        wrapped.W_enc, expected["W_enc"]
    )
    torch.testing.assert_close(wrapped(x), bae(x))
    plain = BAE(BAEConfig(d_in=6, d_sae=12))
    assert in_input_units(plain) is plain
    assert decoder_covariance_norm(expected["W_dec"]) != decoder_covariance_norm(bae.W_dec)
    stats = feature_statistics(bae.float(), x.float())
    assert stats["decoder_covariance_norm"] == pytest.approx(
        decoder_covariance_norm(weights_in_input_units(bae)["W_dec"])
    )


def test_a_cast_keeps_the_scale_in_fp32():
    bae = BAETrainingSAE(BAETrainingSAEConfig(d_in=8, d_sae=32, input_variance=1.0))
    bae = bae.to(torch.bfloat16)
    assert bae.W_enc.dtype == torch.bfloat16 and bae.input_scale.dtype == torch.float32


@pytest.mark.parametrize("value", [0.0, -1.0, True])
def test_a_bad_target_is_refused(value):
    with pytest.raises(ValueError, match=r"input_variance=.* \(a positive variance or None\)"):
        BAETrainingSAEConfig(d_in=8, d_sae=32, input_variance=value)


@pytest.mark.parametrize("d_in", [8, 48, 576])
def test_each_recipe_frames_at_its_own_variance(d_in):
    """The entropy recipes frame at the fair-bit sets' total variance whatever the width, a
    config that asks for it at its variance per dimension; the default, the paper's and the
    short-run recipe read states as given."""
    x = fair_bits(d=d_in)
    for cfg, total in (
        (bae_config(d_in, recipe="entropy", training_steps=10), 0.5),
        (EntropyRecipe.of().config(d_in), 0.5),
        (BAETrainingSAEConfig(d_in=d_in, d_sae=2 * d_in, input_variance=1.0), d_in),
    ):
        bae = _fix(BAETrainingSAE(cfg), x[:64])
        framed = (x[:64] + bae.input_shift) * bae.input_scale
        variance = (framed - framed.mean(0)).pow(2).sum(-1).mean().item()
        assert variance == pytest.approx(total, rel=1e-5)
    for name in ("default", "paper", "short_run"):
        assert bae_config(d_in, recipe=name).input_variance is None
        assert not hasattr(BAETrainingSAE(bae_config(d_in, recipe=name)), "input_scale")


def _first_step(x: torch.Tensor) -> BAETrainingSAE:
    """A BAE of the entropy preset framed on the first 64 states, after one step on them."""
    torch.manual_seed(0)
    bae = _fix(BAETrainingSAE(bae_config(12, recipe="entropy", training_steps=40)), x[:64])
    bae.training_forward_pass(_step(x[:64], 0))
    return bae


def _step(x: torch.Tensor, n: int) -> TrainStepInput:
    coefficients = {"entropy": 1e-3, "covariance": 1e-3}
    return TrainStepInput(sae_in=x, coefficients=coefficients, dead_neuron_mask=None,
                          n_training_steps=n, is_logging_step=False)  # fmt: skip


@pytest.mark.parametrize("norm_over_sqrt_d", [0.1, 1.0, 10.0])
def test_a_bae_on_states_far_from_the_coefficients_scale_says_so_once(norm_over_sqrt_d, caplog):
    """Without a frame, the first step of a BAE whose states' mean norm is more than 3 times off
    sqrt(d_in) logs one warning naming SAELens' normalisation; later steps and states at the
    scale log nothing."""
    x = torch.randn(256, 16)
    x = x / x.norm(dim=-1).mean() * 4.0 * norm_over_sqrt_d  # mean norm: the factor x sqrt(16)
    bae = BAETrainingSAE(BAETrainingSAEConfig(d_in=16, d_sae=32))
    with caplog.at_level("WARNING", logger="sae_lens_bae.saes.input_frame"):
        for n in range(3):
            bae.training_forward_pass(_step(x, n))
    warned = [r.getMessage() for r in caplog.records if "mean norm" in r.getMessage()]
    assert len(warned) == (norm_over_sqrt_d != 1.0)
    if warned:
        assert f"{norm_over_sqrt_d:.3g} x sqrt(d_in)" in warned[0]
        assert "normalize_activations='expected_average_only_in'" in warned[0]


def test_saelens_normalisation_brings_states_to_the_scale_and_folds_it(caplog):
    """States 10 times off the coefficients' scale, trained with SAELens' normalisation: the steps
    see them at the scale (no warning), and the BAE comes back in the states' own units (SAELens'
    fold: its config reads "none", and it decodes raw states as it was trained to)."""
    x = torch.randn(2048, 16) * 10.0
    cfg = BAETrainingSAEConfig(d_in=16, d_sae=32, normalize_activations="expected_average_only_in")
    with caplog.at_level("WARNING", logger="sae_lens_bae.saes.input_frame"):
        run = train_sae(x, cfg, training_samples=40 * 256, batch_size=256,
                        n_batches_for_norm_estimate=4)  # fmt: skip
    assert not [r for r in caplog.records if "mean norm" in r.getMessage()]
    assert run.sae.cfg.normalize_activations == "none"
    out = run.sae.decode(run.sae.encode(x))
    explained = 1 - (out - x).pow(2).sum() / (x - x.mean(0)).pow(2).sum()
    assert explained > 0.3  # in the states' units: unfolded, it would be off by 100x


def test_train_sae_fixes_the_frame_on_the_training_set_not_its_first_minibatch(tmp_path):
    """On a tensor, the frame is estimated on the screened set (up to 100 minibatches' rows, as
    SAELens estimates its scale), so a first minibatch unlike the rest does not set it."""
    x = fair_bits(n=1024)
    x[:64] *= 5.0  # a first minibatch (in the tensor's order) five times wider than the rest
    bae = in_training(x, tmp_path)
    target = bae.cfg.input_variance * x.shape[-1]
    variance = (x - x.mean(0)).pow(2).sum(-1).mean()
    assert bae.input_scale.item() == pytest.approx((target / variance).sqrt().item(), rel=1e-5)
    first = (x[:64] - x[:64].mean(0)).pow(2).sum(-1).mean()
    assert abs(bae.input_scale.item() / (target / first).sqrt().item() - 1) > 0.5


def test_train_sae_returns_the_bae_in_input_units(tmp_path):
    """When training ends ``train_sae`` folds the frame into the weights and drops it, as SAELens
    folds its own scaling at the end of ``fit``: the weights of the same training's final
    checkpoint, frame on, folded; the same codes and outputs."""
    x = fair_bits()
    ended = trained(x)
    frame_on = in_training(x, tmp_path)
    assert module_frame(ended) is None and ended.cfg.input_variance is None  # reads x as given
    assert frame_on.input_scale.item() != 1.0 and frame_on.input_shift.any()
    for name, folded in weights_in_input_units(frame_on).items():
        assert not torch.equal(folded, getattr(frame_on, name)), name  # folding moved it
        torch.testing.assert_close(getattr(ended, name), folded, rtol=0, atol=1e-6)
    _codes_agree(ended.encode_bits(x), frame_on.encode_bits(x), frame_on.hidden_pre(x))
    torch.testing.assert_close(ended(x), frame_on(x), rtol=1e-5, atol=1e-5)
