"""Kill and resume: a run SIGKILLed mid-way (between checkpoints or while writing one) and resumed
ends with exactly the weights, running statistics and history of an uninterrupted run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sae_lens_bae.saes.bae import BAETrainingSAEConfig
from sae_lens_bae.training import train_sae
from sae_lens_bae.training.checkpoints import COMPLETE_MARKER, latest_checkpoint, mark_complete

STEPS, BATCH = 40, 64

SETUP = """
import torch
from sae_lens_bae.saes.bae import BAETrainingSAEConfig

def setup():
    activations = torch.randn(700, 16, generator=torch.Generator().manual_seed(0))
    activations[:, :4] *= 3.0
    cfg = BAETrainingSAEConfig(d_in=16, d_sae=64, entropy_off_steps=10)
    return activations, cfg
"""

CHILD = """
import os, signal, sys
from sae_lens.training.sae_trainer import SAETrainer
from sae_lens_bae.training import trainer as T
from setup_run import setup

mode, kill_at, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode == "between":
    original_step = T.RecordingTrainer.step
    def step(self, batch):
        if self.n_training_steps == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return original_step(self, batch)
    T.RecordingTrainer.step = step
else:  # killed after the weights of a checkpoint are written, before its trainer state
    original_state = SAETrainer.save_trainer_state
    def save_trainer_state(self, path):
        if self.n_training_steps >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return original_state(self, path)
    SAETrainer.save_trainer_state = save_trainer_state
activations, cfg = setup()
T.train_sae(activations, cfg, training_samples=STEPS * BATCH, batch_size=BATCH,
            checkpoint_dir=out, n_checkpoints=4, seed=3)
""".replace("STEPS", str(STEPS)).replace("BATCH", str(BATCH))


def _setup() -> tuple[torch.Tensor, BAETrainingSAEConfig]:
    namespace: dict = {}
    exec(SETUP, namespace)
    return namespace["setup"]()


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "kill_at", "resumed_from"), [
    ("between", 27, 25),  # checkpoints once steps 9, 17, 25 are done (samples > 512, 1024, 1536)
    ("while_writing", 20, 17),  # the third checkpoint is left incomplete: the second is used
])  # fmt: skip
def test_killed_run_resumes_to_the_uninterrupted_weights(tmp_path, mode, kill_at, resumed_from):
    (tmp_path / "setup_run.py").write_text(SETUP)
    checkpoints = tmp_path / "checkpoints"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(kill_at), str(checkpoints)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    newest = latest_checkpoint(checkpoints)
    assert json.loads((newest / COMPLETE_MARKER).read_text())["n_training_steps"] == resumed_from
    if mode == "while_writing":
        partial = [p for p in checkpoints.iterdir() if not (p / COMPLETE_MARKER).exists()]
        assert len(partial) == 1 and (partial[0] / "sae_weights.safetensors").exists()

    activations, cfg = _setup()
    kwargs = dict(training_samples=STEPS * BATCH, batch_size=BATCH, seed=3)
    resumed = train_sae(activations, cfg, checkpoint_dir=checkpoints, resume=True, **kwargs)
    uninterrupted = train_sae(activations, cfg, **kwargs)

    expected = uninterrupted.sae.state_dict()
    got = resumed.sae.state_dict()
    assert set(got) == set(expected)
    assert {"code_mean", "code_mean_count"} <= set(got)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    assert resumed.history == uninterrupted.history
    assert [row["step"] for row in resumed.history] == [0.0, 10.0, 20.0, 30.0]


def test_resume_without_a_complete_checkpoint_says_what_to_do(tmp_path):
    activations, cfg = _setup()
    (tmp_path / "run" / "512").mkdir(parents=True)  # a checkpoint folder without its marker
    with pytest.raises(FileNotFoundError, match="no complete checkpoint under"):
        train_sae(activations, cfg, training_samples=BATCH * 4, batch_size=BATCH,
                  checkpoint_dir=tmp_path / "run", resume=True)  # fmt: skip
    with pytest.raises(ValueError, match="resume=True needs the checkpoint_dir"):
        train_sae(activations, cfg, training_samples=BATCH * 4, batch_size=BATCH, resume=True)


def test_latest_checkpoint_is_the_complete_one_with_most_samples(tmp_path):
    for samples in (512, 2048, 1024):
        (tmp_path / "id" / str(samples)).mkdir(parents=True)
        mark_complete(tmp_path / "id" / str(samples), n_training_samples=samples)
    (tmp_path / "id" / "4096").mkdir()  # killed while writing: no marker
    assert latest_checkpoint(tmp_path) == tmp_path / "id" / "2048"
    assert latest_checkpoint(tmp_path / "id" / "1024") == tmp_path / "id" / "1024"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        latest_checkpoint(tmp_path / "nowhere")


def test_fingerprint_is_the_data_not_how_many_threads_read_it():
    from sae_lens_bae.training.checkpoints import fingerprint

    # every other row sampled, centred: their sum rounds differently on 1 and 2 threads
    data = torch.randn(8192, 576, generator=torch.Generator().manual_seed(0)) * 3
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fingerprint([data], {"lr": 1e-3})
        torch.set_num_threads(2)
        assert fingerprint([data], {"lr": 1e-3}) == one
    finally:
        torch.set_num_threads(threads)
    nudged = data.clone()
    nudged[0, -1] = torch.nextafter(nudged[0, -1], torch.tensor(float("inf")))
    assert fingerprint([nudged], {"lr": 1e-3}) != one  # one ulp of one sampled value
    assert fingerprint([data.half()], {"lr": 1e-3}) != one  # the same values, rounded
    assert fingerprint([data], {"lr": 2e-3}) != one


def test_activation_batches_start_skips_exactly(tmp_path):  # noqa: ARG001
    from sae_lens_bae.training import activation_batches

    data = torch.arange(50.0).reshape(25, 2)
    full = activation_batches(data, 4, seed=1)
    stream = [next(full) for _ in range(20)]  # 6 batches an epoch: crosses three epochs
    later = activation_batches(data, 4, seed=1, start=13)
    for expected in stream[13:]:
        assert torch.equal(next(later), expected)


def test_checkpoints_do_not_change_training(tmp_path: Path):
    activations, cfg = _setup()
    kwargs = dict(training_samples=BATCH * 12, batch_size=BATCH, seed=3)
    with_checkpoints = train_sae(activations, cfg, checkpoint_dir=tmp_path, n_checkpoints=3,
                                 **kwargs)  # fmt: skip
    plain = train_sae(activations, cfg, **kwargs)
    assert len(list(tmp_path.rglob(COMPLETE_MARKER))) == 3
    for name, tensor in plain.sae.state_dict().items():
        assert torch.equal(with_checkpoints.sae.state_dict()[name], tensor), name


LIVE_CHILD = """
import os, signal, sys
from pathlib import Path
from sae_lens.training.sae_trainer import SAETrainer
from sae_lens_bae.training.live import LiveTrainingConfig, train_live

