"""The extreme state rule (``sae_lens_bae.outliers``) on every path into a BAE: each sets aside
exactly the injected states, says how many, trains as if they had never been there, and keeps
them when asked."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import pytest
import torch
from sae_lens import LanguageModelSAERunnerConfig
from sae_lens.config import SAETrainerConfig
from sae_lens.saes.sae import TrainingSAE, TrainingSAEConfig, TrainStepInput
from sae_lens.training.sae_trainer import SAETrainer
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from sae_lens_bae.activations import ActivationCache, harvest_activations, harvest_layer
from sae_lens_bae.cli import app
from sae_lens_bae.entropy import EntropyRecipe, estimate_entropies
from sae_lens_bae.experiments.compare_report import _outlier_line
from sae_lens_bae.outliers import (
    NORM_RATIO,
    drop_outliers,
    outlier_mask,
    outliers_set_aside,
    screen_step,
)
from sae_lens_bae.saes.bae import BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.saes.bae_recipes import bae_config
from sae_lens_bae.training.trainer import train_sae

D = 8


def _states(n: int, seed: int = 0) -> torch.Tensor:
    """Ordinary states: a Gaussian around an offset, norms within a factor 2 of each other."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, D, generator=generator) + 3.0


def _inject(states: torch.Tensor, rows: list[int], factor: float = 50.0) -> torch.Tensor:
    out = states.clone()
    out[rows] *= factor
    return out


def test_the_rule_is_the_norm_against_the_median_norm():
    x = _states(1000)
    rows = [3, 500, 999]
    dirty = _inject(x, rows)
    keep = outlier_mask(dirty)
    assert torch.equal(torch.nonzero(~keep).flatten(), torch.tensor(rows))
    kept, dropped = drop_outliers(dirty)
    assert dropped == 3 and torch.equal(kept, x[keep])
    assert bool(outlier_mask(x).all())  # an ordinary set loses nothing
    assert bool(outlier_mask(dirty, None).all())  # None keeps every state
    # the median is the reference: a state just above the ratio is out, one just below is in
    median = dirty.norm(dim=-1).median()
    probe = torch.zeros(2, D)
    probe[0, 0], probe[1, 0] = 1.001 * NORM_RATIO * median, 0.999 * NORM_RATIO * median
    assert outlier_mask(probe, reference=dirty).tolist() == [False, True]


def _bae(steps: int = 20) -> BAETrainingSAE:
    return BAETrainingSAE(bae_config(D, 16, training_steps=steps))


def _step_input(sae: BAETrainingSAE, batch: torch.Tensor, logging: bool = False):
    return TrainStepInput(
        sae_in=batch, coefficients=dict(sae.get_coefficients()), dead_neuron_mask=None,
        n_training_steps=0, is_logging_step=logging,
    )  # fmt: skip


def test_a_step_replaces_each_extreme_row_by_the_batchs_median_state(caplog):
    sae = _bae()
    batch = _inject(_states(64), [5, 6])
    screened = screen_step(sae, _step_input(sae, batch)).sae_in
    norms = batch.norm(dim=-1)
    typical = batch[(norms - norms.median()).abs().argmin()]
    assert screened.shape == batch.shape
    assert torch.equal(screened[5], typical) and torch.equal(screened[6], typical)
    others = [i for i in range(64) if i not in (5, 6)]
    assert torch.equal(screened[others], batch[others])
    assert outliers_set_aside(sae) == 2
    with caplog.at_level("WARNING", logger="sae_lens_bae.outliers"):
        screen_step(sae, _step_input(sae, batch, logging=True))
    assert outliers_set_aside(sae) == 4 and "4 minibatch rows set aside" in caplog.text
    clean = _states(64)
    assert torch.equal(screen_step(sae, _step_input(sae, clean)).sae_in, clean)
    sae.cfg = replace(sae.cfg, extreme_norm_ratio=None)  # the option to keep them
    assert screen_step(sae, _step_input(sae, batch)).sae_in is batch


