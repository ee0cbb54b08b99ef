import math

import pytest
import torch

from sae_lens_bae import BAE, BAEConfig, code_entropy
from sae_lens_bae.entropy.estimate import unreliable_reasons
from sae_lens_bae.evaluation import evaluate_sae
from sae_lens_bae.saes.decoder_refit import least_squares_decoder


class FixedCodes:
    """Stands in for a BAE: the 'activations' are the codes themselves, decoded exactly."""

    def encode_bits(self, x):
        return x

    def encode(self, x):
        return x

    def decode(self, codes):
        return codes


def H(p):
    return 0.0 if p in (0, 1) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def test_entropy_of_hand_made_codes_over_the_whole_set():
    codes = torch.zeros(8, 3)
    codes[:4, 0] = 1  # p = 1/2
    codes[:2, 1] = 1  # p = 1/4
    estimate = code_entropy(FixedCodes(), codes, batch_size=3)  # batches of 3, 3, 2
    assert estimate.bits == pytest.approx(1 + H(0.25))
    assert estimate.firing_rates.tolist() == [0.5, 0.25, 0.0]
    assert estimate.n_samples == 8
    assert estimate.n_distinct == 3 and estimate.ceiling_bits == pytest.approx(math.log2(3))
    assert estimate.code_bits == pytest.approx(-(2 * 0.25 * math.log2(0.25) + 0.5 * math.log2(0.5)))
    # bit 1 fires only with bit 0: the sum of marginals (1.81) exceeds log2 3 = 1.58
    assert estimate.relative_error == 0.0 and not estimate.reliable
    streamed = code_entropy(FixedCodes(), iter([codes[:5], codes[5:]]))
    assert streamed.bits == pytest.approx(estimate.bits)


def test_the_ceiling_holds_on_a_set_of_8_distinct_states():
    # 8 equally likely states, each code: its 3 index bits and 3 copies of them
    index = torch.arange(8).repeat(50)
    bits = ((index[:, None] >> torch.arange(3)) & 1).float()
    codes = torch.cat([bits, bits], dim=1)
    estimate = code_entropy(FixedCodes(), codes, batch_size=64)
    assert estimate.n_samples == 400 and estimate.n_distinct == 8
    assert estimate.ceiling_bits == 3.0 and estimate.code_bits == pytest.approx(3.0)
    assert estimate.bits == pytest.approx(6.0)  # sum over 6 fair bits: twice the truth
    assert not estimate.reliable  # above the ceiling, though the reconstruction is exact
    halves = code_entropy(FixedCodes(), codes[:, :3])
    assert halves.bits == pytest.approx(3.0) and halves.reliable


class TwoBitCodes:
    """Stands in for a BAE that codes only the first two coordinates (the others carry little
    variance), its two bits written ``copies`` times."""

    def __init__(self, copies: int) -> None:
        self.copies = copies

    def encode_bits(self, x):
        return torch.cat([(x[:, :2] > 0.5).float()] * self.copies, dim=1)

    encode = encode_bits

    def decode(self, codes):
        return torch.cat([codes[:, :2], torch.zeros(codes.shape[0], 4)], dim=1)


def test_dependent_bits_below_the_ceiling_are_flagged_by_their_excess():
    # 64 states (ceiling 6 bits), 20 of each; 2 coordinates hold nearly all the variance
    index = torch.arange(64).repeat(20)
    states = ((index[:, None] >> torch.arange(6)) & 1).float() * torch.tensor([1, 1] + [0.05] * 4)
    correction = 3 / (2 * 1280 * math.log(2))  # Miller-Madow: 4 codes in 1280 states
    single = code_entropy(TwoBitCodes(1), states)
    assert single.n_codes == 4 and single.code_bits == pytest.approx(2.0)
    assert single.excess_bits == pytest.approx(-correction) and single.state_bits == 6.0
    # reconstructed and not double-counted, but 4 of the set's 6 bits merged: not its entropy
    assert not single.reliable
    assert unreliable_reasons(
        single.bits, 6.0, single.relative_error, single.excess_bits, state_bits=6.0, code_bits=2.0
    ) == ["the code merges states: 2.00 of the set's 6.00 bits kept"]
    # SSE: the 4 small coordinates' squares (c^2 / 2 each); variance: 1/4 and c^2 / 4 each
    assert single.relative_error == pytest.approx((4 * 0.05**2 / 2) / (2 / 4 + 4 * 0.05**2 / 4))
    twice = code_entropy(TwoBitCodes(2), states)
    assert twice.bits == pytest.approx(4.0) and twice.bits < twice.ceiling_bits == 6.0
    assert twice.excess_bits == pytest.approx(2.0 - correction)
    assert not twice.reliable  # within the ceiling, reconstructed: only the excess catches it
    # too few states per code to measure the joint entropy: no excess, no verdict from it
    codes = torch.randint(0, 2, (300, 8), generator=torch.Generator().manual_seed(0)).float()
    unresolved = code_entropy(FixedCodes(), codes)
    assert unresolved.n_codes > 300 / 16 and unresolved.excess_bits is None


