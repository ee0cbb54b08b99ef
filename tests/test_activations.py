import json

import pytest
import torch
from sae_lens import LanguageModelSAERunnerConfig, LanguageModelSAETrainingRunner

from sae_lens_bae import BAETrainingSAEConfig
from sae_lens_bae.activations import (
    ActivationCache,
    drop_outliers,
    harvest_activations,
    hook_width,
)
from sae_lens_bae.entropy import code_entropy
from sae_lens_bae.evaluation import evaluate_sae
from sae_lens_bae.training import train_sae

HOOKS = ["blocks.0.hook_resid_post", "blocks.1.hook_mlp_out"]


@pytest.fixture
def tokens(token_dataset):
    return torch.as_tensor(token_dataset["input_ids"][:40])


def test_harvest_round_trip_matches_run_with_cache(tiny_llama, tokens, tmp_path):
    cache = harvest_activations(
        tiny_llama, tokens, HOOKS, tmp_path, batch_size=7, shard_sequences=16, dtype="float32"
    )
    assert cache.meta["n_shards"] == 3 and cache.meta["complete"]
    loaded = ActivationCache.load(tmp_path)
    assert torch.equal(loaded.tokens(), tokens)
    _, reference = tiny_llama.run_with_cache(tokens, names_filter=HOOKS)
    for hook in HOOKS:
        expected = reference[hook][:, 1:].reshape(-1, reference[hook].shape[-1])  # BOS dropped
        assert torch.allclose(loaded.activations(hook), expected, atol=1e-5)
    positions = loaded.token_positions()
    assert positions.shape == (40 * 31, 2)
    assert positions[0].tolist() == [0, 1] and positions[31].tolist() == [1, 1]
    half = loaded.activations(HOOKS[0], sequences=slice(0, 20))
    assert half.shape[0] == 20 * 31


@pytest.mark.parametrize(
    "hook",
    ["hook_embed", "blocks.1.hook_resid_post", "blocks.0.mlp.hook_post", "blocks.1.attn.hook_z"],
)
def test_hook_width_is_the_last_dimension_of_the_hooks_activations(tiny_llama, tokens, hook):
    _, cache = tiny_llama.run_with_cache(tokens[:1], names_filter=[hook])
    assert hook_width(tiny_llama, hook) == cache[hook].shape[-1]


def test_fp16_storage_and_resume_after_interruption(tiny_llama, tokens, tmp_path):
    full = harvest_activations(tiny_llama, tokens, HOOKS[:1], tmp_path / "a", shard_sequences=16)
    meta_path = tmp_path / "a" / "activations.json"
    meta = json.loads(meta_path.read_text())
    meta.update(n_shards_done=1, complete=False)  # as if it stopped after the first shard
    meta_path.write_text(json.dumps(meta))
    (tmp_path / "a" / "shard_00002.safetensors").unlink()
    with pytest.raises(ValueError, match="did not finish"):
        ActivationCache.load(tmp_path / "a")
    first_shard = (tmp_path / "a" / "shard_00000.safetensors").stat().st_mtime_ns
    resumed = harvest_activations(tiny_llama, tokens, HOOKS[:1], tmp_path / "a", shard_sequences=16)
    assert (tmp_path / "a" / "shard_00000.safetensors").stat().st_mtime_ns == first_shard
    assert torch.equal(resumed.activations(HOOKS[0]), full.activations(HOOKS[0]))
    assert full.activations(HOOKS[0], dtype=torch.float16).dtype == torch.float16


def test_a_damaged_index_is_refused_not_harvested_over(tiny_llama, tokens, tmp_path):
    """Resuming into a folder whose index cannot be read ends in one line naming it; the index
    and the shards stay as they were."""
    harvest_activations(tiny_llama, tokens, HOOKS[:1], tmp_path, shard_sequences=16)
    index, shard = tmp_path / "activations.json", tmp_path / "shard_00000.safetensors"
    index.write_bytes(index.read_bytes()[:20])  # cut short
    before, shard_before = index.read_bytes(), shard.read_bytes()
    with pytest.raises(ValueError, match=r"activations.json is not an activation cache's index"):
        harvest_activations(tiny_llama, tokens, HOOKS[:1], tmp_path, shard_sequences=16)
    assert index.read_bytes() == before and shard.read_bytes() == shard_before


def test_unknown_hook_name(tiny_llama, tokens, tmp_path):
    with pytest.raises(ValueError, match=r"Unknown hook name\(s\) \['blocks.1.hook_resid_pots'\]"):
        harvest_activations(tiny_llama, tokens, ["blocks.1.hook_resid_pots"], tmp_path)


def test_nan_activations_stop_harvest_and_keep_done_shards(tiny_llama, tokens, tmp_path):
    def poison(act, hook):
        if hook.ctx.setdefault("calls", 0) >= 2:
            act[0, 3, 0] = float("nan")
        hook.ctx["calls"] += 1
        return act

    tiny_llama.hook_dict[HOOKS[0]].add_hook(poison)
    try:
        with pytest.raises(
            ValueError, match="NaN/Inf activations at hook 'blocks.0.hook_resid_post'"
        ):
            harvest_activations(
                tiny_llama, tokens, HOOKS[:1], tmp_path, batch_size=8, shard_sequences=16
            )
    finally:
        tiny_llama.reset_hooks(including_permanent=True)
        tiny_llama.hook_dict[HOOKS[0]].ctx.clear()
    assert (tmp_path / "shard_00000.safetensors").exists()
    assert json.loads((tmp_path / "activations.json").read_text())["n_shards_done"] == 1


