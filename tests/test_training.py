import copy
import json

import pytest
import torch
from sae_lens import SAE, LanguageModelSAERunnerConfig, LanguageModelSAETrainingRunner
from sae_lens.config import SAETrainerConfig
from sae_lens.multi_sae_training_runner import (
    MultiSAETrainingRunner,
    MultiSAETrainingRunnerConfig,
)
from sae_lens.saes.topk_sae import TopKTrainingSAEConfig
from sae_lens.training.sae_trainer import SAETrainer

from sae_lens_bae import (
    BAE,
    BAETrainingSAE,
    BAETrainingSAEConfig,
    bae_config,
    train_bae,
    train_sae,
)
from sae_lens_bae.saes.input_frame import module_frame
from sae_lens_bae.saes.objective import reconstruction_loss
from sae_lens_bae.training import activation_batches

HOOK = "blocks.1.hook_resid_post"


def low_rank_data(n=4096, d=16, rank=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(d, rank, generator=g))[0].T
    coefficients = torch.randint(0, 2, (n, rank), generator=g).float()
    return coefficients @ basis


def held_out_loss(sae, x):
    with torch.no_grad():
        return reconstruction_loss(sae(x), x).item()


def test_activation_batches_cover_every_sample_each_epoch():
    x = torch.arange(10).float().unsqueeze(1)
    batches = activation_batches(x, batch_size=5, seed=1)
    epoch = torch.cat([next(batches), next(batches)]).squeeze(1)
    assert sorted(epoch.tolist()) == list(range(10))
    with pytest.raises(ValueError, match="at least batch_size"):
        next(activation_batches(x, batch_size=11))


def test_sae_trainer_over_plain_iterator_learns():
    x = low_rank_data()
    cfg = BAETrainingSAEConfig(d_in=16, d_sae=32, entropy_off_steps=50)
    torch.manual_seed(0)
    sae = BAETrainingSAE(cfg)
    before = held_out_loss(sae, x[:512])
    trainer = SAETrainer(
        cfg=SAETrainerConfig(
            total_training_samples=200 * 256, train_batch_size_samples=256, lr=2e-3, lr_end=2e-3
        ),
        sae=sae,
        data_provider=activation_batches(x, 256),  # any iterator of tensors
    )
    trainer.fit()
    assert trainer.n_training_steps == 200
    after = held_out_loss(sae, x[:512])
    assert after < 0.25 * before, (before, after)


