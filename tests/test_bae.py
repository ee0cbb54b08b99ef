import copy
import importlib
import typing
from dataclasses import replace

import pytest
import torch
from sae_lens import SAE, TrainingSAE
from sae_lens.registry import SAE_CLASS_REGISTRY, SAE_TRAINING_CLASS_REGISTRY
from sae_lens.saes.sae import TrainStepInput

import sae_lens_bae
from sae_lens_bae import BAE, BAEConfig, BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.entropy import EntropyRecipe
from sae_lens_bae.saes.bae_recipes import (
    BAE_RECIPES,
    BAERecipe,
    RecipeName,
    bae_config,
    phase_steps,
)
from sae_lens_bae.saes.binary import bits_to_values, step
from sae_lens_bae.saes.canonical import canonicalise
from sae_lens_bae.saes.input_frame import fix_frame_from_set, frame_factor
from sae_lens_bae.saes.objective import covariance_penalty, minibatch_entropy


def make_bae(**kwargs) -> BAETrainingSAE:
    torch.manual_seed(0)
    kwargs.setdefault("d_in", 8)
    kwargs.setdefault("d_sae", 4 * kwargs["d_in"])
    if any(name.endswith("_coefficient") for name in kwargs):  # coefficients as given
        kwargs.setdefault("coefficient_width", None)
    kwargs.setdefault("input_variance", None)  # the step's maths in the inputs' units (the frame:
    # test_input_scale.py)
    return BAETrainingSAE(BAETrainingSAEConfig(**kwargs))


APPLIED = {"entropy_coefficient": 0.1 / 8, "covariance_coefficient": 0.2 / 8}
"""Coefficients that weigh 0.1 and 0.2 against ``mse_loss`` at d_in 8 (``coefficient_width``
None: the fields times d_in)."""


def step_input(x, n_training_steps=0, dead=None):
    """SAETrainer's step input for a BAE: no scheduled coefficients (``get_coefficients``)."""
    return TrainStepInput(
        sae_in=x,
        coefficients={},
        dead_neuron_mask=dead,
        n_training_steps=n_training_steps,
        is_logging_step=False,
    )


# ------------------------------------------------------------------ step and its surrogate


def test_step_forward_is_heaviside_with_step_of_zero_one():
    x = torch.tensor([-1.0, -1e-9, 0.0, 1e-9, 2.0])
    assert step(x).tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert step(x, 1.0).tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("temperature", [1.0, 0.3])
def test_sigmoid_surrogate_gradient(temperature):
    x = torch.tensor([-2.0, 0.0, 0.5], requires_grad=True)
    step(x, temperature).sum().backward()
    s = torch.sigmoid(x.detach() / temperature)
    assert torch.allclose(x.grad, s * (1 - s) / temperature)


@pytest.mark.parametrize("temperature", [1.0, 0.1])
def test_sigmoid_surrogate_has_no_denormal_gradient_far_from_the_threshold(temperature):
    """Within |x / T| <= 30 the derivative is the sigmoid's; beyond it, on CPU, it is held at its
    value at the cutoff, where a small upstream gradient times sigmoid(x / T) would be a denormal
    float (which slows every later CPU product ~100x)."""
    from sae_lens_bae.saes.binary import SURROGATE_CPU_CUTOFF

    x = torch.tensor([-60.0, -30.0, -20.0, 0.0, 20.0, 30.5, 60.0]) * temperature
    x.requires_grad_(True)
    upstream = 1e-15  # a loss term's gradient can be this small
    (step(x, temperature) * upstream).sum().backward()
    s = torch.sigmoid(x.detach() / temperature)
    inside = (x.detach() / temperature).abs() <= SURROGATE_CPU_CUTOFF
    assert inside.tolist() == [False, True, True, True, True, False, False]
    exact = upstream * s * (1 - s) / temperature
    assert torch.allclose(x.grad[inside], exact[inside], rtol=1e-5, atol=0)
    edge = torch.sigmoid(torch.tensor(-SURROGATE_CPU_CUTOFF))
    held = upstream * edge * (1 - edge) / temperature
    assert x.grad[0].item() == pytest.approx(held.item(), rel=1e-5)  # -60 T: held at -30 T
    assert x.grad[1:4].min() > 0  # (at +20 and beyond, 1 - sigmoid is 0 in float32 already)
    tiny = torch.finfo(torch.float32).tiny
    assert not ((x.grad != 0) & (x.grad.abs() < tiny)).any()
    assert 0 < exact[0] < tiny  # the denormal the cutoff keeps out of the gradient


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
    bae = make_bae(d_in=8, d_sae=6, bits_per_feature=3)
    x = torch.randn(10, 8)
    bits = bae.encode_bits(x)
    assert bits.shape == (10, 18) and set(bits.unique().tolist()) <= {0.0, 1.0}
    values = bae.encode(x)
    assert torch.allclose(values, bits_to_values(bits, 3))
    assert torch.allclose(bae.decode(values), values @ bae.W_dec + bae.b_dec)
    assert bae.W_enc.shape == (8, 18) and bae.W_dec.shape == (6, 8)


