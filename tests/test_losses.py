import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sae_lens_bae.kernels import covariance_penalty
from sae_lens_bae.kernels import products as covariance_products
from sae_lens_bae.kernels import tiles as covariance
from sae_lens_bae.saes.objective import (
    binary_entropy,
    dense_covariance_penalty,
    minibatch_entropy,
    reconstruction_loss,
)


def H(p: float) -> float:
    return 0.0 if p in (0.0, 1.0) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def test_reconstruction_loss_is_mean_over_batch_and_dims():
    out, target = torch.randn(8, 5), torch.randn(8, 5)
    expected = ((out - target) ** 2).sum() / 40
    assert torch.allclose(reconstruction_loss(out, target), expected)


def test_minibatch_entropy_known_values_and_finite_gradient():
    # 4 samples; bit rates 0.5, 0, 1, 0.25
    codes = torch.tensor(
        [[1, 0, 1, 1], [0, 0, 1, 0], [1, 0, 1, 0], [0, 0, 1, 0]], dtype=torch.float32
    ).requires_grad_()
    h = minibatch_entropy(codes)
    assert h.item() == pytest.approx(H(0.5) + H(0.25), abs=1e-6)
    h.backward()
    assert torch.isfinite(codes.grad).all()
    # p = 0 is pushed down as hard as p = 1/(2 batch) would be, p = 1 pushed up symmetrically
    assert codes.grad[0, 1].item() == pytest.approx(math.log2(7) / 4, rel=1e-4)
    assert codes.grad[0, 2].item() == pytest.approx(-math.log2(7) / 4, rel=1e-4)
    assert codes.grad[0, 0].item() == pytest.approx(0.0, abs=1e-7)


def test_minibatch_entropy_keeps_leading_dims():
    codes = (torch.rand(3, 64, 10) < 0.3).float()
    h = minibatch_entropy(codes)
    assert h.shape == (3,)
    for g in range(3):
        assert h[g] == pytest.approx(minibatch_entropy(codes[g]).item(), rel=1e-6)


def test_binary_entropy_matches_formula_and_rejects_bad_eps():
    p = torch.tensor([0.1, 0.9, 0.5])
    assert binary_entropy(p).item() == pytest.approx(2 * H(0.1) + 1, rel=1e-6)
    with pytest.raises(ValueError, match="eps"):
        binary_entropy(p, eps=0.0)


@pytest.mark.parametrize("shape", [(7,), (3, 7)], ids=["one", "stack"])
def test_binary_entropy_with_a_scale_is_the_entropy_times_it(shape):
    """``scale`` (the objective's a_e, applied inside) gives a_e H(p) and its gradient, with the
    derivative clamped at p in {0, 1} as without it."""
    p = torch.rand(shape, generator=torch.Generator().manual_seed(1))
    p[..., 0], p[..., 1] = 0.0, 1.0
    plain, scaled = p.clone().requires_grad_(), p.clone().requires_grad_()
    weights = torch.arange(1.0, 1.0 + plain[..., 0].numel()).reshape(shape[:-1])
    ((-0.03 * binary_entropy(plain, 0.01)) * weights).sum().backward()
    value = binary_entropy(scaled, 0.01, scale=-0.03)
    (value * weights).sum().backward()
    torch.testing.assert_close(value, -0.03 * binary_entropy(p, 0.01), rtol=1e-6, atol=0)
    torch.testing.assert_close(scaled.grad, plain.grad, rtol=1e-6, atol=0)
    assert scaled.grad[..., 1].neg().reshape(-1).tolist() == pytest.approx(
        (-0.03 * math.log2(99) * weights).reshape(-1).tolist(), rel=1e-5
    )


def dense_reference(codes: torch.Tensor) -> torch.Tensor:
    """torch.cov in float64. Covariances that are exactly 0 (common for binary codes) come out as
    +-1e-17 rounding noise there, whose sign would be arbitrary; they are snapped to 0 so the
    reference takes the same subgradient at 0 as torch.abs does (0)."""
    cov = torch.cov(codes.T)
    cov = torch.where(cov.abs() < 1e-12, cov * 0, cov)
    return cov.abs().sum() - cov.diagonal().abs().sum()