def test_drop_outliers():
    x = torch.ones(10, 4)
    x[3] *= 1000
    kept, dropped = drop_outliers(x, 10.0)
    assert dropped == 1 and kept.shape == (9, 4)
    assert drop_outliers(x, None)[1] == 0


def test_norm_scale_is_exact_and_the_same_on_any_thread_count():
    from sae_lens_bae.activations.layer import norm_scale

    # 400,000 rows of norm 1 to 41: a float32 mean of them rounds differently on 1 and 2 threads
    x = torch.randn(400_000, 1, generator=torch.Generator().manual_seed(0)).abs() * 10 + 1
    exact = 1.0 / (x.double().abs().sum().item() / x.shape[0])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = norm_scale(x)
        torch.set_num_threads(2)
        assert norm_scale(x) == one
    finally:
        torch.set_num_threads(threads)
    assert one == pytest.approx(exact, rel=1e-12)
    assert norm_scale(torch.full((3, 4), 2.0)) == 0.5  # mean norm 4 scaled to sqrt(4)


@pytest.mark.slow
def test_training_from_cache_matches_live_training(
    tiny_llama, token_dataset, runner_kwargs, tmp_path
):
    """The same BAE config trained live from hooks (SAELens runner) and from the harvested cache
    (SAETrainer over epochs) reaches the same kind of result on held-out activations."""
    hook = "blocks.1.hook_resid_post"
    train_tokens = torch.as_tensor(token_dataset["input_ids"][:160])
    held_out_tokens = torch.as_tensor(token_dataset["input_ids"][160:])
    steps, batch = 150, 256
    bae_cfg = dict(
        d_in=32,
        d_sae=64,
        entropy_coefficient=1e-3,
        covariance_coefficient=1e-4,
        coefficient_width=None,
        input_variance=None,  # coefficients set for these states as given
        entropy_off_steps=round(0.25 * steps),  # the default recipe's phase, in steps
    )

    cache = harvest_activations(
        tiny_llama, train_tokens, [hook], tmp_path / "cache", drop_bos=False
    )
    from_cache = train_sae(
        cache.activations(hook),
        BAETrainingSAEConfig(**bae_cfg),
        training_samples=steps * batch,
        batch_size=batch,
        lr=2e-3,
    ).sae

    live_cfg = LanguageModelSAERunnerConfig(
        sae=BAETrainingSAEConfig(**bae_cfg),
        hook_name=hook,
        is_dataset_tokenized=True,
        lr=2e-3,
        output_path=None,
        **runner_kwargs(batch=batch, steps=steps),
    )
    live = LanguageModelSAETrainingRunner(
        live_cfg,
        override_dataset=token_dataset.select(range(160)),
        override_model=tiny_llama,
    ).run()

    _, held_out = tiny_llama.run_with_cache(held_out_tokens, names_filter=hook)
    acts = held_out[hook].reshape(-1, 32)
    results = {
        name: evaluate_sae(sae, acts) for name, sae in [("cache", from_cache), ("live", live)]
    }
    for result in results.values():
        assert result["explained_variance"] > 0.5
    ev = [r["explained_variance"] for r in results.values()]
    assert abs(ev[0] - ev[1]) < 0.15, results
    entropies = [code_entropy(sae, acts).bits for sae in (from_cache, live)]
    assert abs(entropies[0] - entropies[1]) < 0.25 * max(entropies), entropies


def test_outlier_mask_and_check_layers(tiny_llama):
    from sae_lens_bae.activations import check_layers, outlier_mask

    x = torch.ones(6, 3)
    x[4] *= 100.0
    assert outlier_mask(x, 10.0).tolist() == [True, True, True, True, False, True]
    assert outlier_mask(x, None).all()
    check_layers(tiny_llama, [0, 1])
    with pytest.raises(ValueError, match=r"Layers \[2, -1\] do not exist: .* layers 0\.\.1"):
        check_layers(tiny_llama, [0, 2, -1])


@pytest.mark.parametrize("fmt", [None, "torch", "numpy"])
def test_harvest_reads_a_dataset_in_any_format(tiny_llama, token_dataset, tmp_path, fmt):
    """SAELens' runner sets the dataset it is given to torch format in place; a harvest of the
    same dataset afterwards (tutorial 01) gets the same rows."""
    dataset = token_dataset.with_format(None).select(range(6))  # other tests set torch format
    expected = torch.as_tensor(dataset["input_ids"])
    dataset.set_format(fmt)
    cache = harvest_activations(tiny_llama, dataset, HOOKS[:1], tmp_path, dtype="float32")
    assert torch.equal(cache.tokens(), expected)