# ------------------------------------------------------------------ architecture


@pytest.mark.parametrize("d_in", [3, 16, 576])
def test_a_default_bae_is_the_papers_shape_and_reads_raw_states(d_in):
    """What the defaults must do, whatever their values: a code of 4 d_in bits in training and
    inference alike; the encoder reads the raw state (moving the decoder bias moves no bit);
    the default recipe's entropy term is off for a first part of a run, then on; one gradient
    flows through every bit (the surrogate is defined)."""
    cfg = BAETrainingSAEConfig(d_in=d_in, d_sae=4 * d_in)
    assert cfg.n_bits == BAEConfig(d_in=d_in, d_sae=4 * d_in).n_bits == 4 * d_in
    torch.manual_seed(0)
    bae = BAETrainingSAE(cfg)
    x = torch.randn(32, d_in)
    before = bae.encode_bits(x)
    with torch.no_grad():
        bae.b_dec.add_(10.0)
    assert torch.equal(bae.encode_bits(x), before)
    recipe = bae_config(d_in, training_steps=1000)  # the default recipe's phase, in steps
    assert 0 < recipe.entropy_off_steps < 1000
    assert not recipe.entropy_on(0) and recipe.entropy_on(999)
    bits, _ = bae.encode_with_hidden_pre(x)
    bits.sum().backward()
    assert bae.W_enc.grad is not None and (bae.W_enc.grad != 0).any()


@pytest.mark.parametrize("d_in", [16, 576, 2048])
def test_default_recipe_is_dimension_aware_from_every_entry_point(d_in):
    """The config shows the coefficients at d = 2048 against the squared error per element, so at
    any d_in they weigh a * 2048 against SAELens' ``mse_loss`` (summed over d_in), in one place
    (``coefficients``): the penalties are sums over bits."""
    scale = 2048  # a * (2048 / d_in) per element, times d_in elements
    cfg = BAETrainingSAEConfig(d_in=d_in, d_sae=4 * d_in)
    assert (cfg.entropy_coefficient, cfg.covariance_coefficient) == (5e-7, 8e-6)
    assert cfg.coefficients() == {"entropy": 5e-7 * scale, "covariance": 8e-6 * scale}
    assert (cfg.surrogate_temperature, cfg.coefficient_width) == (1.0, 2048)
    assert bae_config(d_in) == cfg  # without a length, the default recipe is the config's defaults
    # with one, its phase in steps of it: entropy off for the first quarter (rounded)
    assert bae_config(d_in, training_steps=100) == replace(cfg, entropy_off_steps=25)
    assert bae_config(d_in, training_steps=10).entropy_off_steps == round(2.5) == 2
    assert bae_config(d_in, training_steps=100, entropy_off_steps=7).entropy_off_steps == 7
    # what SAELens' registry builds from a bare training config dict is the same
    bare = {"architecture": "bae", "d_in": d_in, "d_sae": 4 * d_in}
    assert TrainingSAE.from_dict(bare).cfg.coefficients() == cfg.coefficients()
    # a recipe of one's own, with its coefficients given at d = 2048
    own = BAERecipe(lr=1e-3, fields={"entropy_coefficient": 1e-4}, entropy_off_fraction=0.5,
                    covariance_off_final_fraction=0.1)  # fmt: skip
    mine = bae_config(d_in, recipe=own, training_steps=40)
    assert mine.coefficients()["entropy"] == pytest.approx(1e-4 * scale)
    assert (mine.entropy_off_steps, mine.covariance_off_from_step) == (20, 36)
    # the paper's recipe keeps its fixed coefficients whatever d
    paper = bae_config(d_in, recipe="paper")
    assert paper.coefficients() == {"entropy": 1e-7 * d_in, "covariance": 1e-7 * d_in}
    assert paper.surrogate_temperature == 1.0 and BAE_RECIPES["paper"].lr == 5e-4
    scaled = bae_config(d_in, coefficient_scale=4.0).coefficients()["entropy"]
    assert scaled == pytest.approx(4 * cfg.coefficients()["entropy"])
    explicit = BAETrainingSAEConfig(
        d_in=d_in, d_sae=4, entropy_coefficient=0.5, coefficient_width=None
    )
    assert explicit.coefficients()["entropy"] == 0.5 * d_in
    with pytest.raises(ValueError, match="unknown BAE recipe"):
        bae_config(d_in, recipe="fast")
    # estimate_entropies trains with the registry's entropy recipe: one rule for both paths
    through_recipe = EntropyRecipe().config(d_in)
    through_registry = bae_config(d_in, recipe="entropy", training_steps=EntropyRecipe().steps)
    for name in (
        "surrogate_temperature",
        "entropy_off_steps",
        "covariance_off_from_step",
        "input_variance",
    ):
        assert getattr(through_recipe, name) == getattr(through_registry, name), name
    assert through_recipe.coefficients() == through_registry.coefficients()
    assert through_registry.coefficients()["entropy"] == pytest.approx(5e-7 * scale)
    assert EntropyRecipe().optimiser.lr == BAE_RECIPES["entropy"].lr == 4e-3
    assert set(typing.get_args(RecipeName)) == set(BAE_RECIPES)  # the CLIs' choices


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