def test_train_bae_helper_resolves_the_default_recipe_in_its_steps_and_learns(phases_applied):
    """``train_bae`` without a config: the default recipe, its phase resolved into the run's
    400 steps (entropy off for the first 100), as ``bae_config(d, training_steps=400)``."""
    x = low_rank_data(seed=1)
    sae = train_bae(x, epochs=25, batch_size=256, lr=2e-3)
    recipe = bae_config(16, training_steps=25 * 4096 // 256)
    assert sae.cfg.entropy_off_steps == recipe.entropy_off_steps == 100
    assert sae.cfg.coefficients() == recipe.coefficients()
    assert phases_applied.phases() == [(n, n >= 100, True) for n in range(400)]
    assert held_out_loss(sae, x[:512]) < 0.25 * x[:512].pow(2).mean().item()
    assert sae.code_mean_count.item() == 400


def test_train_sae_trains_a_recipe_config_as_it_is(phases_applied):
    """``train_sae(x, bae_config(d, training_steps=N))`` turns the entropy term on at step
    round(0.25 N), where the phase a run of N steps always had lands, and leaves the config as
    it is; a config without a length keeps the term on from the first step."""
    x = low_rank_data(n=1024, seed=4)
    cfg = bae_config(16, 32, training_steps=30)
    given = copy.deepcopy(cfg)
    run = train_sae(x, cfg, training_samples=30 * 128, batch_size=128, record_every=1)
    assert cfg == given  # not edited
    assert run.sae.cfg.entropy_off_steps == cfg.entropy_off_steps == round(0.25 * 30) == 8
    assert phases_applied.phases() == [(n, n >= 8, True) for n in range(30)]
    applied = [row["entropy_coefficient_applied"] for row in run.history]
    assert [row["step"] for row in run.history] == list(range(30))
    assert applied == [0.0] * 8 + [cfg.coefficients()["entropy"]] * 22
    phases_applied.clear()
    train_sae(x, bae_config(16, 32), training_samples=4 * 128, batch_size=128)
    assert phases_applied.phases() == [(n, True, True) for n in range(4)]


def test_train_bae_rejects_missing_length():
    with pytest.raises(ValueError, match="how long"):
        train_bae(torch.randn(600, 4))


def _count_hook_calls(model, hook_name, run):
    """Run ``run()`` while counting calls of one hook point: (result, count)."""
    calls = []
    model.hook_dict[hook_name].add_hook(lambda *_args, **_kwargs: calls.append(1))
    try:
        return run(), len(calls)
    finally:
        model.reset_hooks(including_permanent=True)


@pytest.mark.parametrize("recipe", ["default", "entropy", "paper"])
def test_bae_train_reads_saelens_normalisation_in_place_of_its_frame(recipe, tmp_path):
    """``bae train`` trains with SAELens' normalisation (the scale the coefficients assume) and
    no input frame, whatever the recipe's frame; with ``--normalize-activations none`` the states
    are read as given, and a recipe with a frame, which needs the training set before the first
    step, is refused in one line."""
    from sae_lens_bae.training.live import LiveTrainingConfig, _sae_config

    common = {"out": tmp_path, "dataset": "unused", "recipe": recipe}
    normalised = _sae_config(LiveTrainingConfig(**common), 16)
    assert normalised.input_variance is None
    assert normalised.normalize_activations == "expected_average_only_in"
    given = LiveTrainingConfig(**common, normalize_activations="none")
    if recipe == "entropy":
        with pytest.raises(ValueError, match="frames its inputs on the training set") as error:
            _sae_config(given, 16)
        assert "\n" not in str(error.value)
        return
    own = _sae_config(given, 16)
    assert own.input_variance is None and own.normalize_activations == "none"


def test_language_model_runner_trains_from_live_hooks(
    tiny_llama, token_dataset, runner_kwargs, tmp_path
):
    cfg = LanguageModelSAERunnerConfig(
        sae=BAETrainingSAEConfig(d_in=32, d_sae=128),
        hook_name=HOOK,
        is_dataset_tokenized=True,
        lr=5e-4,
        output_path=str(tmp_path),
        **runner_kwargs(batch=256, steps=12),
    )
    sae, hook_calls = _count_hook_calls(
        tiny_llama,
        HOOK,
        lambda: LanguageModelSAETrainingRunner(
            cfg, override_dataset=token_dataset, override_model=tiny_llama
        ).run(),
    )
    assert isinstance(sae, BAETrainingSAE)
    assert hook_calls > 0, "activations must come from the live hook"
    loaded = SAE.load_from_disk(tmp_path)
    assert isinstance(loaded, BAE)
    assert loaded.cfg.metadata.hook_name == HOOK
    _, cache = tiny_llama.run_with_cache(torch.as_tensor(token_dataset[:4]["input_ids"]))
    acts = cache[HOOK]
    assert torch.equal(loaded.encode(acts), sae.encode(acts))
    runner_cfg = json.loads((tmp_path / "runner_cfg.json").read_text())
    assert runner_cfg["sae"]["architecture"] == "bae"


def test_multi_runner_trains_bae_and_topk_from_same_forward(
    tiny_llama, token_dataset, runner_kwargs, tmp_path, phases_applied
):
    """SAELens' multi-SAE runner trains a BAE config beside a TopK one with no call of ours,
    the BAE's phase in its steps (entropy off for round(0.25 * 10) = 2)."""

    def run_multi(saes, out):
        cfg = MultiSAETrainingRunnerConfig(
            saes=saes,
            hook_names=HOOK,
            output_path=str(out),
            lr=5e-4,
            **runner_kwargs(batch=256, steps=10),
        )
        runner = MultiSAETrainingRunner(
            cfg, override_dataset=token_dataset, override_model=tiny_llama
        )
        return _count_hook_calls(tiny_llama, "hook_embed", runner.run)

    saes, passes_both = run_multi(
        {
            "bae": bae_config(32, training_steps=10),
            "topk": TopKTrainingSAEConfig(d_in=32, d_sae=128, k=8),
        },
        tmp_path,
    )
    assert isinstance(saes["bae"], BAETrainingSAE)
    assert saes["bae"].cfg.entropy_off_steps == 2
    assert phases_applied.phases() == [(n, n >= 2, True) for n in range(10)]
    assert saes["topk"].cfg.architecture() == "topk"
    assert isinstance(SAE.load_from_disk(tmp_path / "bae"), BAE)
    assert SAE.load_from_disk(tmp_path / "topk").cfg.architecture() == "topk"

    _, passes_alone = run_multi(
        {"bae": BAETrainingSAEConfig(d_in=32, d_sae=128)}, tmp_path / "alone"
    )
    assert passes_both == passes_alone > 0  # both SAEs trained from the same LLM passes


def _trainer(sae, total_steps, checkpoint_path=None, data=None):
    return SAETrainer(
        cfg=SAETrainerConfig(
            total_training_samples=total_steps * 128,
            train_batch_size_samples=128,
            lr=1e-3,
            lr_end=1e-3,
            checkpoint_path=checkpoint_path,
            save_final_checkpoint=checkpoint_path is not None,
        ),
        sae=sae,
        data_provider=data,
    )


def test_checkpoint_resume_equals_uninterrupted_training(tmp_path):
    x = low_rank_data(n=2048, seed=2)
    cfg = BAETrainingSAEConfig(d_in=16, d_sae=32, entropy_off_steps=10)

    def fresh():
        torch.manual_seed(0)
        return BAETrainingSAE(cfg)

    full = fresh()
    _trainer(full, 40, data=activation_batches(x, 128, seed=3)).fit()
    assert not torch.allclose(full.W_enc, fresh().W_enc)  # training moved the weights

    first = fresh()
    data = activation_batches(x, 128, seed=3)
    _trainer(first, 20, checkpoint_path=str(tmp_path), data=data).fit()
    checkpoint = tmp_path / f"final_{20 * 128}"
    assert (checkpoint / "trainer_state.pt").exists()

    resumed = fresh()
    trainer = _trainer(resumed, 40, data=data)  # the data stream continues where it stopped
    trainer.load_trainer_state(checkpoint)
    resumed.load_weights_from_checkpoint(checkpoint)
    assert trainer.n_training_steps == 20
    trainer.fit()
    assert trainer.n_training_steps == 40
    for name, value in full.state_dict().items():
        assert torch.allclose(resumed.state_dict()[name], value, atol=1e-6), name


@pytest.mark.parametrize("family", ["bae", "framed bae", "topk"])
def test_a_model_trained_on_scaled_states_is_saved_to_read_the_states_as_harvested(
    family, tmp_path
):
    """``save_in_input_units``: an SAE trained on states times a scale (every command's harvest)
    saves as one that reads the unscaled states: the same code and the reconstruction divided
    by the scale; the model in memory is untouched. ``train_sae`` returns a BAE already in its
    inputs' units (its frame folded and dropped)."""
    from sae_lens_bae.training import save_in_input_units

    states = torch.randn(512, 8, generator=torch.Generator().manual_seed(0)) + 2.0
    scale = 7.0
    cfg = {
        "bae": BAETrainingSAEConfig(d_in=8, d_sae=16),
        "framed bae": BAETrainingSAEConfig(d_in=8, d_sae=16, input_variance=1.0),
        "topk": TopKTrainingSAEConfig(d_in=8, d_sae=16, k=3),
    }[family]
    sae = train_sae(states * scale, cfg, training_samples=8 * 64, batch_size=64).sae.eval()
    if family == "framed bae":
        assert module_frame(sae) is None and sae.cfg.input_variance is None
    before = {name: p.clone() for name, p in sae.named_parameters()}
    save_in_input_units(sae, tmp_path / "saved", scale)
    assert all(torch.equal(p, before[name]) for name, p in sae.named_parameters())
    loaded = SAE.load_from_disk(tmp_path / "saved")
    x = states[:64]
    with torch.no_grad():
        assert torch.equal(loaded.encode(x) > 0, sae.encode(x * scale) > 0)
        assert torch.allclose(loaded(x), sae(x * scale) / scale, atol=1e-4)
