"""Data-parallel training: 2 gloo ranks (spawned) against one process on the concatenated batch.

One spawn runs everything that needs ranks (it costs two interpreter start-ups): 20 training steps
with checkpoints, and one epoch of each rank's data; the single-process references and the
resume from the 2-rank checkpoint run here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import torch
from sae_lens import StandardTrainingSAE, StandardTrainingSAEConfig
from sae_lens.config import SAETrainerConfig
from torch.optim.optimizer import register_optimizer_step_pre_hook
from typer.testing import CliRunner

from sae_lens_bae import BAETrainingSAEConfig, harvest_activations, train_sae
from sae_lens_bae.activations.cache import ActivationCache
from sae_lens_bae.parallel.distributed import (
    data_parallel,
    rank_batches,
    rank_cache_batches,
    spawn_local,
)
from sae_lens_bae.parallel.global_batch import GlobalBatch
from sae_lens_bae.saes.input_frame import fix_frame, module_frame
from sae_lens_bae.stacks.model import StackedBAE
from sae_lens_bae.training.checkpoints import (
    COMPLETE_MARKER,
    latest_checkpoint,
    mark_complete,
    read_marker,
)
from sae_lens_bae.training.trainer import RecordingTrainer, activation_batches

pytestmark = pytest.mark.slow  # ranks are spawned processes (torchrun or torch.multiprocessing)

D_IN, D_SAE, BATCH, STEPS, WORLD = 16, 64, 32, 20, 2
ROWS = 700  # 10 global batches of 64 per epoch, 60 rows dropped: epochs wrap inside 20 steps
TERMS = ("mse_loss", "entropy_loss", "covariance_loss")


def _config() -> BAETrainingSAEConfig:
    # entropy on after 3 steps: every part of the step runs in 20 steps (an input frame is fixed
    # on the training set before the first step, the same on every rank: the stack's test has one)
    return BAETrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, entropy_off_steps=3)


def _activations() -> torch.Tensor:
    return torch.randn(ROWS, D_IN, generator=torch.Generator().manual_seed(0))


EXTREME = [5, 77, 300, 301, 650]
"""Rows of ``_activations`` made extreme (50x their norm) in the streamed runs."""


def _dirty() -> torch.Tensor:
    x = _activations()
    x[EXTREME] *= 50
    return x


def _train(
    out: Path, batch_size: int, distributed: bool, data: Any = None, **kwargs: Any
) -> dict[str, Any]:
    """Train (on ``data``, default ``_activations()``), recording every step's gradients (after
    clipping, as the optimizer sees them)."""
    grads: list[list[torch.Tensor]] = []

    def record(optimizer: Any, *_: Any) -> None:
        grads.append([p.grad.clone() for g in optimizer.param_groups for p in g["params"]])

    handle = register_optimizer_step_pre_hook(record)
    try:
        run = train_sae(_activations() if data is None else data, _config(),
                        training_samples=STEPS * 2 * BATCH,
                        batch_size=batch_size, lr=1e-2, seed=3, record_every=1,
                        distributed=distributed, **kwargs)  # fmt: skip
    finally:
        handle.remove()
    result = {"history": run.history, "grads": grads, "state": run.sae.state_dict(),
              "set_aside": run.outliers_dropped}  # fmt: skip
    torch.save(result, out)
    return result


def _stacked_steps(rank: int | None, steps: int = 10) -> dict[str, Any]:
    """``steps`` steps of a stack of two BAEs (input frames, the entropy term on after 2):
    with ``rank``, that rank's half of every global minibatch of 64 rows, gradients averaged over
    the ranks as ``DistributedDataParallel`` averages them."""
    cfg = BAETrainingSAEConfig(
        d_in=D_IN, d_sae=D_SAE, entropy_off_steps=2, input_variance=1.0,
    )  # fmt: skip
    model = StackedBAE(cfg, seeds=[3, 4])
    if rank is not None:
        model.batch = GlobalBatch.of()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    sets = torch.stack([_activations(), 2 * _activations() + 1])
    fix_frame(module_frame(model), sets, cfg.input_variance)  # on each whole set, every rank alike
    terms, grads = [], []
    for n in range(steps):
        x = sets[:, n * WORLD * BATCH : (n + 1) * WORLD * BATCH]
        if rank is not None:
            x = x[:, rank * BATCH : (rank + 1) * BATCH]
        losses = model.losses(x, n)
        losses["loss"].sum().backward()
        for parameter in model.parameters():
            if rank is not None:
                torch.distributed.all_reduce(parameter.grad)
                parameter.grad /= WORLD
        grads.append([parameter.grad.clone() for parameter in model.parameters()])
        terms.append({name: losses[name].detach().clone() for name in TERMS})
        optimizer.step()
        optimizer.zero_grad()
    return {"terms": terms, "grads": grads, "state": model.state_dict()}


def _worker(rank: int, tmp: str, cache_path: str) -> None:
    torch.set_num_threads(1)
    torch.save(_stacked_steps(rank), Path(tmp) / f"stacked{rank}.pt")
    _train(Path(tmp) / f"rank{rank}.pt", BATCH, True,
           checkpoint_dir=Path(tmp) / "ckpt", n_checkpoints=1)  # fmt: skip
    _train(Path(tmp) / f"screened{rank}.pt", BATCH, True, rank_batches(_dirty(), BATCH, seed=3))
    ids = torch.arange(100, dtype=torch.float32)[:, None]  # row i holds i
    epoch = [b[:, 0].long() for b in islice(rank_batches(ids, 8, seed=5), 6)]
    cache = ActivationCache.load(cache_path)
    hook = cache.hooks[0]
    block = cache.rank_sequences(rank, WORLD)
    n_block = cache.activations(hook, sequences=block).shape[0]
    rows = list(islice(rank_cache_batches(cache, hook, 5), n_block // 5))
    torch.save({"tensor": epoch, "cache": rows, "block": (block.start, block.stop)},
               Path(tmp) / f"data{rank}.pt")  # fmt: skip


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, tiny_llama, token_dataset) -> Path:
    tmp = tmp_path_factory.mktemp("ranks")
    tokens = token_dataset.select(range(10))
    cache = harvest_activations(tiny_llama, tokens, ["blocks.0.hook_resid_post"], tmp / "acts",
                                shard_sequences=3, dtype="float32", progress=False)  # fmt: skip
    spawn_local(_worker, WORLD, str(tmp), str(cache.path))
    return tmp


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> bool:
    """Max difference within ``rel`` of the tensor's largest entry."""
    scale = b.abs().max().clamp_min(1e-30)
    return bool(((a.double() - b.double()).abs().max() / scale) <= rel)


