"""A BAE inside the SAELens ecosystem: spliced into a ``HookedSAETransformer``, read by SAELens'
``run_evals``, trained by SAELens' own trainer and runner with no call of ours, and loaded by
SAELens' loader as by ours: strictly by the BAE's own classes, as SAELens reads every
architecture by SAELens' ``SAE``."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from sae_lens import (
    SAE,
    HookedSAETransformer,
    LanguageModelSAERunnerConfig,
    LanguageModelSAETrainingRunner,
    TrainingSAE,
)
from sae_lens.config import SAETrainerConfig
from sae_lens.evals import EvalConfig, run_evals
from sae_lens.training.activation_scaler import ActivationScaler
from sae_lens.training.activations_store import ActivationsStore
from sae_lens.training.sae_trainer import SAETrainer

from sae_lens_bae import bae_config, load_model, load_sae, train_sae
from sae_lens_bae.data import load_token_dataset
from sae_lens_bae.saes.bae import BAE, BAEConfig, BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.saes.input_frame import fix_frame_from_set, in_input_units, module_frame
from sae_lens_bae.training import activation_batches
from sae_lens_bae.training.checkpoints import latest_checkpoint

HOOK = "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def model(tiny_hf_llama_dir) -> HookedSAETransformer:
    return load_model(tiny_hf_llama_dir, model_class=HookedSAETransformer)


def _bae(bits_per_feature: int) -> BAE:
    torch.manual_seed(bits_per_feature)
    bae = BAE(BAEConfig(d_in=32, d_sae=48, bits_per_feature=bits_per_feature))
    with torch.no_grad():
        bae.W_dec.normal_(0, 0.3)
        bae.code_mean.fill_(0.3)
    bae.cfg.metadata.hook_name = HOOK
    return bae


def test_load_model_gives_a_hooked_sae_transformer_with_the_same_logits(model, tiny_hf_llama_dir):
    plain = load_model(tiny_hf_llama_dir)
    tokens = torch.randint(3, 100, (2, 10), generator=torch.Generator().manual_seed(0))
    assert isinstance(model, HookedSAETransformer) and not isinstance(plain, HookedSAETransformer)
    assert torch.equal(model(tokens), plain(tokens))


@pytest.mark.parametrize("bits_per_feature", [1, 2])
def test_run_with_saes_replaces_the_hook_by_the_bae_reconstruction(model, bits_per_feature):
    bae = _bae(bits_per_feature)
    tokens = torch.randint(3, 100, (3, 12), generator=torch.Generator().manual_seed(1))

    def reconstruction(acts, hook):  # noqa: ARG001
        return bae.decode(bae.encode(acts))

    spliced = model.run_with_saes(tokens, saes=[bae])
    replaced = model.run_with_hooks(tokens, fwd_hooks=[(HOOK, reconstruction)])
    assert torch.equal(spliced, replaced)
    assert not torch.allclose(spliced, model(tokens))  # the splice does change the logits
    _, cache = model.run_with_cache_with_saes(tokens, saes=[bae])
    codes = cache[f"{HOOK}.hook_sae_acts_post"]
    assert torch.equal(codes, bae.encode(cache[f"{HOOK}.hook_sae_input"]))
    levels = torch.arange(2**bits_per_feature) / (
        2**bits_per_feature - 1
    )  # b bits of a feature: one of 2^b values
    assert torch.isclose(codes.unique()[:, None], levels).any(-1).all()
    assert model.acts_to_saes == {}  # run_with_saes leaves the model as it was


def test_saelens_run_evals_reads_a_bae(model, tiny_corpus):
    tokens = load_token_dataset(tiny_corpus, model.tokenizer, 32)
    runner_cfg = LanguageModelSAERunnerConfig(
        sae=BAETrainingSAEConfig(d_in=32, d_sae=48), hook_name=HOOK, dataset_path="",
        is_dataset_tokenized=True, context_size=32, store_batch_size_prompts=8,
        train_batch_size_tokens=64, training_tokens=64, prepend_bos=False, device="cpu",
    )  # fmt: skip
    store = ActivationsStore.from_config(model, runner_cfg, override_dataset=tokens)
    eval_cfg = EvalConfig(batch_size_prompts=8, n_eval_reconstruction_batches=2,
                          n_eval_sparsity_variance_batches=2, compute_kl=True,
                          compute_ce_loss=True, compute_sparsity_metrics=True,
                          compute_variance_metrics=True,
                          compute_featurewise_density_statistics=True)  # fmt: skip
    metrics, per_feature = run_evals(_bae(1), store, model, ActivationScaler(), eval_cfg)
    for group, name in [("model_behavior_preservation", "kl_div_with_sae"),
                        ("model_behavior_preservation", "kl_div_score"),
                        ("model_performance_preservation", "ce_loss_score"),
                        ("reconstruction_quality", "explained_variance"),
                        ("sparsity", "l0")]:  # fmt: skip
        assert math.isfinite(metrics[group][name]), name
    # the BAE is not the identity: splicing it moves the next-token distribution
    assert metrics["model_behavior_preservation"]["kl_div_with_sae"] > 1e-4
    assert len(per_feature["feature_density"]) == 48


@pytest.mark.parametrize(
    ("sae", "entropy_off", "covariance_off"),
    [
        (BAETrainingSAEConfig(d_in=32, d_sae=128), 0, None),
        (
            BAETrainingSAEConfig(
                d_in=32, d_sae=128, entropy_off_steps=4, covariance_off_from_step=9
            ),
            4,
            9,
        ),  # fmt: skip
        (bae_config(32, training_steps=12), 3, None),  # the default recipe: a quarter of 12
    ],
    ids=["bare", "steps", "recipe"],
)
def test_saelens_runner_trains_a_bae_config_with_no_call_of_ours(
    tiny_llama, token_dataset, runner_kwargs, phases_applied, sae, entropy_off, covariance_off
):
    """SAELens' own runner trains a BAE config as it is, as it trains a BatchTopK one: nothing
    else is called, the config is not changed, and each term is off exactly in its steps (the
    coefficients SAELens' trainer logs as applied)."""
    given = replace(sae)
    cfg = LanguageModelSAERunnerConfig(
        sae=sae, hook_name="blocks.0.hook_resid_post", is_dataset_tokenized=True,
        output_path=None, **runner_kwargs(batch=256, steps=12),
    )  # fmt: skip
    trained = LanguageModelSAETrainingRunner(
        cfg, override_dataset=token_dataset, override_model=tiny_llama
    ).run()
    assert isinstance(trained, BAETrainingSAE)
    assert (trained.cfg.entropy_off_steps, trained.cfg.covariance_off_from_step) == (
        given.entropy_off_steps,
        given.covariance_off_from_step,
    )
    expected = [(n, n >= entropy_off, covariance_off is None or n < covariance_off)
                for n in range(12)]  # fmt: skip
    assert phases_applied.phases() == expected


def test_saelens_trainer_trains_a_bare_bae_config():
    """SAELens' ``SAETrainer`` alone: a bare config needs no length."""
    x = torch.randn(1024, 8, generator=torch.Generator().manual_seed(0))
    trainer_cfg = SAETrainerConfig(total_training_samples=20 * 64, train_batch_size_samples=64,
                                   lr=1e-3, lr_end=1e-3, device="cpu", n_checkpoints=0,
                                   checkpoint_path=None)  # fmt: skip
    sae = BAETrainingSAE(BAETrainingSAEConfig(d_in=8, d_sae=16))
    trainer = SAETrainer(cfg=trainer_cfg, sae=sae, data_provider=activation_batches(x, 64))
    trainer.fit()
    assert trainer.n_training_steps == 20 and sae.code_mean_count.item() == 20


def test_saelens_log_dict_keeps_saelens_names_and_logs_the_coefficients_applied():
    """SAETrainer's log of a BAE step in the entropy-off phase: SAELens schedules no coefficient
    of a BAE, so it logs no ``details/*_coefficient`` that could read non-zero while a term is
    off; the weights applied are logged (0 while off; the config's times 1/k^2 under a frame),
    and the BAE's counts over the minibatch come under their own names beside SAELens'
    ``sparsity/dead_features``."""
    from sae_lens.saes.sae import TrainStepInput

    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    trainer_cfg = SAETrainerConfig(total_training_samples=20 * 64, train_batch_size_samples=64,
                                   lr=1e-3, lr_end=1e-3, device="cpu", n_checkpoints=0,
                                   checkpoint_path=None)  # fmt: skip
    sae = BAETrainingSAE(BAETrainingSAEConfig(d_in=8, d_sae=16, entropy_off_steps=5))
    trainer = SAETrainer(cfg=trainer_cfg, sae=sae, data_provider=activation_batches(x, 64))
    step = TrainStepInput(
        sae_in=x,
        coefficients=trainer.get_coefficients(),
        dead_neuron_mask=None,
        n_training_steps=0,
        is_logging_step=True,
    )
    log = trainer.build_train_step_log_dict(sae.training_forward_pass(step), 64)
    assert not [name for name in log if name.endswith("_coefficient")]
    assert log["metrics/entropy_coefficient_applied"] == 0.0  # its first steps: off
    covariance = sae.cfg.coefficients()["covariance"]
    assert covariance > 0 and log["metrics/covariance_coefficient_applied"] == covariance
    framed = BAETrainingSAE(replace(sae.cfg, input_variance=1.0))
    fix_frame_from_set(framed, x, max_rows=64, seed=0)  # as train_sae does before training
    framed_log = trainer.build_train_step_log_dict(framed.training_forward_pass(step), 64)
    k = float(framed.input_scale)  # an input frame divides the penalties by k^2
    assert framed_log["metrics/covariance_coefficient_applied"] == pytest.approx(
        covariance / k**2, rel=1e-6
    )
    assert {"sparsity/dead_features", "metrics/constant_bits_in_minibatch_fraction",
            "metrics/dense_bits_in_minibatch_fraction"} <= set(log)  # fmt: skip
    assert not [name for name in log if "dead" in name and name != "sparsity/dead_features"]


# ------------------------------------------------------------------ loading

LOADERS = {"load_sae": load_sae, "SAE.load_from_disk": SAE.load_from_disk,
           "BAE.load_from_disk": BAE.load_from_disk}  # fmt: skip
STRICT = ("load_sae", "BAE.load_from_disk")
"""The loaders that reach the BAE's own config class; SAELens' ``SAE`` reads every architecture's
cfg.json with its lenient ``SAEConfig.from_dict``."""


def _folders(tmp_path) -> dict[str, tuple[Path, BAETrainingSAE]]:
    """A BAE trained 4 steps by ``train_sae`` (framed, 2 bits per feature) with
    checkpoints on: its inference folder and the training checkpoint SAELens' trainer wrote,
    each with the training BAE it holds (the checkpoint's read by SAELens' training loader) in
    input units (its frame folded into a copy: what an inference loader gives)."""
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
    cfg = BAETrainingSAEConfig(d_in=8, d_sae=6, bits_per_feature=2, input_variance=1.0)
    run = train_sae(x, cfg, training_samples=4 * 64, batch_size=64,
                    checkpoint_dir=tmp_path / "run", n_checkpoints=1)  # fmt: skip
    run.sae.save_inference_model(tmp_path / "inference")
    checkpoint = latest_checkpoint(tmp_path / "run")
    assert "entropy_off_steps" in json.loads((checkpoint / "cfg.json").read_text())
    return {
        "inference": (tmp_path / "inference", in_input_units(run.sae)),
        "checkpoint": (checkpoint, in_input_units(TrainingSAE.load_from_disk(checkpoint))),
    }


@pytest.mark.parametrize("loader", list(LOADERS))
def test_every_loader_reads_an_inference_folder_and_a_training_checkpoint_alike(loader, tmp_path):
    x = torch.randn(32, 8)
    for kind, (folder, trained) in _folders(tmp_path).items():
        assert isinstance(trained, BAETrainingSAE), kind
        loaded = LOADERS[loader](folder)
        assert type(loaded) is BAE, kind
        assert loaded.cfg.bits_per_feature == 2 and module_frame(loaded) is None, kind
        assert module_frame(trained) is None, kind
        assert torch.equal(loaded.encode_bits(x), trained.encode_bits(x)), kind
        assert torch.equal(loaded(x), trained(x)), kind


def _edited(folder: Path, edit) -> Path:
    cfg = json.loads((folder / "cfg.json").read_text())
    edit(cfg)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder


EDITS = {
    "unknown field": (lambda cfg: cfg.update(bit=2), r"unknown field\(s\) \['bit'\]"),
    "missing field": (lambda cfg: cfg.pop("bits_per_feature"),
                      r"missing field\(s\) \['bits_per_feature'\]"),
    # without it SAELens reads the file as a pre-6.0 config and drops unknown fields itself
    "no SAELens version": (lambda cfg: cfg.pop("metadata"),
                           r"missing field\(s\) \['metadata.sae_lens_version'\]"),
}  # fmt: skip


@pytest.mark.parametrize("edit", list(EDITS))
@pytest.mark.parametrize("loader", STRICT)
def test_the_baes_loaders_refuse_an_unknown_or_missing_field_in_one_line(loader, edit, tmp_path):
    """``"bit": 2`` beside ``"bits_per_feature": 2`` would load as 2 bits if dropped; a missing
    ``bits_per_feature`` as 1 bit: refused in the inference folder and in the training checkpoint
    alike."""
    change, message = EDITS[edit]
    for kind, (folder, _) in _folders(tmp_path).items():
        with pytest.raises(ValueError, match=message) as error:
            LOADERS[loader](_edited(folder, change))
        assert "\n" not in str(error.value) and "correct the file" in str(error.value), kind


@pytest.mark.parametrize("loader", STRICT)
def test_a_saelens_field_an_older_saelens_did_not_write_takes_saelens_default(loader, tmp_path):
    """A cfg.json written before SAELens added a field of its own lacks it: the BAE's loaders give
    it SAELens' default, as SAELens' reader does; a field the BAE declares (its own, or SAELens'
    that it redeclares with its own default) is still required."""
    x = torch.randn(16, 8)
    for kind, (folder, trained) in _folders(tmp_path).items():
        loaded = LOADERS[loader](_edited(folder, lambda cfg: cfg.pop("normalize_activations")))
        assert loaded.cfg.normalize_activations == "none", kind
        assert torch.equal(loaded(x), trained(x)), kind
        with pytest.raises(ValueError, match=r"missing field\(s\) \['apply_b_dec_to_input'\]"):
            LOADERS[loader](_edited(folder, lambda cfg: cfg.pop("apply_b_dec_to_input")))


TRAINING_LOADERS = {
    "TrainingSAE.load_from_disk": TrainingSAE.load_from_disk,
    "BAETrainingSAE.load_from_disk": BAETrainingSAE.load_from_disk,
}
"""SAELens' training loaders: each builds the registered training config, the BAE's own."""


@pytest.mark.parametrize("loader", list(TRAINING_LOADERS))
def test_the_training_loaders_refuse_an_unknown_field_and_default_a_missing_one(loader, tmp_path):
    """A training checkpoint read to go on training: an unknown field (``"bit": 2``) is refused
    in one line, as by the inference loaders; a training config is also a recipe SAELens' runners
    build from partial dicts, so a field left out takes the config's default, as SAELens'
    ``from_dict`` gives it."""
    folder, trained = _folders(tmp_path)["checkpoint"]
    x = torch.randn(16, 8)
    assert torch.equal(in_input_units(TRAINING_LOADERS[loader](folder))(x), trained(x))
    loaded = TRAINING_LOADERS[loader](_edited(folder, lambda cfg: cfg.pop("surrogate_temperature")))
    assert (
        loaded.cfg.surrogate_temperature
        == BAETrainingSAEConfig(d_in=8, d_sae=6).surrogate_temperature
    )
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['bit'\]") as error:
        TRAINING_LOADERS[loader](_edited(folder, lambda cfg: cfg.update(bit=2)))
    assert "\n" not in str(error.value) and "BAETrainingSAEConfig" in str(error.value)


def test_saelens_runner_configs_carry_a_bae_config_through_their_dicts():
    """SAELens' runner configs rebuild their SAE config from its ``to_dict``: strict reading
    takes a BAE config's own dict back whole, phases included."""
    from sae_lens.synthetic import SyntheticSAERunnerConfig

    cfg = BAETrainingSAEConfig(d_in=8, d_sae=16, entropy_off_steps=3, covariance_off_from_step=9)
    runner = LanguageModelSAERunnerConfig(sae=cfg)
    assert LanguageModelSAERunnerConfig.from_dict(runner.to_dict()).sae == cfg
    synthetic = SyntheticSAERunnerConfig(synthetic_model="a/hub-name", sae=cfg)
    assert SyntheticSAERunnerConfig.from_dict(synthetic.to_dict()).sae == cfg
    partial = {**runner.to_dict(), "sae": {"architecture": "bae", "d_in": 8, "d_sae": 16}}
    assert LanguageModelSAERunnerConfig.from_dict(partial).sae == BAETrainingSAEConfig(8, 16)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['entropy_coef'\]"):
        LanguageModelSAERunnerConfig.from_dict(
            {**partial, "sae": {**partial["sae"], "entropy_coef": 1e-3}}
        )


def test_saelens_sae_reads_a_bae_folder_as_it_reads_every_architecture(tmp_path):
    """``SAE.load_from_disk`` is SAELens' own, unchanged by the package: it drops a field it does
    not know, where the BAE's loaders refuse it."""
    folder, trained = _folders(tmp_path)["inference"]
    _edited(folder, lambda cfg: cfg.update(bit=2))
    loaded = SAE.load_from_disk(folder)
    x = torch.randn(16, 8)
    assert type(loaded) is BAE and torch.equal(loaded(x), trained(x))
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['bit'\]"):
        BAE.load_from_disk(folder)


def _from_a_newer_saelens(cfg: dict) -> None:
    major, minor, _ = (int(part) for part in cfg["metadata"]["sae_lens_version"].split(".")[:3])
    cfg["metadata"]["sae_lens_version"] = f"{major}.{minor + 1}.0"
    cfg["a_field_of_a_newer_saelens"] = True


@pytest.mark.parametrize("loader", STRICT)
def test_a_field_from_a_newer_saelens_is_refused_naming_both_versions(loader, tmp_path):
    """A cfg.json written by a newer SAELens may hold a field the installed one lacks: the BAE's
    loaders refuse it (they cannot tell it from a typo) saying which SAELens wrote the file and
    how to read it; ``SAE.load_from_disk`` drops it, as for every architecture."""
    import sae_lens

    folder, trained = _folders(tmp_path)["inference"]
    _edited(folder, _from_a_newer_saelens)
    written = json.loads((folder / "cfg.json").read_text())["metadata"]["sae_lens_version"]
    with pytest.raises(ValueError) as error:
        LOADERS[loader](folder)
    message = str(error.value)
    assert "unknown field(s) ['a_field_of_a_newer_saelens']" in message and "\n" not in message
    assert f"written by SAELens {written}, newer than the installed {sae_lens.__version__}" in (
        message
    )
    assert "upgrade sae-lens" in message and "correct the file" not in message
    x = torch.randn(16, 8)
    assert torch.equal(SAE.load_from_disk(folder)(x), trained(x))


def test_the_cli_refuses_a_bae_folder_with_an_unknown_field_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from sae_lens_bae.cli import app

    BAE(BAEConfig(d_in=8, d_sae=6)).save_model(tmp_path / "bae")
    _edited(tmp_path / "bae", lambda cfg: cfg.update(bit=2))
    (tmp_path / "texts.txt").write_text("w3 w4 w5\n")
    args = ["interpret", "--sae", str(tmp_path / "bae"), "--dataset", str(tmp_path / "texts.txt"),
            "--model", "no-model-is-loaded-before-the-sae"]  # fmt: skip
    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, args)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "unknown field(s) ['bit']" in errors[0], result.output