def test_saelens_parameter_names():
    names = dict(make_bae().named_parameters())
    assert {"W_enc", "W_dec", "b_enc", "b_dec"} <= set(names)


# ------------------------------------------------------------------ training step


def test_training_forward_pass_losses_and_metrics():
    bae = make_bae(d_in=8, d_sae=16, entropy_off_steps=5, **APPLIED)
    x = torch.randn(64, 8)
    out = bae.training_forward_pass(step_input(x, n_training_steps=0))
    assert set(out.losses) == {"mse_loss", "entropy_loss", "covariance_loss"}  # SAELens' step's
    # SAELens' meaning: summed over d_in, averaged over the batch
    expected = ((out.sae_out - x) ** 2).sum(-1).mean().item()
    assert out.losses["mse_loss"].item() == pytest.approx(expected)
    bits = bae.encode_bits(x)
    assert out.losses["entropy_loss"].item() == 0.0  # still in the entropy-off phase
    assert out.losses["covariance_loss"].item() == pytest.approx(
        0.2 * covariance_penalty(bits).item(), rel=1e-5
    )
    assert out.metrics["batch_entropy_bits"]() == pytest.approx(
        minibatch_entropy(bits).item(), rel=1e-6
    )
    assert out.loss.item() == pytest.approx(sum(v.item() for v in out.losses.values()), rel=1e-6)
    # constant and dense bits on this minibatch: on each bit's rare state (its rarer value)
    rare = torch.minimum(bits.mean(0), 1 - bits.mean(0))
    dense = out.metrics["dense_bits_in_minibatch_fraction"]()
    assert dense == pytest.approx((rare > 0.1).float().mean().item())
    constant = out.metrics["constant_bits_in_minibatch_fraction"]()
    assert constant == pytest.approx((rare == 0).float().mean().item())
    assert not {"dead_fraction", "dense_fraction", "dead_features"} & set(out.metrics)
    # the coefficients applied: the entropy's is 0 while its term is off
    assert out.metrics["entropy_coefficient_applied"]() == 0.0
    assert out.metrics["covariance_coefficient_applied"]() == pytest.approx(0.2)
    out = bae.training_forward_pass(step_input(x, n_training_steps=5))
    assert out.losses["entropy_loss"].item() == pytest.approx(
        0.1 * minibatch_entropy(bits).item(), rel=1e-5
    )
    constant = bae.encode_bits(torch.zeros(64, 8)).mean(0)  # one state: every bit constant
    assert constant.min() in (0.0, 1.0) and constant.max() in (0.0, 1.0)
    assert out.metrics["entropy_coefficient_applied"]() == pytest.approx(0.1)
    out = bae.training_forward_pass(step_input(torch.zeros(64, 8), n_training_steps=6))
    assert out.metrics["constant_bits_in_minibatch_fraction"]() == 1.0  # always-on bits included
    assert out.metrics["dense_bits_in_minibatch_fraction"]() == 0.0