def _assert_same_run(ranks: list[dict[str, Any]], single: dict[str, Any]) -> None:
    """Every step's gradients and the final state of rank 0 are the single process's, and the
    ranks end in sync."""
    for step_grads, single_grads in zip(ranks[0]["grads"], single["grads"], strict=True):
        for mine, other in zip(step_grads, single_grads, strict=True):
            assert _close(mine, other)
    for name, value in single["state"].items():
        assert torch.equal(ranks[0]["state"][name], ranks[1]["state"][name]), name  # in sync
        assert _close(ranks[0]["state"][name], value), name


def test_two_ranks_train_the_bae_of_one_process_on_the_concatenated_batch(two_ranks, tmp_path):
    ranks = [torch.load(two_ranks / f"rank{r}.pt") for r in range(WORLD)]
    single = _train(tmp_path / "single.pt", WORLD * BATCH, False)
    assert len(single["history"]) == len(ranks[0]["history"]) == STEPS
    for mine, other in zip(ranks[0]["history"], single["history"], strict=True):  # global loss
        for term in TERMS:
            assert _close(torch.tensor(mine[term]), torch.tensor(other[term])), (term, mine, other)
        assert _close(torch.tensor(sum(mine[t] for t in TERMS)),
                      torch.tensor(sum(other[t] for t in TERMS)))  # fmt: skip
    assert ranks[0]["history"][5]["entropy_loss"] > 0  # the entropy term was on
    assert len(ranks[0]["grads"]) == len(single["grads"]) == STEPS
    _assert_same_run(ranks, single)


def test_two_ranks_screen_extreme_rows_as_one_process_screens_the_concatenated_batch(
    two_ranks, tmp_path
):
    """A stream with extreme rows: the ranks screen their halves against the global minibatch's
    median norm and put the global median-norm state in place of each extreme row, so they
    train the BAE one process trains on the concatenated minibatches (a rank's own median-norm
    state, here, would differ from the global one)."""
    ranks = [torch.load(two_ranks / f"screened{r}.pt") for r in range(WORLD)]
    stream = activation_batches(_dirty(), WORLD * BATCH, seed=3)
    single = _train(tmp_path / "single.pt", WORLD * BATCH, False, stream)
    assert single["set_aside"] > 0  # every rank counts the global minibatches' rows
    assert ranks[0]["set_aside"] == ranks[1]["set_aside"] == single["set_aside"]
    _assert_same_run(ranks, single)
    assert _ranks_own_median_states_would_differ(_dirty())