def _halfspace_bae(normals: torch.Tensor, states: torch.Tensor) -> BAE:
    """A BAE on the cube {0,1}^3 whose bit k fires where normals[k] . (2x - 1) > 0, with the
    least-squares decoder of its code on ``states``."""
    bae = BAE(BAEConfig(d_in=3, d_sae=normals.shape[0], apply_b_dec_to_input=False))
    with torch.no_grad():
        bae.W_enc.copy_(2 * normals.T)
        bae.b_enc.copy_(-normals.sum(1))
        weights, bias = least_squares_decoder(bae.encode_bits(states), states)
        bae.W_dec.copy_(weights)
        bae.b_dec.copy_(bias)
    return bae


def test_a_three_in_four_code_reconstructs_exactly_and_only_its_excess_flags_it():
    """The code ``EntropyRecipe`` settles in on a third to a half of sets of 8 planted bits at
    d = 64 (docs/research/heldout-sets.md): 3 bits written as 4 fair threshold bits, the
    tetrahedron's normals. They are pairwise uncorrelated (the covariance term does not see them)
    and decode to the bits linearly, so the reconstruction is exact, and the sum of their entropies
    is 4 bits for 3. Each state here is distinct (ceiling log2 4000), so only the excess over the
    code words' joint entropy says the 4 bits are not the set's."""
    generator = torch.Generator().manual_seed(0)
    corners = ((torch.arange(4000)[:, None] >> torch.arange(3)) & 1).float()
    states = corners + 0.01 * torch.randn(4000, 3, generator=generator)
    tetrahedron = torch.tensor([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]]).float()
    codes = _halfspace_bae(tetrahedron, states).encode_bits(states)
    assert torch.cov(codes.T).tolist() == torch.diag(torch.full((4,), 0.25 * 4000 / 3999)).tolist()
    correction = 7 / (2 * 4000 * math.log(2))  # Miller-Madow: 8 code words
    four = code_entropy(_halfspace_bae(tetrahedron, states), states)
    assert four.bits == pytest.approx(4.0) and four.code_bits == pytest.approx(3.0)
    assert four.bits < four.ceiling_bits and four.relative_error < 5e-4  # the noise: 4e-4
    assert four.excess_bits == pytest.approx(1.0 - correction) and not four.reliable
    three = code_entropy(_halfspace_bae(torch.eye(3), states), states)  # the bits themselves
    assert three.bits == pytest.approx(3.0)
    assert three.relative_error == pytest.approx(four.relative_error, rel=1e-3)  # as exact
    assert three.excess_bits == pytest.approx(-correction) and three.reliable


class OutlierCodes:
    """Stands in for a BAE that codes only the far states: two bits (x0 > 5, x0 < -5), decoded
    to their first coordinate exactly; the second coordinate is lost."""

    def encode_bits(self, x):
        return torch.stack([x[:, 0] > 5, x[:, 0] < -5], dim=1).float()

    encode = encode_bits

    def decode(self, codes):
        return torch.stack([10 * (codes[:, 0] - codes[:, 1]), torch.zeros(codes.shape[0])], 1)


def outlier_set(copies: int = 1) -> torch.Tensor:
    """96 distinct states on a circle of radius 0.1 about 0 and 4 at (+-10, 0): the 4 hold 99.8%
    of the variance."""
    angles = torch.arange(96, dtype=torch.float64) * (2 * math.pi / 96)
    typical = 0.1 * torch.stack([angles.cos(), angles.sin()], dim=1)
    far = torch.tensor([[10.0, 0.0], [-10.0, 0.0]], dtype=torch.float64).repeat(2, 1)
    return torch.cat([typical, far]).repeat(copies, 1)