def test_the_logged_coefficients_are_the_ones_the_penalties_were_applied_with():
    """With an input frame the penalties are divided by k^2, the entropy term is off exactly for
    the steps before ``entropy_off_steps`` and the covariance term exactly from
    ``covariance_off_from_step``: each term equals its logged applied coefficient times its
    penalty."""
    bae = make_bae(d_in=8, d_sae=16, input_variance=1.0, entropy_off_steps=5,
                   covariance_off_from_step=7, **APPLIED)  # fmt: skip
    x = 3.0 * torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    fix_frame_from_set(bae, x, max_rows=64, seed=0)  # as train_sae fixes it before training
    for n in (0, 4, 5, 6, 7, 8, 10**6):
        entropy_on, covariance_on = n >= 5, n < 7
        out = bae.training_forward_pass(step_input(x, n))
        k = frame_factor(bae.input_scale).item()
        bits = bae.encode_bits(x)
        entropy = out.metrics["entropy_coefficient_applied"]()
        covariance = out.metrics["covariance_coefficient_applied"]()
        assert k != pytest.approx(1.0)  # the frame rescales these inputs
        assert entropy == pytest.approx(0.1 * entropy_on / k**2, rel=1e-6), n
        assert covariance == pytest.approx(0.2 * covariance_on / k**2, rel=1e-6), n
        assert out.losses["entropy_loss"].item() == pytest.approx(
            entropy * minibatch_entropy(bits).item(), rel=1e-5, abs=1e-12
        ), n
        assert out.losses["covariance_loss"].item() == pytest.approx(
            covariance * covariance_penalty(bits).item(), rel=1e-5, abs=1e-12
        ), n


def test_gradients_reach_encoder_through_surrogate():
    bae = make_bae(d_in=8, d_sae=16)
    out = bae.training_forward_pass(step_input(torch.randn(64, 8)))
    out.loss.backward()
    assert bae.W_enc.grad is not None and bae.W_enc.grad.abs().sum() > 0
    assert bae.b_enc.grad.abs().sum() > 0


def test_a_bare_config_trains_with_no_length_and_hands_saelens_no_scheduler():
    """The phases are steps of the config, as SAELens' own: a bare config's step runs with both
    terms on at the config's coefficients, and ``get_coefficients`` (what SAETrainer asks when
    built) gives SAELens no scheduler to log, as a TopK SAE's, and changes nothing."""
    bae = BAETrainingSAE(BAETrainingSAEConfig(d_in=8, d_sae=32, coefficient_width=None, **APPLIED))
    attributes = {name: id(value) for name, value in vars(bae).items()}
    cfg = copy.deepcopy(bae.cfg)
    assert bae.get_coefficients() == {}
    assert {name: id(value) for name, value in vars(bae).items()} == attributes
    assert bae.cfg == cfg
    out = bae.training_forward_pass(step_input(torch.randn(16, 8)))
    assert out.metrics["entropy_coefficient_applied"]() == 0.1
    assert out.metrics["covariance_coefficient_applied"]() == 0.2
    assert out.losses["entropy_loss"].item() > 0 and out.losses["covariance_loss"].item() > 0


def test_code_mean_is_running_mean_then_ema():
    from sae_lens_bae.saes import code_mean

    bae = make_bae(d_in=8, d_sae=16)
    xs = [torch.randn(32, 8) for _ in range(3)]
    means = [bae.encode_bits(x).mean(0) for x in xs]
    for x in xs[:2]:
        bae.training_forward_pass(step_input(x))
    assert torch.allclose(bae.code_mean, (means[0] + means[1]) / 2)  # exact mean at first
    mean, count = bae.code_mean.clone(), bae.code_mean_count.clone()
    code_mean.update_running_mean(mean, count, means[2], decay=0.5)  # rate max(0.5, 1/3) = 0.5
    assert torch.allclose(mean, 0.5 * (means[0] + means[1]) / 2 + 0.5 * means[2])
    prior = bae.prior
    prior += 1
    assert not torch.equal(prior, bae.code_mean)  # a copy, never an alias


# ------------------------------------------------------------------ registration