def _ranks_own_median_states_would_differ(dirty: torch.Tensor) -> bool:
    """Whether, in some global minibatch of the stream, a rank holding an extreme row has a
    median-norm state of its own other than the global minibatch's."""
    for batch in islice(activation_batches(dirty, WORLD * BATCH, seed=3), STEPS):
        norms = batch.norm(dim=-1)
        typical = int((norms - norms.median()).abs().argmin())
        halves = norms.view(WORLD, BATCH)
        for rank, half in enumerate(halves):
            own = rank * BATCH + int((half - half.median()).abs().argmin())
            if (half > 10 * norms.median()).any() and own != typical:
                return True
    return False


def test_two_ranks_train_a_stack_of_baes_as_one_process_on_the_concatenated_batch(two_ranks):
    """The one BAE step with a stack dimension is data-parallel too: per member, the same loss
    terms, gradients and input frames as one process on the global minibatch."""
    ranks = [torch.load(two_ranks / f"stacked{r}.pt") for r in range(WORLD)]
    single = _stacked_steps(None)
    for mine, other in zip(ranks[0]["terms"], single["terms"], strict=True):
        for term in TERMS:
            assert _close(mine[term], other[term]), (term, mine, other)
    assert (ranks[0]["terms"][5]["entropy_loss"] > 0).all()  # the entropy term was on
    _assert_same_run(ranks, single)
    scale = single["state"]["input_scale"]
    assert (scale > 0).all() and _close(scale[0], 2 * scale[1])  # each member its own frame


def test_each_rank_reads_its_rows_and_together_they_cover_every_row_once(two_ranks):
    data = [torch.load(two_ranks / f"data{r}.pt") for r in range(WORLD)]
    # tensor: the ranks' batches, concatenated, are the single-process batches of 2 x 8 rows
    ids = torch.arange(100, dtype=torch.float32)[:, None]
    reference = [b[:, 0].long() for b in islice(activation_batches(ids, 16, seed=5), 6)]
    for k, batch in enumerate(reference):
        assert torch.equal(torch.cat([data[0]["tensor"][k], data[1]["tensor"][k]]), batch)
    seen = torch.cat([torch.cat(d["tensor"]) for d in data])
    assert seen.unique().numel() == seen.numel() == 96  # 6 global batches of 16, 4 rows dropped
    # cache: the blocks partition the sequences; each rank's epoch is its block's rows, once each
    cache = ActivationCache.load(two_ranks / "acts")
    full = cache.activations(cache.hooks[0])
    assert [d["block"] for d in data] == [(0, 5), (5, 10)]
    per_sequence = full.shape[0] // 10
    for d in data:
        rows = torch.cat(d["cache"])
        block = full[d["block"][0] * per_sequence : d["block"][1] * per_sequence]
        assert rows.shape == block.shape
        assert torch.equal(rows[torch.argsort(rows[:, 0])], block[torch.argsort(block[:, 0])])


def test_a_checkpoint_of_two_ranks_resumes_in_one_process(two_ranks, tmp_path):
    ranks = torch.load(two_ranks / "rank0.pt")
    checkpoint = two_ranks / "ckpt"
    marker = read_marker(latest_checkpoint(checkpoint))
    assert 0 < marker["n_training_steps"] < STEPS and marker["world_size"] == WORLD
    assert marker["global_batch_size"] == WORLD * BATCH
    resumed = _train(tmp_path / "resumed.pt", WORLD * BATCH, False, checkpoint_dir=checkpoint,
                     resume=True, n_checkpoints=0)  # fmt: skip
    assert len(resumed["grads"]) == STEPS - marker["n_training_steps"]  # resumed midway
    for name, value in ranks["state"].items():
        assert _close(resumed["state"][name], value), name
    with pytest.raises(ValueError, match="global minibatches of 64 rows.*resume with"):
        _train(tmp_path / "other.pt", BATCH, False, checkpoint_dir=checkpoint, resume=True)


