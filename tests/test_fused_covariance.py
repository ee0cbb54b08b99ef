"""The fused Triton covariance kernels against the tiled PyTorch path, value and gradient.

They run where triton can run them: on CUDA, or on CPU under ``TRITON_INTERPRET=1`` (the
interpreter reads the environment when the kernels are defined, at import). On a CPU run without
it, ``test_the_kernels_under_the_triton_interpreter`` runs this file again in a subprocess with
the interpreter on, so the kernels are checked on every machine that has triton.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from sae_lens.saes.sae import TrainStepInput
from torch._dynamo.testing import AotEagerAndRecordGraphs

from sae_lens_bae import BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.kernels import covariance_penalty
from sae_lens_bae.kernels import fused as fused_covariance
from sae_lens_bae.kernels.fused import (
    HAS_TRITON,
    fused_backward,
    fused_backward_from_signs,
    fused_forward,
    fused_on,
    sign_matrix,
    tile_pairs,
)
from sae_lens_bae.kernels.fused_ops import fused_applies

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RUNS_HERE = HAS_TRITON and (torch.cuda.is_available() or INTERPRETED)
here = pytest.mark.skipif(
    not RUNS_HERE,
    reason="run in a subprocess by test_the_kernels_under_the_triton_interpreter"
    if HAS_TRITON
    else "triton is not installed (pip install -e '.[dev]' on Linux x86_64)",
)
BLOCKS = {"block_n": 16, "block_b": 16}  # the smallest tl.dot tiles: many tiles, quick to interpret


def codes(groups: int, batch: int, n: int, density: float, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(groups, batch, n, generator=generator) < density).float().to(DEVICE)


def tiled(x: torch.Tensor, share=(0, 1)) -> tuple[torch.Tensor, torch.Tensor]:
    """The PyTorch path's penalty and gradient (the reference)."""
    x = x.clone().requires_grad_(True)
    with fused_on():
        penalty = covariance_penalty(x, binary=True, share=share, block_size=16)
        penalty.sum().backward()
    return penalty.detach(), x.grad


@here
@pytest.mark.parametrize(
    ("groups", "batch", "n", "density"),
    [(1, 37, 50, 0.3), (3, 40, 33, 0.1), (2, 17, 16, 0.7), (1, 64, 1, 0.5)],
)
def test_fused_kernels_equal_the_tiled_path(groups, batch, n, density):
    """Odd batches and widths, tiles that do not divide n, stacks of G > 1, one bit."""
    x = codes(groups, batch, n, density, seed=n)
    penalty, grad = tiled(x)
    norm = batch * (batch - 1)
    for dtype in (torch.float32, torch.bfloat16):  # read in their own dtype, any float one
        assert (fused_forward(x.to(dtype), **BLOCKS) / norm).tolist() == pytest.approx(
            penalty.tolist(), rel=1e-6
        )
    half = x.bfloat16()
    fused_grad = fused_backward(half, **BLOCKS) * (2 / (batch - 1))
    torch.testing.assert_close(fused_grad, grad, rtol=1e-6, atol=1e-7)
    # the atomic adds sum integers below 2^24: any order gives the same bits
    assert torch.equal(fused_backward(half, **BLOCKS), fused_backward(x, **BLOCKS))
    # the diagonal tiles write the codes as bf16 for backward: every entry, exactly
    copy = torch.full_like(half, 7.0)
    fused_forward(x, **BLOCKS, copy=copy)
    assert torch.equal(copy, half)
    with pytest.raises(ValueError, match="the band whole"):
        fused_forward(x, (0, 2), **BLOCKS, copy=copy)


@here
def test_the_dense_reference_and_the_data_parallel_bands():
    x = codes(2, 29, 45, 0.4, seed=1)
    norm = 29 * 28
    full = fused_forward(x, **BLOCKS) / norm
    for g in range(2):
        cov = torch.cov(x[g].T.cpu().double())
        dense = cov.abs().sum() - cov.diagonal().abs().sum()
        assert float(full[g]) == pytest.approx(float(dense), rel=1e-6)
    # three ranks' bands of tiles add up to the whole, and each equals the tiled path's band
    bands = [fused_forward(x, (rank, 3), **BLOCKS) / norm for rank in range(3)]
    torch.testing.assert_close(sum(bands), full)
    for rank, band in enumerate(bands):
        assert band.float().tolist() == pytest.approx(tiled(x, (rank, 3))[0].tolist(), rel=1e-6)
    tile_i, tile_j, count = tile_pairs(45, 16, (0, 1), torch.device("cpu"))
    assert (tile_i.tolist(), tile_j.tolist(), count) == ([0, 0, 0, 1, 1, 2], [0, 1, 2, 1, 2, 2], 6)


