"""The package's BAE core is the paper's: with every extra of its own switched off, SAELens'
trainer trains the same weights as the bare BAE (benchmarks/bare_bae.py) on the same batches."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from unittest import mock

import pytest
import torch
from sae_lens.saes.sae import TrainingSAE

from sae_lens_bae import BAETrainingSAEConfig, train_sae

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _bare():
    spec = importlib.util.spec_from_file_location("bare_bae", BENCHMARKS / "bare_bae.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _extras_off(d_in: int, d_sae: int) -> BAETrainingSAEConfig:
    """No input frame, no entropy-off phase, coefficients as given, the paper's sigmoid
    surrogate (a constant learning rate is ``train_sae``'s own default)."""
    return BAETrainingSAEConfig(
        d_in=d_in,
        d_sae=d_sae,
        input_variance=None,
        coefficient_width=None,
        entropy_coefficient=1e-2,
        covariance_coefficient=1e-2,
    )


def _batches(d_in: int, n: int, rows: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    basis = torch.randn(6, d_in, generator=generator)
    return [torch.randn(rows, 6, generator=generator) @ basis + 2.0 for _ in range(n)]


@pytest.mark.parametrize("clipped", [True, False], ids=["saelens-clip", "no-clip"])
def test_the_package_with_its_extras_off_trains_the_bare_bae(clipped):
    bare = _bare()
    d_in, d_sae, seed, lr = 16, 32, 5, 2e-3
    cfg = _extras_off(d_in, d_sae)
    batches = _batches(d_in, n=40, rows=64)
    with torch.random.fork_rng():  # train_sae initialises from its seed this way
        torch.manual_seed(seed)
        start = TrainingSAE.from_dict(cfg.to_dict())
    reference = bare.BareBAE(start.W_enc.data, start.b_enc.data, start.W_dec.data, start.b_dec.data)
    coefficients = cfg.coefficients()  # a_e and a_c against SAELens' summed squared error
    bare.train_bare(
        reference,
        batches,
        a_e=coefficients["entropy"],
        a_c=coefficients["covariance"],
        lr=lr,
        max_grad_norm=1.0 if clipped else None,
    )
    no_clip = mock.patch("torch.nn.utils.clip_grad_norm_")  # SAETrainer's clip, this run only
    with no_clip if not clipped else mock.MagicMock():
        trained = train_sae(
            iter(batches), cfg, training_samples=40 * 64, batch_size=64, lr=lr, seed=seed
        ).sae
    moved = (reference.W_enc.data - start.W_enc.data).abs().max()
    assert moved > 1e-2  # the runs trained: agreement is not two copies of the initialisation
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        torch.testing.assert_close(
            getattr(trained, name).data, getattr(reference, name).data, rtol=1e-4, atol=2e-5
        )


def test_clipping_changes_what_the_bare_bae_learns():
    """The clip the bare loop can switch on is not idle on these batches (so the test above
    tells the clipped run from the unclipped one)."""
    bare = _bare()
    cfg = _extras_off(16, 32)
    start = TrainingSAE.from_dict(cfg.to_dict())
    runs = []
    for max_grad_norm in (1.0, None):
        bae = bare.BareBAE(start.W_enc.data, start.b_enc.data, start.W_dec.data, start.b_dec.data)
        runs.append(bare.train_bare(bae, _batches(16, 40, 64), a_e=0.16, a_c=0.16, lr=2e-3,
                                    max_grad_norm=max_grad_norm))  # fmt: skip
    assert (runs[0].W_dec.data - runs[1].W_dec.data).abs().max() > 1e-3