model, corpus, out, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
original_step = SAETrainer.step
def step(self, batch):
    if self.n_training_steps == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return original_step(self, batch)
SAETrainer.step = step
train_live(LiveTrainingConfig(**eval(sys.argv[5]), out=Path(out), model=model, dataset=corpus))
"""

LIVE = dict(hook="blocks.1.hook_resid_post", context_size=32, training_tokens=30 * 128,
            batch_size=128, checkpoints=4, seed=5)  # fmt: skip


@pytest.mark.slow
def test_killed_live_run_resumes_to_the_uninterrupted_weights(tiny_hf_llama_dir, tiny_corpus,
                                                              tmp_path):  # fmt: skip
    from sae_lens import SAE

    from sae_lens_bae.training.live import LiveTrainingConfig, train_live

    killed = tmp_path / "killed"
    child = subprocess.run(
        [sys.executable, "-c", LIVE_CHILD, str(tiny_hf_llama_dir), str(tiny_corpus),
         str(killed), "20", repr(LIVE)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    # 3840 samples, 4 checkpoints: once steps 7, 13, 19 are done (samples > 768, 1536, 2304)
    assert json.loads((latest_checkpoint(killed) / COMPLETE_MARKER).read_text())[
        "n_training_steps"] == 19  # fmt: skip
    config = dict(LIVE, model=str(tiny_hf_llama_dir), dataset=str(tiny_corpus))
    train_live(LiveTrainingConfig(out=killed, resume=killed, **config))
    train_live(LiveTrainingConfig(out=tmp_path / "plain", **config))

    resumed, plain = SAE.load_from_disk(killed), SAE.load_from_disk(tmp_path / "plain")
    expected = plain.state_dict()
    assert set(expected) == {"W_enc", "b_enc", "W_dec", "b_dec", "code_mean"}  # the prior saved
    for name, tensor in resumed.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    sparsity = "sparsity.safetensors"
    from safetensors.torch import load_file

    assert torch.equal(load_file(killed / sparsity)["sparsity"],
                       load_file(tmp_path / "plain" / sparsity)["sparsity"])  # fmt: skip


def test_live_resume_refuses_another_model(tiny_hf_llama_dir, tiny_corpus, tmp_path):
    from sae_lens_bae.training.live import LiveTrainingConfig, train_live

    config = dict(LIVE, model=str(tiny_hf_llama_dir), dataset=str(tiny_corpus),
                  training_tokens=8 * 128)  # fmt: skip
    train_live(LiveTrainingConfig(out=tmp_path, **config))
    with pytest.raises(ValueError, match="holds a d_sae=128 model, these options make d_sae=64"):
        train_live(
            LiveTrainingConfig(out=tmp_path / "again", resume=tmp_path, expansion=2, **config)
        )