def test_the_ratio_is_a_training_config_field_that_round_trips_and_is_checked():
    cfg = bae_config(D, 16, extreme_norm_ratio=4.5)
    again = BAETrainingSAEConfig.from_dict(cfg.to_dict())
    assert again.extreme_norm_ratio == 4.5 and again == cfg
    assert BAETrainingSAEConfig.from_dict(replace(cfg, extreme_norm_ratio=None).to_dict()) == (
        replace(cfg, extreme_norm_ratio=None)
    )
    assert BAETrainingSAEConfig(d_in=D, d_sae=16).extreme_norm_ratio == NORM_RATIO
    for bad in (1.0, 0.5, -3.0, math.nan, True, "10"):
        with pytest.raises(ValueError, match="extreme_norm_ratio"):
            bae_config(D, 16, extreme_norm_ratio=bad)


def test_a_saelens_runner_configs_bae_screens_at_its_configs_ratio():
    """The BAE SAELens' runner builds from its config (after the round trip of a saved runner
    config) screens at the config's ratio: the default replaces an extreme row, None keeps it."""
    batch = _inject(_states(64), [9])
    screened = {}
    for ratio in (NORM_RATIO, None):
        runner_cfg = LanguageModelSAERunnerConfig(
            sae=bae_config(D, 16, training_steps=1, extreme_norm_ratio=ratio),
            hook_name="blocks.0.hook_resid_post", dataset_path="", is_dataset_tokenized=True,
            context_size=8, training_tokens=64, train_batch_size_tokens=64, device="cpu",
        )  # fmt: skip
        runner_cfg = LanguageModelSAERunnerConfig.from_dict(runner_cfg.to_dict())
        sae = TrainingSAE.from_dict(  # as SAELens' LanguageModelSAETrainingRunner builds it
            TrainingSAEConfig.from_dict(runner_cfg.get_training_sae_cfg_dict()).to_dict()
        )
        assert isinstance(sae, BAETrainingSAE) and sae.cfg.extreme_norm_ratio == ratio
        screened[ratio] = screen_step(sae, _step_input(sae, batch)).sae_in
        assert outliers_set_aside(sae) == (1 if ratio else 0)
    assert not torch.equal(screened[NORM_RATIO][9], batch[9])
    assert torch.equal(screened[None], batch)


def test_the_count_is_a_buffer_from_construction_and_never_in_a_saved_model(tmp_path):
    """Registered when the training BAE is built (its buffers and state-dict keys do not change
    in its first step: DDP and torch.compile see them all), and not a weight: neither in its
    state dict nor in a saved inference model; an inference BAE has none."""
    from safetensors.torch import load_file as load_weights

    from sae_lens_bae.saes.bae import BAE

    sae = _bae()
    buffers, keys = dict(sae.named_buffers()).keys(), sae.state_dict().keys()
    assert "extreme_rows_set_aside" in buffers and "extreme_rows_set_aside" not in keys
    screen_step(sae, _step_input(sae, _inject(_states(64), [1])))
    assert dict(sae.named_buffers()).keys() == buffers and sae.state_dict().keys() == keys
    weights, cfg_path = sae.save_inference_model(tmp_path)
    assert "extreme_rows_set_aside" not in load_weights(weights)
    saved = json.loads(cfg_path.read_text())
    assert "extreme_norm_ratio" not in saved  # a training field: in the training details only
    assert saved["metadata"]["training_architecture_details"]["extreme_norm_ratio"] == NORM_RATIO
    inference = BAE.load_from_disk(tmp_path)
    assert outliers_set_aside(inference) == 0
    assert "extreme_rows_set_aside" not in dict(inference.named_buffers())


def _weights(sae) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in sae.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_train_sae_on_a_tensor_drops_them_and_trains_as_without_them(caplog):
    x = _states(2048)
    rows = [10, 700, 1500, 2000]
    dirty = _inject(x, rows)
    keep = torch.ones(2048, dtype=torch.bool)
    keep[rows] = False
    kwargs = dict(training_samples=30 * 64, batch_size=64, seed=1)
    with caplog.at_level("WARNING", logger="sae_lens_bae.outliers"):
        run = train_sae(dirty, bae_config(D, 16), **kwargs)
    assert run.outliers_dropped == 4
    assert "training set: 4 of 2048 states set aside as extreme" in caplog.text
    clean = train_sae(x[keep], bae_config(D, 16), outlier_norm_ratio=None, **kwargs)
    assert clean.outliers_dropped == 0
    assert _same(_weights(run.sae), _weights(clean.sae))
    kept = train_sae(dirty, bae_config(D, 16), outlier_norm_ratio=None, **kwargs)
    assert kept.outliers_dropped == 0 and not _same(_weights(kept.sae), _weights(run.sae))


