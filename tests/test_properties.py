"""Property-based tests (hypothesis): the loss terms on any code set, and save/load round trips of
every artefact the package writes."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sae_lens import SAE

import sae_lens_bae  # noqa: F401  (registers the BAE with SAELens)
from sae_lens_bae.compression import CompressedStates, compress
from sae_lens_bae.features import code_prior, top_k_records
from sae_lens_bae.features.records import FeatureRecords
from sae_lens_bae.kernels import covariance_penalty
from sae_lens_bae.saes.bae import BAE, BAEConfig
from sae_lens_bae.saes.objective import minibatch_entropy

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)


@st.composite
def binary_codes(draw, max_batch: int = 24, max_n: int = 12) -> torch.Tensor:
    batch = draw(st.integers(2, max_batch))
    n = draw(st.integers(1, max_n))
    bits = draw(st.lists(st.booleans(), min_size=batch * n, max_size=batch * n))
    return torch.tensor(bits, dtype=torch.float32).reshape(batch, n)


def _entropy_reference(codes: torch.Tensor) -> float:
    total = 0.0
    for p in codes.double().mean(0).tolist():
        total -= sum(q * math.log2(q) for q in (p, 1 - p) if q > 0)
    return total


@SETTINGS
@given(binary_codes())
def test_minibatch_entropy_is_the_sum_of_bit_entropies_within_0_and_n(codes):
    value = minibatch_entropy(codes).item()
    assert math.isclose(value, _entropy_reference(codes), rel_tol=1e-5, abs_tol=1e-5)
    assert -1e-6 <= value <= codes.shape[1] + 1e-6


@SETTINGS
@given(binary_codes(), st.randoms(use_true_random=False))
def test_covariance_penalty_does_not_depend_on_bit_order(codes, random):
    order = list(range(codes.shape[1]))
    random.shuffle(order)
    assert torch.equal(covariance_penalty(codes[:, order]), covariance_penalty(codes))


@SETTINGS
@given(binary_codes(), st.integers(0, 1), st.integers(0, 12))
def test_covariance_penalty_ignores_a_constant_bit(codes, value, where):
    where = min(where, codes.shape[1])
    constant = torch.full((codes.shape[0], 1), float(value))
    widened = torch.cat([codes[:, :where], constant, codes[:, where:]], dim=1)
    assert torch.equal(covariance_penalty(widened), covariance_penalty(codes))


@st.composite
def bae_configs(draw) -> BAEConfig:
    bits_per_feature = draw(st.integers(1, 3))
    return BAEConfig(
        d_in=draw(st.integers(1, 9)),
        d_sae=draw(st.integers(1, 10)),
        bits_per_feature=bits_per_feature,
        apply_b_dec_to_input=draw(st.booleans()),
    )


@settings(max_examples=25, deadline=None, derandomize=True)
@given(bae_configs(), st.integers(0, 2**16))
def test_a_saved_bae_loads_with_the_same_config_weights_and_outputs(tmp_path_factory, cfg, seed):
    torch.manual_seed(seed)
    bae = BAE(cfg)
    with torch.no_grad():
        for parameter in bae.parameters():
            parameter.normal_()
        bae.code_mean.uniform_()
    folder = tmp_path_factory.mktemp("bae")
    bae.save_model(folder)
    loaded = SAE.load_from_disk(folder)
    assert isinstance(loaded, BAE) and loaded.cfg.to_dict() == bae.cfg.to_dict()
    for name, tensor in bae.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    x = torch.randn(5, cfg.d_in, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(loaded(x), bae(x))


@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.integers(1, 40), st.integers(0, 2**16), st.sampled_from([-1.0, -0.5, 0.0]))
def test_compressed_states_and_records_round_trip(tmp_path_factory, n, seed, threshold):
    torch.manual_seed(seed)
    bae = BAE(BAEConfig(d_in=6, d_sae=16))
    with torch.no_grad():
        bae.code_mean.uniform_()
    x = torch.randn(n, 6)
    folder = tmp_path_factory.mktemp("saved")
    stored = compress(bae, x, threshold)
    stored.save(folder / "states.bin")
    loaded = CompressedStates.load(folder / "states.bin")
    assert torch.equal(loaded.codes(code_prior(bae)), stored.codes(code_prior(bae)))
    assert (loaded.n_bits, loaded.threshold, loaded.prior_key) == (
        stored.n_bits, stored.threshold, stored.prior_key)  # fmt: skip

    positions = torch.stack([torch.arange(n), torch.zeros(n, dtype=torch.long)], 1)
    records = top_k_records(bae, x, positions, torch.arange(n), "burstiness", k=3,
                            prior=code_prior(bae), seed=seed)  # fmt: skip
    records.save(folder / "records.safetensors")
    again = FeatureRecords.load(folder / "records.safetensors")
    for name, value in vars(records).items():
        other = getattr(again, name)
        if isinstance(value, torch.Tensor):
            assert torch.equal(other, value), name
        else:
            assert other == value, name
