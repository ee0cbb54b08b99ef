"""The covariance penalty's exact CPU paths for 0/1 codes (int8 matmuls, fp32 matmuls, and the
sparse sums over the entries that are 1, with dense channels flipped) agree with each other and
with torch.cov."""

import pytest
import torch

from sae_lens_bae.kernels import products as covariance_products
from sae_lens_bae.saes import objective as covariance
from sae_lens_bae.saes.objective import covariance_penalty


def reference(codes: torch.Tensor) -> torch.Tensor:
    """Dense torch.cov in float64 per member of a stack, exact zeros snapped to 0 (the subgradient
    of |.| at 0 that the tiles take)."""
    total = []
    for member in codes.reshape(-1, *codes.shape[-2:]):
        cov = torch.cov(member.T)
        cov = torch.where(cov.abs() < 1e-12, cov * 0, cov)
        total.append(cov.abs().sum() - cov.diagonal().abs().sum())
    return torch.stack(total).reshape(codes.shape[:-2])


def codes_with_dense_and_silent_channels(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Sparse 0/1 codes (5% of entries) in which some channels fire on 80-100% of the batch (the
    sparse path flips them) and one block of channels never fires (empty bags)."""
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
    """Odd sizes, tiles that do not divide n (the last ((40, 33), 16) is one channel wide: a
    [1, 16] sign tile whose transpose has strides (1, 1)), stacks."""
    if cache == "recomputed":
        monkeypatch.setattr(covariance, "_SIGN_CACHE_LIMIT", 0)
    codes = codes_with_dense_and_silent_channels(shape, seed=shape[-1])
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
    codes = codes_with_dense_and_silent_channels((64, 90), seed=1)
    whole = covariance_penalty(codes, 16, binary=True)
    bands = [covariance_penalty(codes, 16, binary=True, share=(r, 3)) for r in range(3)]
    assert torch.allclose(sum(bands), whole, rtol=1e-6)


def test_sparse_path_above_4096_samples_is_exact_in_float64(monkeypatch):
    codes = codes_with_dense_and_silent_channels((5000, 24), seed=2)
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
    """One BAE's codes at 3% (or 97%: every channel flips) take the sparse products on CPU; at
    50% the matmuls, for which sparse sums would be slower; so do 45 stacked BAEs (tiles of 128)
    and 200 channels (one tile, narrower than SPARSE_MIN_BLOCK). At 16% the int8 matmuls are
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