def test_train_sae_on_a_stream_screens_each_minibatch_in_the_step():
    x = _states(64 * 10)
    dirty = _inject(x, [3, 64 * 4 + 1, 64 * 4 + 2])  # batches 0 and 4 of the stream
    batches = lambda data: iter(data.split(64))  # noqa: E731
    cfg = bae_config(D, 16)
    run = train_sae(batches(dirty), cfg, training_samples=10 * 64, batch_size=64)
    assert run.outliers_dropped == 3
    kept = train_sae(
        batches(dirty), cfg, training_samples=10 * 64, batch_size=64, outlier_norm_ratio=None
    )
    assert kept.outliers_dropped == 0
    assert cfg.extreme_norm_ratio == NORM_RATIO  # the caller's config is left as it was
    assert run.sae.cfg.extreme_norm_ratio == NORM_RATIO and kept.sae.cfg.extreme_norm_ratio is None


def test_train_sae_leaves_an_sae_of_another_architecture_alone():
    """Only a BAE's step screens: a stream trains any other SAELens SAE as given, which gets no
    attribute or buffer of the rule."""
    from sae_lens import StandardTrainingSAEConfig

    dirty = _inject(_states(64 * 4), [3])
    cfg = StandardTrainingSAEConfig(d_in=D, d_sae=16)
    run = train_sae(iter(dirty.split(64)), cfg, training_samples=4 * 64, batch_size=64)
    assert run.outliers_dropped == 0 and outliers_set_aside(run.sae) == 0
    assert not any("extreme" in name or "outlier" in name for name in vars(run.sae))
    assert not any("extreme" in name for name, _ in run.sae.named_buffers())


def test_saelens_trainer_streams_through_the_screening_step():
    """SAELens' runners hand their store's batches to ``SAETrainer``, whose step is the BAE's:
    a stream with extreme rows trains exactly as the same stream with each replaced by its
    batch's median state."""
    x = _states(64 * 20)
    dirty = _inject(x, [7, 64 * 3 + 9, 64 * 11])
    typical = dirty.clone()
    for batch in typical.split(64):  # views: what the step puts in their place
        norms = batch.norm(dim=-1)
        extreme = norms > NORM_RATIO * norms.median()
        batch[extreme] = batch[(norms - norms.median()).abs().argmin()].clone()
    trainer_cfg = SAETrainerConfig(total_training_samples=20 * 64, train_batch_size_samples=64,
                                   lr=1e-3, lr_end=1e-3, device="cpu", n_checkpoints=0,
                                   checkpoint_path=None)  # fmt: skip
    trained = []
    for data in (dirty, typical):
        torch.manual_seed(0)
        sae = _bae(20)
        SAETrainer(cfg=trainer_cfg, sae=sae, data_provider=iter(data.split(64))).fit()
        trained.append(sae)
    assert outliers_set_aside(trained[0]) == 3 and outliers_set_aside(trained[1]) == 0
    assert _same(_weights(trained[0]), _weights(trained[1]))


def _dirty_cache(tiny_llama, token_dataset, folder, rows):
    """A harvested cache whose ``rows`` of blocks.0.hook_resid_post are 50x their norm."""
    hook = "blocks.0.hook_resid_post"
    tokens = torch.tensor(token_dataset["input_ids"][:8])
    cache = harvest_activations(tiny_llama, tokens, [hook], folder, progress=False)
    shard = folder / "shard_00000.safetensors"
    tensors = load_file(shard)
    flat = tensors[hook].reshape(-1, tensors[hook].shape[-1])
    flat[rows] *= 50
    save_file(tensors, shard)
    return ActivationCache.load(cache.path), hook


