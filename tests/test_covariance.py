"""The covariance penalty's exact CPU paths for 0/1 codes (int8 matmuls, fp32 matmuls, and the
sparse sums over the entries that are 1, with dense bits flipped) agree with each other and
with torch.cov."""

from pathlib import Path

import pytest
import torch

from sae_lens_bae.kernels import covariance_penalty
from sae_lens_bae.kernels import products as covariance_products
from sae_lens_bae.kernels import tiles as covariance
from sae_lens_bae.saes import objective


def reference(codes: torch.Tensor) -> torch.Tensor:
    """Dense torch.cov in float64 per member of a stack, exact zeros snapped to 0 (the subgradient
    of |.| at 0 that the tiles take)."""
    total = []
    for member in codes.reshape(-1, *codes.shape[-2:]):
        cov = torch.cov(member.T)
        cov = torch.where(cov.abs() < 1e-12, cov * 0, cov)
        total.append(cov.abs().sum() - cov.diagonal().abs().sum())
    return torch.stack(total).reshape(codes.shape[:-2])


def codes_with_dense_and_silent_bits(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Sparse 0/1 codes (5% of entries) in which some bits fire on 80-100% of the batch (the
    sparse path flips them) and one block of bits never fires (empty bags)."""
    generator = torch.Generator().manual_seed(seed)
    rates = torch.full(shape[-1:], 0.05)
    rates[::7] = 0.8
    rates[1] = 1.0
    rates[-5:] = 0.0
    return (torch.rand(shape, generator=generator) < rates).float()


PRODUCTS = {"sparse": "SparseProducts", "int8": "Int8Products", "fp32": "DenseProducts"}


def run(codes: torch.Tensor, path: str, monkeypatch, weights=None, **kwargs):
    """Penalty and gradient of (weights * penalty).sum() through the given path (a key of
    PRODUCTS)."""
    for limit in ("SPARSE_DENSITY", "SPARSE_DENSITY_FP32"):
        monkeypatch.setattr(covariance_products, limit, 1.0 if path == "sparse" else -1.0)
    monkeypatch.setattr(
        covariance_products, "SPARSE_MIN_BLOCK", 0
    )  # small tiles, to test many of them
    monkeypatch.setattr(covariance_products, "CPU_INT8", path != "fp32")
    built = {name: [] for name in PRODUCTS}
    for name, attribute in PRODUCTS.items():
        real = getattr(covariance_products, attribute)
        spy = lambda *a, real=real, name=name: built[name].append(a) or real(*a)  # noqa: E731
        monkeypatch.setattr(covariance_products, attribute, spy)
    leaf = codes.clone().requires_grad_()
    penalty = covariance_penalty(leaf, binary=True, **kwargs)
    (penalty * (1.0 if weights is None else weights)).sum().backward()
    assert [name for name in PRODUCTS if built[name]] == [path]
    return penalty.detach(), leaf.grad


@pytest.mark.parametrize("cache", ["cached_signs", "recomputed"])
@pytest.mark.parametrize(
    ("shape", "block"),
    [((96, 37), 8), ((130, 300), 64), ((64, 300), None), ((3, 80, 45), 16), ((2, 2, 50, 33), 10),
     ((40, 33), 16)],
)  # fmt: skip
def test_the_cpu_paths_agree_with_torch_cov(shape, block, cache, monkeypatch):
    """Odd sizes, tiles that do not divide n (the last ((40, 33), 16) is one bit wide: a
    [1, 16] sign tile whose transpose has strides (1, 1)), stacks."""
    if cache == "recomputed":
        monkeypatch.setattr(covariance, "_SIGN_CACHE_LIMIT", 0)
    codes = codes_with_dense_and_silent_bits(shape, seed=shape[-1])
    weights = torch.arange(1.0, codes[..., 0, 0].numel() + 1).reshape(shape[:-2])
    sparse, sparse_grad = run(codes, "sparse", monkeypatch, weights, block_size=block)
    exact_in = codes.double().requires_grad_()
    exact = reference(exact_in)
    (exact * weights).sum().backward()
    assert torch.allclose(sparse.double(), exact, rtol=1e-6)
    error = (sparse_grad.double() - exact_in.grad).norm() / exact_in.grad.norm()
    assert error <= 1e-5
    for path in ("int8", "fp32"):
        dense, dense_grad = run(codes, path, monkeypatch, weights, block_size=block)
        # exact integer tiles every way: the same penalty bit for bit, gradients to rounding
        assert torch.equal(sparse, dense)
        assert torch.allclose(sparse_grad, dense_grad, rtol=1e-6, atol=1e-7)


def test_sparse_path_bands_add_up_to_the_whole(monkeypatch):
    """Each rank's band of tiles (share) through the sparse products sums to the full penalty."""
    monkeypatch.setattr(covariance_products, "SPARSE_MIN_BLOCK", 0)
    codes = codes_with_dense_and_silent_bits((64, 90), seed=1)
    whole = covariance_penalty(codes, 16, binary=True)
    bands = [covariance_penalty(codes, 16, binary=True, share=(r, 3)) for r in range(3)]
    assert torch.allclose(sum(bands), whole, rtol=1e-6)


def test_sparse_path_above_4096_samples_is_exact_in_float64(monkeypatch):
    codes = codes_with_dense_and_silent_bits((5000, 24), seed=2)
    sparse, sparse_grad = run(codes, "sparse", monkeypatch)
    dense, dense_grad = run(codes, "int8", monkeypatch)
    assert sparse.dtype == torch.float64
    assert sparse.item() == dense.item() == pytest.approx(reference(codes.double()).item(), 1e-12)
    assert torch.allclose(sparse_grad, dense_grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize(
    ("rate", "shape", "int8", "sparse"),
    [(0.03, (128, 300), True, True), (0.97, (128, 300), True, True),
     (0.5, (128, 300), True, False), (0.03, (45, 128, 300), True, False),
     (0.03, (128, 200), True, False), (0.16, (128, 300), True, False),
     (0.16, (128, 300), False, True), (0.5, (128, 300), False, False)],
)  # fmt: skip
def test_the_path_follows_the_density_after_flipping_and_the_tile_width(
    rate, shape, int8, sparse, monkeypatch
):
    """One BAE's codes at 3% (or 97%: every bit flips) take the sparse products on CPU; at
    50% the matmuls, for which sparse sums would be slower; so do 45 stacked BAEs (tiles of 128)
    and 200 bits (one tile, narrower than SPARSE_MIN_BLOCK). At 16% the int8 matmuls are
    faster than sparse sums, the fp32 ones slower."""
    built = []
    real = covariance_products.SparseProducts
    monkeypatch.setattr(covariance_products, "SparseProducts",
                        lambda *a: built.append(a) or real(*a))  # fmt: skip
    monkeypatch.setattr(covariance_products, "CPU_INT8", int8)
    codes = (torch.rand(shape, generator=torch.Generator().manual_seed(0)) < rate).float()
    covariance_penalty(codes, binary=True)
    assert bool(built) is sparse


def test_codes_with_no_one_at_all_take_the_sparse_path(monkeypatch):
    penalty, grad = run(torch.zeros(16, 12), "sparse", monkeypatch)
    assert penalty.item() == 0.0
    assert torch.equal(grad, torch.zeros(16, 12))


@pytest.mark.parametrize("path", ["sparse", "int8", "fp32", "real"])
@pytest.mark.parametrize(("shape", "share"), [((96, 37), (0, 1)), ((3, 64, 45), (1, 3))])
def test_the_kernels_equal_the_plain_penalty(path, shape, share, monkeypatch):
    """``kernels.covariance_penalty`` (tiles, any products) and the plain maths of
    ``saes.objective.covariance_penalty`` give one penalty and one gradient per member, for 0/1
    codes through every CPU path, for real-valued codes, and for a rank's share (the plain share
    is 1 / world of the whole, the tiles' a band: the same once the ranks add them up)."""
    for limit in ("SPARSE_DENSITY", "SPARSE_DENSITY_FP32"):
        monkeypatch.setattr(covariance_products, limit, 1.0 if path == "sparse" else -1.0)
    monkeypatch.setattr(covariance_products, "SPARSE_MIN_BLOCK", 0)
    monkeypatch.setattr(covariance_products, "CPU_INT8", path != "fp32")
    codes = codes_with_dense_and_silent_bits(shape, seed=3)
    if path == "real":
        codes = codes + 0.25 * torch.rand(shape, generator=torch.Generator().manual_seed(4))
    binary = path != "real"
    weights = torch.arange(1.0, codes[..., 0, 0].numel() + 1).reshape(shape[:-2])
    totals, grads = [], []
    for penalty in (objective.covariance_penalty, covariance_penalty):
        leaf = codes.clone().requires_grad_()
        world = share[1]
        total = sum(penalty(leaf, binary=binary, share=(r, world), scale=0.5) for r in range(world))
        (total * weights).sum().backward()
        totals.append(total.detach())
        grads.append(leaf.grad)
    torch.testing.assert_close(totals[1], totals[0], rtol=1e-6, atol=0)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(
        totals[0].double(), 0.5 * reference(codes.double()), rtol=1e-6, atol=0
    )


def test_the_package_trains_every_bae_through_the_kernels():
    """The one seam: importing the package plugs the kernels into the training class, so one
    BAE, a stack and a data-parallel run take them; the class's own default is the plain maths."""
    from sae_lens_bae.saes import bae
    from sae_lens_bae.stacks.model import StackedBAE

    assert bae.BAETrainingSAE.covariance_penalty is covariance_penalty
    source = Path(bae.__file__).read_text()
    assert "covariance_penalty = staticmethod(covariance_penalty)" in source
    cfg = bae.BAETrainingSAEConfig(d_in=6, d_sae=8, covariance_coefficient=1.0)
    stack = StackedBAE(cfg, [0])
    calls = []
    original = bae.BAETrainingSAE.covariance_penalty

    def spy(codes, **kwargs):
        calls.append(codes.shape)
        return original(codes, **kwargs)

    bae.BAETrainingSAE.covariance_penalty = staticmethod(spy)
    try:
        stack.losses(torch.randn(1, 32, 6), 0)
    finally:
        bae.BAETrainingSAE.covariance_penalty = staticmethod(original)
    assert calls == [torch.Size([1, 32, 8])]