def test_a_cache_block_is_read_from_its_shards_alone(tiny_llama, token_dataset, tmp_path):
    tokens = token_dataset.select(range(10))
    cache = harvest_activations(tiny_llama, tokens, ["blocks.0.hook_resid_post"], tmp_path,
                                shard_sequences=3, dtype="float32", progress=False)  # fmt: skip
    full = cache.activations("blocks.0.hook_resid_post")
    (tmp_path / "shard_00000.safetensors").unlink()  # sequences 0-2: not in rank 1's block
    block = cache.rank_sequences(1, 2)
    assert block == slice(5, 10)
    assert torch.equal(cache.activations("blocks.0.hook_resid_post", sequences=block),
                       full[5 * 31 :])  # fmt: skip
    with pytest.raises(ValueError, match="rank must be in"):
        cache.rank_sequences(2, 2)
    # a checkpoint of 2 ranks reading the cache in blocks: 1 process would read other blocks
    (tmp_path / "ckpt" / "64").mkdir(parents=True)
    mark_complete(tmp_path / "ckpt" / "64", n_training_samples=64, n_training_steps=1,
                  batches_read=1, global_batch_size=64, world_size=2,
                  data="cache blocks")  # fmt: skip
    refused = r"written by 2 rank\(s\), this run has 1: a cache is read"
    with pytest.raises(ValueError, match=refused):
        train_sae(cache, BAETrainingSAEConfig(d_in=32, d_sae=128), training_samples=640,
                  batch_size=64, checkpoint_dir=tmp_path / "ckpt", resume=True)  # fmt: skip


def test_data_parallel_refuses_what_it_cannot_train_exactly():
    with pytest.raises(ValueError, match="needs torch.distributed initialised"):
        train_sae(_activations(), _config(), training_samples=64, distributed=True)
    sae = StandardTrainingSAE(StandardTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE))
    trainer = RecordingTrainer(
        cfg=SAETrainerConfig(
            total_training_samples=64,
            train_batch_size_samples=32,
            lr=1e-3,
            lr_end=1e-3,
            device="cpu",
        ),  # fmt: skip
        sae=sae,
        data_provider=iter([]),
    )
    with pytest.raises(TypeError, match="data_parallel trains BAEs"):
        data_parallel(trainer)


LIVE = ["--hook", "blocks.1.hook_resid_post", "--context-size", "32", "--batch-size", "128",
        "--training-tokens", str(24 * 128), "--checkpoints", "2", "--seed", "5"]  # fmt: skip


def _torchrun(model: Path, corpus: Path, out: Path, *extra: str) -> None:
    """``torchrun --nproc_per_node 2 -m sae_lens_bae train --distributed ...``, as documented."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD),
               "--standalone", "-m", "sae_lens_bae", "train", "--distributed",
               "--model", str(model), "--dataset", str(corpus), "--out", str(out),
               *LIVE, *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


def test_torchrun_live_training_resumes_exactly_on_the_same_ranks(
    tiny_hf_llama_dir, tiny_corpus, tmp_path
):
    from sae_lens import SAE

    from sae_lens_bae.cli import app

    _torchrun(tiny_hf_llama_dir, tiny_corpus, tmp_path / "full")
    checkpoints = sorted(
        (read_marker(m.parent)["n_training_steps"], m.parent)
        for m in (tmp_path / "full").rglob(COMPLETE_MARKER)
    )
    steps, first = checkpoints[0]
    assert 0 < steps < 24 and read_marker(first)["world_size"] == WORLD
    assert (first / "rank_1" / "activations_store_state.safetensors").is_file()
    _torchrun(tiny_hf_llama_dir, tiny_corpus, tmp_path / "resumed", "--resume", str(first))
    full, resumed = SAE.load_from_disk(tmp_path / "full"), SAE.load_from_disk(tmp_path / "resumed")
    for name, tensor in resumed.state_dict().items():
        assert torch.equal(tensor, full.state_dict()[name]), name
    one = CliRunner().invoke(app, ["train", "--model", str(tiny_hf_llama_dir), "--dataset",
                                   str(tiny_corpus), "--out", str(tmp_path / "one"), *LIVE,
                                   "--resume", str(first)])  # fmt: skip
    assert one.exit_code == 2 and "written by 2 rank(s), this run has 1" in one.output


def test_train_says_how_to_launch_distributed_runs(tmp_path, monkeypatch):
    from sae_lens_bae.cli import app

    args = ["train", "--dataset", "x.txt", "--out", str(tmp_path)]
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    alone = CliRunner().invoke(app, [*args, "--distributed"])
    assert alone.exit_code == 2 and "torchrun --nproc_per_node N -m sae_lens_bae" in alone.output
    monkeypatch.setenv("WORLD_SIZE", "2")
    copies = CliRunner().invoke(app, args)
    assert copies.exit_code == 2 and "torchrun started 2 processes: add --distributed" in (
        copies.output
    )