@pytest.mark.parametrize("backward", ["cached_signs", "recomputed"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "real"])
@pytest.mark.parametrize(("n", "block"), [(37, 8), (300, 64), (300, None), (130, 1000)])
def test_covariance_penalty_matches_dense_reference(binary, n, block, backward, monkeypatch):
    if backward == "recomputed":  # the path taken above 2048 bits
        monkeypatch.setattr(covariance, "_SIGN_CACHE_LIMIT", 0)
    torch.manual_seed(n)
    base = (torch.rand(96, n) < 0.2).double() if binary else torch.randn(96, n).double()
    tiled_in = base.float().requires_grad_()
    dense_in = base.clone().requires_grad_()
    tiled = covariance_penalty(tiled_in, block_size=block)
    dense = dense_reference(dense_in)
    assert dense.item() == pytest.approx(dense_covariance_penalty(base).item(), rel=1e-12)
    tiled.backward()
    dense.backward()
    assert abs(tiled.double().item() - dense.item()) <= 1e-5 * dense.item()
    grad_err = (tiled_in.grad.double() - dense_in.grad).norm() / dense_in.grad.norm()
    assert grad_err <= 1e-5


def test_covariance_penalty_float64_and_scaled_gradient():
    codes = (torch.rand(40, 20) < 0.5).double().requires_grad_()
    (3.0 * covariance_penalty(codes, block_size=7)).backward()
    ref_in = codes.detach().clone().requires_grad_()
    (3.0 * dense_reference(ref_in)).backward()
    assert torch.allclose(codes.grad, ref_in.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("path", ["int8", "fp32", "sparse", "real"])
def test_a_scale_inside_the_penalty_is_the_penalty_times_it(path, monkeypatch):
    """``scale`` (the objective's coefficient, applied inside so it costs no kernel) gives what
    multiplying the penalty outside gives, value and gradient, on every CPU path of a stack."""
    monkeypatch.setattr(covariance_products, "CPU_INT8", path != "fp32")
    monkeypatch.setattr(covariance_products, "SPARSE_DENSITY", 1.0 if path == "sparse" else -1.0)
    generator = torch.Generator().manual_seed(5)
    codes = (torch.rand(2, 45, 37, generator=generator) < 0.3).float()
    if path == "real":
        codes = codes + 0.25 * torch.rand(2, 45, 37, generator=generator)
    weights = torch.tensor([1.0, -2.0])
    outside, inside = codes.clone().requires_grad_(), codes.clone().requires_grad_()
    binary = path != "real"
    expected = 2.5e-3 * covariance_penalty(outside, 16, binary=binary)
    (expected * weights).sum().backward()
    scaled = covariance_penalty(inside, 16, binary=binary, scale=2.5e-3)
    (scaled * weights).sum().backward()
    torch.testing.assert_close(scaled, expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(inside.grad, outside.grad, rtol=1e-6, atol=1e-12)


def test_covariance_penalty_counts_each_dependent_pair_twice_and_uncorrelated_ones_never():
    """|cov| summed over the off-diagonal: two identical columns count their covariance twice
    (both (0, 1) and (1, 0)); a constant column and an uncorrelated pair add exactly nothing."""
    codes = torch.zeros(10, 3)
    codes[:5, 0] = 1
    codes[:, 1] = codes[:, 0]
    codes[:, 2] = 1
    cov01 = torch.cov(codes.T)[0, 1].item()
    assert cov01 == pytest.approx(2.5 / 9)  # 10 rows of (x - 1/2)^2 = 1/4, over n - 1
    assert covariance_penalty(codes).item() == pytest.approx(2 * cov01)
    uncorrelated = torch.tensor([[0.0, 0], [0, 1], [1, 0], [1, 1]]).repeat(3, 1)
    assert covariance_penalty(uncorrelated).item() == 0.0


@pytest.mark.parametrize("block", [None, 16])
def test_covariance_penalty_of_a_stack_equals_each_member(block):
    """[G, batch, n] codes (a StackedBAE's) give G penalties and gradients, each equal to the
    penalty of that member alone, binary or not."""
    torch.manual_seed(0)
    for codes in ((torch.rand(2, 3, 64, 40) < 0.3).float(), torch.randn(5, 64, 40)):
        stacked_in = codes.clone().requires_grad_()
        stacked = covariance_penalty(stacked_in, block_size=block)
        assert stacked.shape == codes.shape[:-2]
        (stacked * torch.arange(1.0, stacked.numel() + 1).view(stacked.shape)).sum().backward()
        for index, member in enumerate(codes.reshape(-1, 64, 40)):
            alone_in = member.clone().requires_grad_()
            alone = covariance_penalty(alone_in, block_size=block)
            ((index + 1) * alone).backward()
            assert stacked.flatten()[index].item() == pytest.approx(alone.item(), rel=1e-6)
            member_grad = stacked_in.grad.reshape(-1, 64, 40)[index]
            assert torch.allclose(member_grad, alone_in.grad, rtol=1e-5, atol=1e-7)


def test_binary_codes_of_a_batch_above_4096_stay_exact():
    # B * count - c_i c_j reaches B^2 = 2.5e7 > 2^24: the binary path works in float64 there
    torch.manual_seed(0)
    codes = (torch.rand(5000, 24) < 0.3).float()
    exact = dense_reference(codes.double()).item()
    assert covariance_penalty(codes).double().item() == pytest.approx(exact, rel=1e-12)
    told = covariance_penalty(codes, binary=True)  # what a training step says (no host sync)
    assert told.item() == covariance_penalty(codes).item()


@pytest.mark.parametrize("path", ["bf16", "int8"])
def test_an_out_of_memory_in_the_integer_products_propagates(path, monkeypatch):
    def out_of_memory(*args, **kwargs):  # noqa: ARG001
        raise RuntimeError("out of memory. Tried to allocate 16.00 GiB")

    if path == "bf16":
        monkeypatch.setattr(covariance_products, "CPU_INT8", False)
        monkeypatch.setattr(covariance_products, "_bf16_products", lambda a: True)  # noqa: ARG005
        monkeypatch.setattr(torch, "mm", out_of_memory)
        monkeypatch.setattr(torch, "bmm", out_of_memory)
    else:
        assert covariance_products.cpu_int8_products()  # probed once, before the products fail
        monkeypatch.setattr(torch, "_int_mm", out_of_memory)
    with pytest.raises(RuntimeError, match="out of memory"):
        covariance_penalty((torch.rand(64, 16) < 0.5).float(), binary=True)


def test_covariance_penalty_bad_input():
    with pytest.raises(ValueError, match=r"\[\.\.\., batch, n\]"):
        covariance_penalty(torch.zeros(10))
    with pytest.raises(ValueError, match="at least 2"):
        covariance_penalty(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="block_size"):
        covariance_penalty(torch.zeros(4, 4), block_size=0)


BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "train_step.py"


@pytest.mark.slow
def test_covariance_penalty_peak_memory_stays_tiled():
    """Forward + backward at d_sae = 8192, batch 512 (the path of every code too wide to cache
    its sign tiles, as at 65536) stays under 128 MiB of extra memory (67 MiB measured), where the
    dense torch.cov version takes 1051 MiB. Measured by the benchmark's probe as the peak RSS of a
    fresh process over its RSS once the codes exist, with glibc's mmap threshold fixed so freed
    tiles leave the RSS; the 65536-bit probe is
    ``python benchmarks/train_step.py --probe 65536 512 tiled cpu 0.05``."""
    result = subprocess.run(
        [sys.executable, str(BENCHMARK), "--probe", "8192", "512", "tiled", "cpu", "0.05"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)},
    )
    extra_mib = float(result.stdout.strip().splitlines()[-1].split()[0])  # then its seconds
    assert 0 < extra_mib < 128, extra_mib