def test_registered_for_inference_and_training():
    assert SAE_CLASS_REGISTRY["bae"] == (BAE, BAEConfig)
    assert SAE_TRAINING_CLASS_REGISTRY["bae"] == (BAETrainingSAE, BAETrainingSAEConfig)


def test_registering_again_or_after_a_reload_leaves_saelens_entries_as_they_are():
    """SAELens refuses a taken name and has no call that replaces an entry: a second
    ``register_all``, or one after the module defining the classes is reloaded, registers
    nothing, and SAELens keeps building the classes registered first."""
    registered = (dict(SAE_CLASS_REGISTRY), dict(SAE_TRAINING_CLASS_REGISTRY))
    sae_lens_bae.registry.register_all()
    assert registered == (SAE_CLASS_REGISTRY, SAE_TRAINING_CLASS_REGISTRY)
    module = importlib.import_module("sae_lens_bae.saes.bae")
    original_namespace = dict(vars(module))
    reloaded = importlib.reload(module)
    try:
        assert reloaded.BAE is not BAE
        sae_lens_bae.registry.register_all()
        assert registered == (SAE_CLASS_REGISTRY, SAE_TRAINING_CLASS_REGISTRY)
        assert SAE_CLASS_REGISTRY["bae"][0] is BAE
        cfg = reloaded.BAETrainingSAEConfig(d_in=4, d_sae=16)  # looks up the inference config
        assert cfg.metadata.training_architecture == "bae"
    finally:  # the rest of the suite uses the originally imported classes
        vars(module).update(original_namespace)


def test_foreign_architecture_with_same_name_is_refused():
    from sae_lens.saes.standard_sae import (
        StandardSAE,
        StandardSAEConfig,
        StandardTrainingSAE,
        StandardTrainingSAEConfig,
    )

    from sae_lens_bae.registry import register_architecture

    with pytest.raises(ValueError, match="already registered by sae_lens_bae.saes.bae.BAE"):
        register_architecture(
            "bae", StandardSAE, StandardSAEConfig, StandardTrainingSAE, StandardTrainingSAEConfig
        )
    assert SAE_CLASS_REGISTRY["bae"] == (BAE, BAEConfig)


HOST_SNAPSHOT = r"""
import importlib, json, pkgutil, sys
import sae_lens, transformer_lens


def import_all(package):
    # every module, so that a change the package makes in one loaded later is seen too
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name.endswith("__main__"):  # a program, not a module to import
            continue
        try:
            importlib.import_module(info.name)
        except Exception:  # an optional dependency missing: the module cannot be changed either
            pass


import_all(sae_lens)
import_all(transformer_lens)
from sae_lens import registry
from sae_lens.saes.sae import SAE, SAEConfig, TrainingSAE, TrainingSAEConfig

HOST = ("sae_lens", "transformer_lens")


REGISTRIES = ("SAE_CLASS_REGISTRY", "SAE_TRAINING_CLASS_REGISTRY")  # compared apart below


def contents(value):
    # what a container holds, so that an entry added, replaced or removed in place is seen
    if isinstance(value, dict):
        return tuple(sorted((repr(k), id(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(id(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(map(repr, value)))
    return None


def parts(value, name=""):
    # a function's code and defaults too, so replacing them in place counts as a change
    held = None if name in REGISTRIES else contents(value)
    value = getattr(value, "__func__", value)
    kept = ("__code__", "__defaults__", "__kwdefaults__")
    return (value, *(getattr(value, a, None) for a in kept)), held


def snapshot():
    seen = {}
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in HOST:
            continue
        seen[name] = {k: parts(v, k) for k, v in vars(module).items()}
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == name:
                seen[f"{name}:{value.__qualname__}"] = {k: parts(v) for k, v in vars(value).items()}
    return seen


def compare(before, after):
    changed = []
    for owner, names in before.items():
        now = after.get(owner, {})
        changed += [f"{owner}.{k}" for k in names if k not in now
                    or any(a is not b for a, b in zip(names[k][0], now[k][0]))
                    or names[k][1] != now[k][1]]
        changed += [f"{owner}.{k} (added)" for k in set(now) - set(names)]
    loaded = set(after) - set(before)
    changed += [f"{owner} (a host module loaded by the package)" for owner in loaded]
    return sorted(changed)


before = snapshot()
entries = {name: dict(getattr(registry, name)) for name in REGISTRIES}
import sae_lens_bae
import_all(sae_lens_bae)  # the modules the package imports on first use too
after = snapshot()
kept = all(getattr(registry, n)[k] is v for n in REGISTRIES for k, v in entries[n].items())
added = {n: {k: [c.__module__ + "." + c.__qualname__ for c in v]
             for k, v in getattr(registry, n).items() if k not in entries[n]} for n in REGISTRIES}
SAE.get_sae_config_class_for_architecture = classmethod(lambda cls, a: SAEConfig)
from transformer_lens import loading_from_pretrained as tl_loading
tl_loading.OFFICIAL_MODEL_NAMES.append("a-model-added-in-place")
patched = compare(before, snapshot())
print(json.dumps({
    "classes": [f"sae_lens.saes.sae:{c.__qualname__}" in before
                for c in (SAE, TrainingSAE, SAEConfig, TrainingSAEConfig)],
    "modules": sum(":" not in owner for owner in before),
    "changed": compare(before, after), "kept": kept, "added": added, "patched": patched,
}))
"""