def test_a_code_of_a_few_outlier_states_is_not_reliable():
    estimate = code_entropy(OutlierCodes(), outlier_set(), batch_size=16)
    # SSE: 96 states lose all 0.01 of theirs; variance: 96 * 0.01 + 4 * 100 (the mean is 0)
    assert estimate.relative_error == pytest.approx(0.96 / 400.96)
    # the median state loses 0.01, its squared distance from the median (0, 0): all of it
    assert estimate.typical_relative_error == pytest.approx(1.0)
    assert estimate.bits == pytest.approx(2 * H(0.02))
    assert estimate.ceiling_bits == pytest.approx(math.log2(98))
    assert estimate.excess_bits < 0.1  # within the ceiling, no excess: only the typical error
    assert not estimate.reliable
    exact = code_entropy(FixedCodes(), outlier_set())
    assert exact.typical_relative_error == 0.0 and exact.relative_error == 0.0


def test_the_typical_error_is_read_on_a_uniform_sample_of_a_stream(monkeypatch):
    import sae_lens_bae.entropy.estimate as module

    states = outlier_set(copies=40)  # 4000 states
    whole = code_entropy(OutlierCodes(), states)
    streamed = code_entropy(OutlierCodes(), iter(states.split(16)))
    assert streamed.typical_relative_error == whole.typical_relative_error  # all kept: the same
    monkeypatch.setattr(module, "TYPICAL_SAMPLE", 50)
    sampled = code_entropy(OutlierCodes(), iter(states.split(16)), seed=3)
    assert sampled.typical_relative_error > 0.2 and not sampled.reliable  # on 50 of 4000 too
    reservoir = module._Reservoir(1000, torch.Generator().manual_seed(0))
    for batch in torch.arange(10000.0).split(333):
        reservoir.add(batch[:, None], batch)
    kept = reservoir.errors
    assert reservoir.filled == 1000 and kept.unique().numel() == 1000
    assert torch.equal(reservoir.rows.flatten().double(), kept)  # each row with its own error
    # a uniform sample of 0..9999: its mean within 3 standard errors (2887 / sqrt(1000) = 91)
    assert abs(kept.mean().item() - 4999.5) < 3 * 91


def test_bootstrap_spread_is_zero_on_a_constant_set_and_positive_on_a_random_one():
    constant = code_entropy(FixedCodes(), torch.ones(300, 4), bootstrap=20, seed=1)
    assert constant.bootstrap_std == 0.0 and constant.bits == 0.0
    assert constant.relative_error is None and constant.reliable  # no variance; 0 <= 0 bits
    random = torch.randint(0, 2, (300, 4), generator=torch.Generator().manual_seed(0)).float()
    spread = code_entropy(FixedCodes(), random, batch_size=70, bootstrap=20, seed=1)
    assert spread.bootstrap_std > 0
    again = code_entropy(FixedCodes(), random, batch_size=70, bootstrap=20, seed=1)
    assert again.bootstrap_std == spread.bootstrap_std  # seeded
    assert code_entropy(FixedCodes(), random).bootstrap_std is None


def test_relative_error_of_a_real_bae_matches_its_explained_variance():
    torch.manual_seed(0)
    bae = BAE(BAEConfig(d_in=6, d_sae=10))
    x = torch.randn(200, 6)
    estimate = code_entropy(bae, x, batch_size=64, max_relative_error=10.0)
    stats = evaluate_sae(bae, x)
    assert estimate.relative_error == pytest.approx(1.0 - stats["explained_variance"], rel=1e-6)
    # one definition of the name: the entropy estimate's and the evaluation's agree
    assert stats["relative_error"] == pytest.approx(estimate.relative_error, rel=1e-6)
    shifted = evaluate_sae(bae.to(torch.float64), x.double() + 100.0)  # SSE / SST, not / sum x^2
    assert shifted["relative_error"] == pytest.approx(1.0 - shifted["explained_variance"])
    assert shifted["relative_error"] > 0.5
    assert estimate.reliable == (estimate.bits <= estimate.ceiling_bits)
    strict = code_entropy(bae, x, max_relative_error=estimate.relative_error / 2)
    assert not strict.reliable


def test_entropy_of_empty_set_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        code_entropy(FixedCodes(), iter([]))


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
    assert stats["entropy_bits"] == pytest.approx(code_entropy(bae, x).bits, rel=1e-6)
    sse, sst = ((out - x) ** 2).sum(), ((x - x.mean(0)) ** 2).sum()
    assert stats["explained_variance"] == pytest.approx((1 - sse / sst).item(), rel=1e-5)


def test_evaluate_sae_on_data_without_variance():
    bae = BAE(BAEConfig(d_in=4, d_sae=8))
    stats = evaluate_sae(bae, torch.zeros(10, 4))
    assert stats["explained_variance"] is None and stats["relative_error"] is None
    assert stats["reconstruction_loss"] == pytest.approx(
        bae(torch.zeros(1, 4)).pow(2).mean().item()
    )