def test_train_sae_on_a_cache_drops_them(tiny_llama, token_dataset, tmp_path):
    rows = [0, 17, 40]
    cache, hook = _dirty_cache(tiny_llama, token_dataset, tmp_path / "cache", rows)
    acts = cache.activations(hook)
    cfg = BAETrainingSAEConfig(d_in=acts.shape[1], d_sae=64)
    kwargs = dict(training_samples=10 * 32, batch_size=32)
    run = train_sae(cache, cfg, **kwargs)
    assert run.outliers_dropped == 3
    keep = outlier_mask(acts)
    assert torch.nonzero(~keep).flatten().tolist() == rows
    clean = train_sae(acts[keep], cfg, outlier_norm_ratio=None, **kwargs)
    assert _same(_weights(run.sae), _weights(clean.sae))


def test_harvest_layer_drops_by_the_same_rule(tiny_hf_llama_dir, tiny_corpus, tmp_path):
    """harvest_layer sets aside what ``outlier_mask`` flags over the whole harvest (a low ratio
    here, so the tiny model's states have some to set aside), and none with None."""
    common = dict(context_size=16, max_sequences=24, progress=False)
    data = harvest_layer(str(tiny_hf_llama_dir), str(tiny_corpus), 1, tmp_path / "a",
                         outlier_norm_ratio=1.2, **common)  # fmt: skip
    acts = ActivationCache.load(tmp_path / "a").activations(data.hook)
    expected = int((~outlier_mask(acts, 1.2)).sum())
    assert 0 < expected < acts.shape[0] and data.outliers_dropped == expected
    kept = data.train[data.hook].shape[0] + data.test[data.hook].shape[0]
    assert kept == acts.shape[0] - expected
    everything = harvest_layer(str(tiny_hf_llama_dir), str(tiny_corpus), 1, tmp_path / "a",
                               outlier_norm_ratio=None, **common)  # fmt: skip
    assert everything.outliers_dropped == 0
    n = everything.train[data.hook].shape[0] + everything.test[data.hook].shape[0]
    assert n == acts.shape[0]


RECIPE = EntropyRecipe.of(expansion=1, steps=20, batch_size=32, lr=4e-3, seeds=1)


def test_estimate_entropies_drops_them_from_each_set():
    x = _states(512)
    rows = [1, 2, 300]
    dirty = _inject(x, rows)
    keep = outlier_mask(dirty)
    [cell] = estimate_entropies([dirty], RECIPE, seeds=[0], bootstrap=0, progress=False)
    [clean] = estimate_entropies([x[keep]], RECIPE, seeds=[0], bootstrap=0, progress=False,
                                 outlier_norm_ratio=None)  # fmt: skip
    assert cell.outliers_dropped == 3 and cell.summary()["outliers_dropped"] == 3
    assert clean.outliers_dropped == 0
    assert cell.bits == clean.bits and cell.n_samples == clean.n_samples == 509
    # evaluation sets given apart are screened too, and counted with the set
    [apart] = estimate_entropies([dirty], RECIPE, eval_sets=[dirty], seeds=[0], bootstrap=0,
                                 progress=False)  # fmt: skip
    assert apart.outliers_dropped == 6 and apart.bits == cell.bits


def test_entropy_estimate_cli_reports_them_and_keeps_them_on_request(tmp_path):
    dirty = _inject(_states(512), [4, 200])
    torch.save(dirty, tmp_path / "states.pt")
    quick = ["--steps", "20", "--batch-size", "32", "--expansion", "1", "--seeds", "1"]
    base = ["entropy", "estimate", "--states", str(tmp_path / "states.pt"), *quick]
    runner = CliRunner()
    for ratio, count in ((None, 2), ("none", 0)):
        out = tmp_path / f"out-{ratio}"
        extra = [] if ratio is None else ["--outlier-norm-ratio", ratio]
        result = runner.invoke(app, [*base, "--out", str(out), *extra])
        assert result.exit_code == 0, result.output
        [row] = json.loads((out / "entropy.json").read_text())["sets"]
        assert row["outliers_dropped"] == count and row["n_samples"] == 512 - count
        report = (out / "entropy.md").read_text()
        if ratio is None:
            assert "(norm above 10x the set's median norm) set aside before training: states 2" in (
                report
            )
        else:
            assert "Extreme states kept" in report
    result = runner.invoke(app, [*base, "--out", str(tmp_path / "bad"), "--outlier-norm-ratio",
                                 "0.5"])  # fmt: skip
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert re.search("outlier.norm.ratio", result.output)