def test_importing_the_package_changes_no_saelens_or_transformerlens_attribute():
    """In a fresh process: every attribute of every SAELens and TransformerLens module loaded (all
    of SAELens'), and of every class they define (``SAE``, ``TrainingSAE``, ``SAEConfig``,
    ``TrainingSAEConfig`` among them), is the same object before and after ``import sae_lens_bae``
    (functions with the same code and defaults); the registries keep their entries and gain the
    package's two architectures, through SAELens' public calls. A patch like ``SAE``'s config
    lookup replaced, or an entry appended to a host's list in place, is seen."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", HOST_SNAPSHOT], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["classes"] == [True] * 4 and found["modules"] > 50, found
    assert found["changed"] == [], found["changed"]
    assert found["kept"], "an entry SAELens had was replaced"
    ours = {
        "bae": ["sae_lens_bae.saes.bae.BAE", "sae_lens_bae.saes.bae.BAEConfig"],
        "gated_relu": [
            "sae_lens_bae.saes.gated_relu.GatedReLUSAE",
            "sae_lens_bae.saes.gated_relu.GatedReLUSAEConfig",
        ],
    }
    assert found["added"]["SAE_CLASS_REGISTRY"] == ours
    assert set(found["added"]["SAE_TRAINING_CLASS_REGISTRY"]) == set(ours)
    assert found["patched"] == [  # the list is one object under two module names
        "sae_lens.saes.sae:SAE.get_sae_config_class_for_architecture",
        "transformer_lens.loading_from_pretrained.OFFICIAL_MODEL_NAMES",
        "transformer_lens.supported_models.OFFICIAL_MODEL_NAMES",
    ], found["patched"]


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


@pytest.mark.parametrize("bits_per_feature", [0, -1, 1.5, True, "2"])
def test_bad_bits_per_feature(bits_per_feature):
    with pytest.raises(ValueError, match=r"bits_per_feature=.* \(an integer >= 1\)"):
        BAETrainingSAEConfig(d_in=8, d_sae=32, bits_per_feature=bits_per_feature)
    with pytest.raises(ValueError, match=r"bits_per_feature=.* \(an integer >= 1\)"):
        BAEConfig(d_in=8, d_sae=32, bits_per_feature=bits_per_feature)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("d_in", 0, r"d_in=0 \(a positive integer\)"),
        ("surrogate_temperature", 0.0, "surrogate_temperature"),
        ("entropy_coefficient", -1.0, "entropy_coefficient"),
        ("entropy_off_steps", -1, r"entropy_off_steps=-1 \(steps, at least 0\)"),
        ("entropy_off_steps", 2.5, r"entropy_off_steps=2.5 "),
        ("entropy_off_steps", True, r"entropy_off_steps=True "),
        ("covariance_off_from_step", -3, r"covariance_off_from_step=-3 \(a step"),
        ("covariance_off_from_step", 0.5, r"covariance_off_from_step=0.5 "),
    ],
)
def test_bad_training_config_values(field, value, match):
    kwargs = {"d_in": 8, "d_sae": 32, field: value}
    with pytest.raises(ValueError, match=match):
        BAETrainingSAEConfig(**kwargs)


def test_bad_phases_are_refused_in_one_error_naming_each_field():
    with pytest.raises(ValueError, match="^Invalid bae config: ") as error:
        BAETrainingSAEConfig(d_in=8, d_sae=32, entropy_off_steps=-1, covariance_off_from_step=0.5)
    assert "entropy_off_steps=-1" in str(error.value)
    assert "covariance_off_from_step=0.5" in str(error.value)
    with pytest.raises(ValueError, match="covariance_off_final_fraction must be in"):
        BAERecipe(lr=1e-3, covariance_off_final_fraction=1.5)
    with pytest.raises(ValueError, match="training_steps must be"):
        bae_config(8, training_steps=-1)
    assert phase_steps(10, 0.25, 0.0) == {"entropy_off_steps": 2, "covariance_off_from_step": None}
    assert phase_steps(10, 0.0, 0.3) == {"entropy_off_steps": 0, "covariance_off_from_step": 7}


def test_load_from_folder_without_cfg(tmp_path):
    with pytest.raises(FileNotFoundError, match="cfg.json"):
        BAE.load_from_disk(tmp_path)


# ------------------------------------------------------------------ save / load / folding


@pytest.mark.parametrize("kwargs", [{}, {"bits_per_feature": 2, "d_sae": 12}], ids=["1bit", "2bit"])
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
        assert loaded.cfg.bits_per_feature == bae.cfg.bits_per_feature


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


TRAINING_OPTIONS = dict(
    entropy_coefficient=0.02,
    entropy_off_steps=5,
    covariance_off_from_step=45,
)


def test_new_training_options_round_trip_through_save_and_load(tmp_path):
    bae = make_bae(d_in=8, d_sae=12, **TRAINING_OPTIONS)
    bae.save_model(tmp_path / "checkpoint")
    loaded = TrainingSAE.load_from_disk(tmp_path / "checkpoint")
    assert isinstance(loaded, BAETrainingSAE)
    for name, value in TRAINING_OPTIONS.items():
        assert getattr(loaded.cfg, name) == value, name
    # the inference model, saved as one or read from the training checkpoint
    bae.save_inference_model(tmp_path / "inference")
    for path in ("inference", "checkpoint"):
        inference = SAE.load_from_disk(tmp_path / path)
        assert isinstance(inference, BAE)
        x = torch.randn(6, 8)
        assert torch.equal(inference(x), bae(x))


def test_constant_bits_are_those_whose_rare_state_is_below_the_rarity():
    from sae_lens_bae.saes.binary import constant_bits

    counts = torch.tensor([0, 6, 7, 32_000, 63_993, 63_994, 64_000])
    # 64k samples: the rare state must take at least 1e-4 of them (6.4 samples)
    assert constant_bits(counts, 64_000).tolist() == [1, 1, 0, 0, 0, 1, 1]
    # few samples (rarity * samples < 1): only exactly constant bits
    assert constant_bits(torch.tensor([0, 1, 99, 100]), 100).tolist() == [1, 0, 0, 1]


@pytest.mark.parametrize("apply_b_dec_to_input", [False, True])
def test_canonicalise_keeps_every_output_and_makes_the_rare_state_one(apply_b_dec_to_input):
    torch.manual_seed(0)
    bae = BAE(BAEConfig(d_in=6, d_sae=10, apply_b_dec_to_input=apply_b_dec_to_input))
    with torch.no_grad():
        bae.b_dec.normal_()
        bae.W_dec.normal_()
        bae.b_enc.normal_()
        bae.b_enc[:4] += 3.0  # mostly on
    x = torch.randn(400, 6)
    prior = bae.encode_bits(x).mean(0)
    flip = prior > 0.5
    assert 4 <= int(flip.sum()) < 10
    canon = canonicalise(bae, prior)
    assert (canon.decode(canon.encode(x)) - bae.decode(bae.encode(x))).abs().max() < 1e-6
    assert torch.equal(canon.encode_bits(x)[:, flip], 1 - bae.encode_bits(x)[:, flip])
    assert torch.equal(canon.encode_bits(x)[:, ~flip], bae.encode_bits(x)[:, ~flip])
    assert torch.allclose(canon.encode_bits(x).mean(0), torch.minimum(prior, 1 - prior))
    assert torch.equal(bae.encode_bits(x).mean(0), prior)  # the original is untouched
    with pytest.raises(ValueError, match="one bit per feature"):
        canonicalise(BAE(BAEConfig(d_in=6, d_sae=24, bits_per_feature=2)))


@pytest.mark.parametrize("apply_b_dec_to_input", [False, True])
def test_whitening_fold_keeps_outputs(apply_b_dec_to_input):
    torch.manual_seed(0)
    bae = BAE(BAEConfig(d_in=6, d_sae=12, apply_b_dec_to_input=apply_b_dec_to_input)).double()
    with torch.no_grad():
        bae.b_dec.normal_()
        bae.W_dec.normal_()
        bae.b_enc.normal_()
    x = torch.randn(50, 6, dtype=torch.float64)
    mean, matrix = torch.randn(6, dtype=torch.float64), torch.randn(6, 6, dtype=torch.float64)
    inverse = torch.linalg.inv(matrix)
    whitened = (x - mean) @ matrix  # what it was trained on
    expected = bae.decode(bae.encode(whitened)) @ inverse + mean
    codes = bae.encode_bits(whitened)
    bae.fold_activation_whitening(mean, matrix, inverse)
    assert torch.equal(bae.encode_bits(x), codes)
    assert torch.allclose(bae.decode(bae.encode(x)), expected)


def test_more_bit_encoder_starts_at_the_one_bit_scale():
    torch.manual_seed(0)
    one = BAETrainingSAE(BAETrainingSAEConfig(d_in=8, d_sae=16))
    torch.manual_seed(0)
    two = BAETrainingSAE(BAETrainingSAEConfig(d_in=8, d_sae=16, bits_per_feature=3))
    assert two.W_enc.shape == (8, 48)
    norm = one.cfg.decoder_init_norm
    assert torch.allclose(one.W_enc.norm(dim=0), torch.full((16,), norm))
    assert torch.allclose(two.W_enc.norm(dim=0), torch.full((48,), norm))  # every bit, as C = 1
    assert torch.equal(two.W_enc[:, ::3], two.W_dec.T)  # bit 0 of each feature: tied as C = 1
    assert not torch.allclose(two.W_enc[:, 1::3], two.W_enc[:, ::3])  # the others differ


def test_the_covariance_term_is_off_from_its_step():
    """``covariance_off_from_step``: the term counts before that step and not from it, in the step
    SAELens' trainer runs; None (the default) keeps it on to the end."""
    cfg = BAETrainingSAEConfig(d_in=8, d_sae=32, covariance_off_from_step=90)
    assert [cfg.covariance_on(s) for s in (0, 89, 90, 99)] == [True, True, False, False]
    assert BAETrainingSAEConfig(d_in=8, d_sae=32).covariance_on(10**6)
    assert bae_config(8, recipe=BAERecipe(lr=1e-3, covariance_off_final_fraction=0.1),
                      training_steps=100).covariance_off_from_step == 90  # fmt: skip
    bae = make_bae(d_in=8, d_sae=32, covariance_off_from_step=90)
    x = torch.randn(64, 8)
    on = bae.training_forward_pass(step_input(x, n_training_steps=89)).losses
    off = bae.training_forward_pass(step_input(x, n_training_steps=90)).losses
    assert float(on["covariance_loss"]) > 0
    assert float(off["covariance_loss"]) == 0.0
    assert float(off["entropy_loss"]) == float(on["entropy_loss"]) > 0  # the entropy term stays