@here
@pytest.mark.parametrize("scale", [1.0, 2.5e-3])
def test_covariance_penalty_takes_the_kernels_and_its_gradient(scale):
    """Through ``covariance_penalty`` (autograd): the fused route, chosen for binary codes on a
    fused device, gives the tiled path's value and gradient times any upstream gradient, and
    times a ``scale`` applied inside the kernels."""
    x = codes(2, 33, 40, 0.25, seed=2)
    penalty, grad = tiled(x)
    fused_x = x.clone().requires_grad_(True)
    with fused_on(DEVICE):
        fused = covariance_penalty(fused_x, binary=True, scale=scale)
        (fused * torch.tensor([1.0, -3.0], device=DEVICE)).sum().backward()
        assert fused_applies(x, 4096) and not fused_applies(x, 32)
    assert not fused_applies(x.cpu(), 4096)  # restored: CPU codes take the tiled path again
    torch.testing.assert_close(fused.detach(), scale * penalty, rtol=1e-6, atol=0)
    torch.testing.assert_close(fused_x.grad[0], scale * grad[0], rtol=1e-6, atol=1e-7 * scale)
    torch.testing.assert_close(fused_x.grad[1], -3 * scale * grad[1], rtol=1e-6, atol=1e-7 * scale)


@here
@pytest.mark.parametrize(
    ("groups", "batch", "n", "share"), [(1, 37, 50, (0, 1)), (2, 29, 45, (1, 3))]
)
def test_the_forward_keeps_the_signs_and_backward_multiplies_them(groups, batch, n, share):
    """The sign matrix the forward fills is sign(cov) with a zero diagonal (only the rank's band
    of tiles, zero elsewhere), and the one-matmul backward from it equals the atomic one bit for
    bit."""
    x = codes(groups, batch, n, 0.3, seed=batch)
    half = x.bfloat16()
    signs = sign_matrix(half, share)
    assert signs is not None and signs.dtype == torch.bfloat16
    without = fused_forward(half, share, **BLOCKS)
    assert torch.equal(fused_forward(half, share, **BLOCKS, signs=signs), without)
    block = BLOCKS["block_n"]
    owned = torch.zeros(n, n, dtype=torch.bool)
    for i, j in fused_covariance.band_tiles(-(-n // block), share):
        owned[i * block : (i + 1) * block, j * block : (j + 1) * block] = True
    owned |= owned.T.clone()
    for g in range(groups):
        expected = torch.cov(x[g].T.cpu().double()).sign().fill_diagonal_(0) * owned
        assert torch.equal(signs[g].cpu().double(), expected)
    assert torch.equal(
        fused_backward_from_signs(half, signs), fused_backward(half, share, **BLOCKS)
    )


@here
def test_the_penalty_takes_either_backward_with_the_tiled_gradient(monkeypatch):
    """Through autograd: with the signs kept (the default at this size) and without them
    (``SIGN_CACHE_LIMIT = 0``: tiles recomputed with atomic adds), the codes read by the kernel
    or cast before it (``CODES_IN_KERNEL``), one value and one gradient."""
    x = codes(2, 33, 40, 0.25, seed=3)
    penalty, grad = tiled(x)
    assert sign_matrix(x, (0, 1)) is not None
    kept = fused_covariance.SIGN_CACHE_LIMIT
    for limit, in_kernel in ((kept, True), (kept, False), (0, True)):
        monkeypatch.setattr(fused_covariance, "SIGN_CACHE_LIMIT", limit)
        monkeypatch.setattr(fused_covariance, "CODES_IN_KERNEL", in_kernel)
        fused_x = x.clone().requires_grad_(True)
        with fused_on(DEVICE):
            fused = covariance_penalty(fused_x, binary=True)
            fused.sum().backward()
        torch.testing.assert_close(fused.detach(), penalty, rtol=1e-6, atol=0)
        torch.testing.assert_close(fused_x.grad, grad, rtol=1e-6, atol=1e-7)
    assert sign_matrix(x, (0, 1)) is None


@here
@pytest.mark.parametrize("keep_signs", [True, False])
@pytest.mark.filterwarnings("ignore:Your compiler for AOTAutograd")  # torch's own recorder
def test_a_compiled_penalty_calls_the_kernels_as_one_op_with_the_tiled_gradient(
    monkeypatch, keep_signs
):
    """Inside ``torch.compile`` the penalty of binary codes is one custom op (the kernels), not
    the tiled path's ops: the graph holds it, and the compiled value and gradient (upstream
    gradient per stack member, signs kept or tiles recomputed) are the tiled path's."""
    if not keep_signs:
        monkeypatch.setattr(fused_covariance, "SIGN_CACHE_LIMIT", 0)
    x = codes(2, 33, 40, 0.25, seed=4)
    penalty, grad = tiled(x)
    weights = torch.tensor([1.0, -3.0], device=DEVICE)
    recorded = AotEagerAndRecordGraphs()  # dynamo's graph, then AOT's forward and backward

    def step(x: torch.Tensor) -> torch.Tensor:  # a scale rides along inside the op
        return covariance_penalty(x * 1.0, binary=True, scale=0.5) * 2.0

    compiled = torch.compile(step, fullgraph=True, backend=recorded)
    fused_x = x.clone().requires_grad_(True)
    with fused_on(DEVICE):
        fused = compiled(fused_x)
        (fused * weights).sum().backward()
    torch._dynamo.reset()
    (forward,), (backward,) = recorded.fw_graphs, recorded.bw_graphs
    graphs = str(forward.graph) + str(backward.graph)  # AOT may run the gradient op in forward
    assert "sae_lens_bae.fused_covariance_penalty" in str(forward.graph)
    assert "sae_lens_bae.fused_covariance_gradient" in graphs
    assert "mm" not in graphs  # no tile of the PyTorch path
    torch.testing.assert_close(fused.detach(), penalty, rtol=1e-6, atol=0)
    torch.testing.assert_close(fused_x.grad, grad * weights.view(2, 1, 1), rtol=1e-6, atol=1e-7)


@here
@pytest.mark.filterwarnings("ignore:Your compiler for AOTAutograd")
def test_a_compiled_bae_training_step_takes_the_op_with_the_eager_loss_and_gradients():
    """The whole training step, as ``bae train --compile`` hands it to torch.compile: its
    objective's penalty is the op, and its loss and gradients are the eager step's (which runs
    the kernels through the autograd Function)."""
    torch.manual_seed(0)
    sae = BAETrainingSAE(BAETrainingSAEConfig(d_in=16, d_sae=64, entropy_off_steps=25))
    sae = sae.to(DEVICE)
    x = torch.randn(128, 16, generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def loss_and_grads(forward):
        sae.zero_grad(set_to_none=True)
        step = TrainStepInput(x, {"entropy": 1e-3, "covariance": 1e-3}, None, 60, False)
        loss = forward(step).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in sae.parameters()]

    recorded = AotEagerAndRecordGraphs()
    compiled = torch.compile(sae.training_forward_pass, fullgraph=True, backend=recorded)
    with fused_on(DEVICE):
        eager_loss, eager_grads = loss_and_grads(sae.training_forward_pass)
        loss, grads = loss_and_grads(compiled)
    torch._dynamo.reset()
    assert "sae_lens_bae.fused_covariance_penalty" in str(recorded.fw_graphs[0].graph)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-6, atol=0)
    for grad, eager_grad in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(grad, eager_grad, rtol=1e-5, atol=1e-8)


@pytest.mark.slow
@pytest.mark.skipif(
    RUNS_HERE or not HAS_TRITON,
    reason="the kernels ran directly in this run" if HAS_TRITON else "triton is not installed",
)
def test_the_kernels_under_the_triton_interpreter():
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "13 passed, 1 skipped" in result.stdout, result.stdout[-2000:]