def test_compare_reports_what_its_harvests_set_aside():
    line = _outlier_line(10.0, {"harvest": 21, "ood": 2})
    assert line == (
        "Extreme states (norm above 10x the median) set aside: 21 of the harvest, 2 of the OOD "
        "text."
    )
    assert _outlier_line(None, {"harvest": 0, "ood": 0}) == (
        "Extreme states kept (--outlier-norm-ratio none)."
    )


def test_bae_train_screens_saelens_runner_batches_and_leaves_special_tokens_out(
    tiny_hf_llama_dir, tiny_corpus, tmp_path, monkeypatch
):
    """``bae train`` (SAELens' runner): SAELens' store leaves BOS, EOS and padding out by token
    id, the BAE's step screens every minibatch at the ratio given (a low one here, so the tiny
    model's states have rows to set aside) and the count is logged; none keeps them all."""
    from sae_lens_bae.training import live

    configs, counts = [], []
    build = live._runner_config
    monkeypatch.setattr(live, "_runner_config", lambda *a: configs.append(build(*a)) or configs[-1])
    report = live.report_outliers
    monkeypatch.setattr(live, "report_outliers", lambda n, *a: counts.append(n) or report(n, *a))
    common = ["train", "--model", str(tiny_hf_llama_dir), "--dataset", str(tiny_corpus),
              "--hook", "blocks.1.hook_resid_post", "--context-size", "32", "--checkpoints",
              "0", "--training-tokens", str(8 * 64), "--batch-size", "64"]  # fmt: skip
    for ratio in ("1.2", "none"):
        result = CliRunner().invoke(app, [*common, "--out", str(tmp_path / ratio),
                                          "--outlier-norm-ratio", ratio])  # fmt: skip
        assert result.exit_code == 0, result.output
    assert [c.exclude_special_tokens for c in configs] == [True, True]
    assert counts[0] > 0 and counts[1] == 0


def test_the_benchmark_sets_aside_exactly_the_injected_states(tmp_path, capsys):
    """benchmarks/outliers.py at a toy size: with the rule every injected state (30x) is set
    aside and no other, without it none; each change is against the run without any."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "outliers.py"
    spec = importlib.util.spec_from_file_location("outliers_benchmark", path)
    assert spec is not None and spec.loader is not None
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    out = tmp_path / "bench"
    report = benchmark.main(["--out", str(out), "--n", "2048", "--steps", "5", "--seeds", "0",
                             "--shares", "0.01", "--factors", "30"])  # fmt: skip
    runs = {(r["share"], r["policy"]): r for r in report["runs"]}
    assert runs[(0.01, "drop")]["injected"] == 20 and runs[(0.01, "drop")]["set_aside"] == 20
    assert runs[(0.01, "keep")]["set_aside"] == 0 and runs[(0.0, "drop")]["set_aside"] == 0
    clean = runs[(0.0, "drop")]["explained_variance"]
    for row in report["table"]:
        expected = runs[(row["share"], row["policy"])]["explained_variance"] - clean
        assert row["ev_change"] == pytest.approx(expected)
    assert {p.name for p in out.iterdir()} == {"outliers.json", "outliers.md", "outliers.png"}
    with pytest.raises(SystemExit) as exit_:
        benchmark.main(["--out", str(out), "--shares", "2"])
    assert exit_.value.code == 2 and "--shares must be fractions" in capsys.readouterr().err


def test_nan_and_infinite_states_are_left_for_the_checks_that_refuse_them():
    x = _states(100)
    x[3, 0], x[4, 1] = float("nan"), float("inf")
    x[5] *= 50
    assert torch.nonzero(~outlier_mask(x)).flatten().tolist() == [5]


def test_a_set_of_median_norm_zero_has_no_extreme_state():
    x = torch.zeros(100, D)
    x[:10] = _states(10)
    assert bool(outlier_mask(x).all())
    sae = _bae()
    assert torch.equal(screen_step(sae, _step_input(sae, x)).sae_in, x)
    assert outliers_set_aside(sae) == 0