@pytest.mark.parametrize("input_variance", [None, 1.0])
def test_a_step_reads_its_batch_through_the_input_hook_once_and_logs_saelens_mse(
    input_variance,
):
    """``hook_sae_input`` fires once per training step: on step 0 (which checks the inputs'
    scale or frame, reading them without the hook) and on the steps after it. The logged
    ``mse_loss`` is SAELens': the squared error summed over d_in and averaged over the batch, in
    the inputs' own units (not the frame's)."""
    bae = make_bae(input_variance=input_variance)
    calls = []
    bae.hook_sae_input.add_hook(lambda acts, hook: calls.append(acts.shape))  # noqa: ARG005
    x = 3.0 * torch.randn(32, 8) + 1.0
    fix_frame_from_set(bae, x, max_rows=32, seed=0)  # a frame, when configured, set beforehand
    for n in range(3):
        out = bae.training_forward_pass(step_input(x, n_training_steps=n))
        assert len(calls) == n + 1, n
        expected = ((out.sae_out - x) ** 2).sum(-1).mean()
        assert out.losses["mse_loss"].item() == pytest.approx(expected.item(), rel=1e-6)
    if input_variance is not None:
        assert bae.input_scale.item() > 0 and bae.input_scale.item() != pytest.approx(1.0)
