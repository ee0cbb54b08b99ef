"""A BAE inside the SAELens ecosystem: spliced into a ``HookedSAETransformer``, read by SAELens'
``run_evals``, and trained by SAELens' own trainer and runner with no call of ours."""

from __future__ import annotations

import math

import pytest
import torch
from sae_lens import (
    HookedSAETransformer,
    LanguageModelSAERunnerConfig,
    LanguageModelSAETrainingRunner,
)
from sae_lens.config import SAETrainerConfig
from sae_lens.evals import EvalConfig, run_evals
from sae_lens.training.activation_scaler import ActivationScaler
from sae_lens.training.activations_store import ActivationsStore
from sae_lens.training.sae_trainer import SAETrainer

from sae_lens_bae import load_model
from sae_lens_bae.data import load_token_dataset
from sae_lens_bae.saes.bae import BAE, BAEConfig, BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.training import activation_batches, fill_training_schedule

HOOK = "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def model(tiny_hf_llama_dir) -> HookedSAETransformer:
    return load_model(tiny_hf_llama_dir, model_class=HookedSAETransformer)


def _bae(bits: int) -> BAE:
    torch.manual_seed(bits)
    bae = BAE(BAEConfig(d_in=32, d_sae=48, bits=bits))
    with torch.no_grad():
        bae.W_dec.normal_(0, 0.3)
        bae.code_mean.fill_(0.3)
        bae.code_mean_count.fill_(1.0)
    bae.cfg.metadata.hook_name = HOOK
    return bae


def test_load_model_gives_a_hooked_sae_transformer_with_the_same_logits(model, tiny_hf_llama_dir):
    plain = load_model(tiny_hf_llama_dir)
    tokens = torch.randint(3, 100, (2, 10), generator=torch.Generator().manual_seed(0))
    assert isinstance(model, HookedSAETransformer) and not isinstance(plain, HookedSAETransformer)
    assert torch.equal(model(tokens), plain(tokens))


@pytest.mark.parametrize("bits", [1, 2])
def test_run_with_saes_replaces_the_hook_by_the_bae_reconstruction(model, bits):
    bae = _bae(bits)
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
    levels = torch.arange(2**bits) / (2**bits - 1)  # b bits of a feature: one of 2^b values
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


def test_saelens_runner_trains_a_registry_bae_told_its_length(
    tiny_llama, token_dataset, runner_kwargs
):
    """SAELens' own runner never tells an SAE how long it trains: without
    ``fill_training_schedule`` the BAE refuses when the trainer is built, before any step, with
    one line saying what to call; with it, the schedule is resolved from the runner's length."""

    def runner(cfg):
        return LanguageModelSAETrainingRunner(
            cfg, override_dataset=token_dataset, override_model=tiny_llama
        )

    def config():
        return LanguageModelSAERunnerConfig(
            sae=BAETrainingSAEConfig(d_in=32, d_sae=128), hook_name="blocks.0.hook_resid_post",
            is_dataset_tokenized=True, **runner_kwargs(batch=256, steps=12),
        )  # fmt: skip

    with pytest.raises(ValueError, match="fill_training_schedule"):
        runner(config()).run()
    sae = runner(fill_training_schedule(config())).run()
    assert isinstance(sae, BAETrainingSAE)
    assert sae.cfg.total_training_steps == 12 and sae.schedule.entropy_on_from == 3


def test_saelens_trainer_trains_a_bae_whose_config_knows_its_length():
    x = torch.randn(1024, 8, generator=torch.Generator().manual_seed(0))
    trainer_cfg = SAETrainerConfig(total_training_samples=20 * 64, train_batch_size_samples=64,
                                   lr=1e-3, lr_end=1e-3, device="cpu", n_checkpoints=0,
                                   checkpoint_path=None)  # fmt: skip
    bare = BAETrainingSAE(BAETrainingSAEConfig(d_in=8, d_sae=16))
    with pytest.raises(ValueError, match="total_training_steps"):
        SAETrainer(cfg=trainer_cfg, sae=bare, data_provider=activation_batches(x, 64))
    sae = BAETrainingSAE(BAETrainingSAEConfig(d_in=8, d_sae=16, total_training_steps=20))
    SAETrainer(cfg=trainer_cfg, sae=sae, data_provider=activation_batches(x, 64)).fit()
    assert sae.schedule is not None and sae.schedule.entropy_on_from == 5
