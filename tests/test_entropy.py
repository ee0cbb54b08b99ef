import math

import pytest
import torch

from sae_lens_bae import BAE, BAEConfig, estimate_entropy
from sae_lens_bae.evaluation import evaluate_sae


class FixedCodes:
    """Stands in for a BAE: the 'activations' are the codes themselves."""

    def encode_bits(self, x):
        return x


def H(p):
    return 0.0 if p in (0, 1) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def test_entropy_of_hand_made_codes_over_the_whole_set():
    codes = torch.zeros(8, 3)
    codes[:4, 0] = 1  # p = 1/2
    codes[:2, 1] = 1  # p = 1/4
    estimate = estimate_entropy(FixedCodes(), codes, batch_size=3)  # batches of 3, 3, 2
    assert estimate.bits == pytest.approx(1 + H(0.25))
    assert estimate.firing_rates.tolist() == [0.5, 0.25, 0.0]
    assert estimate.n_samples == 8
    streamed = estimate_entropy(FixedCodes(), iter([codes[:5], codes[5:]]))
    assert streamed.bits == pytest.approx(estimate.bits)


def test_entropy_of_empty_set_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        estimate_entropy(FixedCodes(), iter([]))


def test_evaluate_sae_statistics_match_direct_computation():
    torch.manual_seed(0)
    bae = BAE(BAEConfig(d_in=6, d_sae=10))
    with torch.no_grad():
        bae.b_enc.copy_(torch.linspace(-3, 3, 10))
    x = torch.randn(300, 6)
    stats = evaluate_sae(bae, x, batch_size=64)
    codes = bae.encode(x)
    rates = codes.mean(0)
    out = bae(x)
    assert stats["reconstruction_loss"] == pytest.approx(((out - x) ** 2).mean().item(), rel=1e-5)
    assert stats["l0"] == pytest.approx(codes.sum(1).mean().item(), rel=1e-6)
    assert stats["dead"] == int((rates == 0).sum()) and stats["dense"] == int((rates > 0.5).sum())
    assert stats["dense"] > 0  # the bias ramp makes some features fire on most inputs
    assert stats["entropy_bits"] == pytest.approx(estimate_entropy(bae, x).bits, rel=1e-6)
    sse, sst = ((out - x) ** 2).sum(), ((x - x.mean(0)) ** 2).sum()
    assert stats["explained_variance"] == pytest.approx((1 - sse / sst).item(), rel=1e-5)


def test_evaluate_sae_on_data_without_variance():
    bae = BAE(BAEConfig(d_in=4, d_sae=8))
    stats = evaluate_sae(bae, torch.zeros(10, 4))
    assert stats["explained_variance"] is None and stats["relative_error"] is None
    assert stats["reconstruction_loss"] == pytest.approx(
        bae(torch.zeros(1, 4)).pow(2).mean().item()
    )
