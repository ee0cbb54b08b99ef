"""Feature extraction on hand-built codes and activations: known answers."""

import math
from types import SimpleNamespace

import pytest
import torch

from sae_lens_bae import BAE, BAEConfig, BAETrainingSAE, BAETrainingSAEConfig, burstiness
from sae_lens_bae.features import (
    FeatureRecords,
    code_prior,
    decoder_covariance_norm,
    feature_statistics,
    firing_frequency,
    frequency_counts,
    latent_activity,
    top_k_records,
)


class FixedLatents:
    """An 'SAE' whose feature activations are its inputs, decoded by the identity."""

    device, dtype = "cpu", torch.float32

    def __init__(self, d_sae):
        self.cfg = SimpleNamespace(d_sae=d_sae)
        self.W_dec = torch.eye(d_sae)

    def encode(self, x):
        return x

    def decode(self, acts):
        return acts


class FixedSAE(FixedLatents):
    """The same read as a BAE: its inputs are its binary code too (``encode_bits``)."""

    def encode_bits(self, x):
        return x


def test_burstiness_known_values_and_no_aliasing():
    codes = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    prior = torch.tensor([0.25, 0.5, 0.0])
    kept = prior.clone()
    out = burstiness(codes, prior)
    expected = [[math.log2(0.75), -1.0, -24.0], [-2.0, -1.0, 0.0]]  # dead bit floored at -24
    assert torch.allclose(out, torch.tensor(expected))
    assert torch.equal(prior, kept) and out.data_ptr() != prior.data_ptr()
    out += 1  # the caller's changes do not reach the prior
    assert torch.equal(prior, kept)
    with pytest.raises(ValueError, match="3 bits"):
        burstiness(codes, torch.zeros(4))


def test_code_prior_from_training_buffer_or_evaluation_set():
    torch.manual_seed(0)
    bae = BAE(BAEConfig(d_in=4, d_sae=6))
    x = torch.randn(50, 4)
    evaluation = code_prior(bae, x, source="evaluation", batch_size=7)
    assert torch.allclose(evaluation, bae.encode_bits(x).mean(0))
    with pytest.raises(ValueError, match="no training prior"):
        code_prior(bae)  # never trained: its mean code is all zero
    training = BAETrainingSAE(BAETrainingSAEConfig(d_in=4, d_sae=6))
    training.code_mean.fill_(0.3)
    with pytest.raises(ValueError, match="no training prior"):
        code_prior(training)  # a training BAE's count says: never updated
    training.code_mean_count.fill_(10)
    assert torch.equal(code_prior(training), training.code_mean)
    bae.code_mean.fill_(0.3)  # a saved BAE's prior
    prior = code_prior(bae)
    assert torch.allclose(prior, torch.full((6,), 0.3))
    prior += 1
    assert torch.allclose(bae.code_mean, torch.full((6,), 0.3))  # a copy
    with pytest.raises(ValueError, match="needs the evaluation"):
        code_prior(bae, source="evaluation")


def test_top_k_records_keep_only_active_features_best_first():
    acts = torch.tensor(
        [[0.0, 5.0, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0], [3.0, 4.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]]
    )
    positions = torch.tensor([[0, 1], [0, 2], [1, 1], [1, 2]])
    records = top_k_records(
        FixedSAE(4), acts, positions, torch.tensor([7, 8, 9, 10]), "raw", k=2, batch_size=3
    )
    assert records.features.tolist() == [[1, 2], [0, -1], [1, 0], [-1, -1]]
    assert records.counts().tolist() == [2, 2, 1, 0]
    assert records.activated(min_samples=1) == 2 and records.activated(min_samples=2) == 0
    assert records.samples(1) == [(0, 5.0), (2, 4.0)]
    assert records.samples(0, limit=1) == [(2, 3.0)]
    with pytest.raises(IndexError):
        records.samples(4)
    # ties (a BAE bit's burstiness is the same wherever it fires): seeded random order
    zeros = torch.zeros(50, 2, dtype=torch.long)
    tied = FeatureRecords(zeros[:, :1], torch.ones(50, 1), zeros, torch.arange(50), 1, "burstiness")
    assert [i for i, _ in tied.samples(0, limit=5)] == [0, 1, 2, 3, 4]  # data order
    shuffled = [i for i, _ in tied.samples(0, limit=5, seed=1)]
    assert shuffled == [i for i, _ in tied.samples(0, limit=5, seed=1)] != [0, 1, 2, 3, 4]
    assert records.samples(1, seed=3) == [(0, 5.0), (2, 4.0)]  # no ties: by magnitude
    # z-scored per latent: latent 2 (small values, rare) now outranks latent 1 on token 2
    rescaled = top_k_records(FixedLatents(4), acts, positions, torch.arange(4), "rescaled", k=1)
    raw_mean, raw_std = acts[:, 2].mean(), acts[:, 2].std(unbiased=False)
    assert rescaled.magnitudes[0, 0].item() == pytest.approx(((1.0 - raw_mean) / raw_std).item())
    assert rescaled.features[0, 0].item() == 2
    with pytest.raises(ValueError, match="3 token positions"):
        top_k_records(FixedSAE(4), acts, positions[:3], torch.arange(4), "raw")


def test_top_k_records_by_burstiness_prefer_rare_bits():
    codes = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    prior = codes.mean(0)  # bit 0: 1/4, bit 1: always, bit 2: 1/4
    records = top_k_records(
        FixedSAE(3), codes, torch.zeros(4, 2).long(), torch.arange(4), "burstiness",
        k=1, prior=prior, candidates="firing",
    )  # fmt: skip
    # an always-on bit is never surprising: log2|1 - 1| is the floor, below a rare bit's log2(3/4)
    assert records.features[:, 0].tolist() == [0, 2, 1, 1]
    with pytest.raises(ValueError, match="prior"):
        top_k_records(FixedSAE(3), codes, torch.zeros(4, 2).long(), torch.arange(4), "burstiness")
    # an SAE without a binary code has no burstiness: refused by name, before any row is read
    with pytest.raises(ValueError, match="^burstiness magnitudes need a binary code; a Fixed"):
        top_k_records(FixedLatents(3), codes, torch.zeros(4, 2).long(), torch.arange(4),
                      "burstiness", prior=prior)  # fmt: skip


def test_decoder_covariance_norm_of_collinear_rows():
    direction = torch.tensor([0.6, 0.8, 0.0])
    scales = torch.tensor([1.0, 2.0, 3.0, 6.0])
    rows = scales[:, None] * direction
    assert decoder_covariance_norm(rows) == pytest.approx(scales.var().item())  # unbiased
    # rows e_1, e_2, e_3: cov = (I - J/3) / 2, whose largest eigenvalue is 1/2
    assert decoder_covariance_norm(torch.eye(3)) == pytest.approx(0.5)


def test_paper_activated_counts_a_mostly_on_bit_that_is_off_on_a_few_tokens():
    # bit 0: on for 42 of 48 tokens, off on tokens 0-5; bit 1: on for tokens 6-17;
    # bit 2: never. Burstiness log2|h - p| with p = (7/8, 1/4, 0)
    codes = torch.zeros(48, 3)
    codes[6:, 0] = 1.0
    codes[6:18, 1] = 1.0
    prior = codes.mean(0)
    args = (FixedSAE(3), codes, torch.zeros(48, 2).long(), torch.arange(48), "burstiness")
    paper = top_k_records(*args, k=1, prior=prior)  # candidates="all": the paper's definition
    firing = top_k_records(*args, k=1, prior=prior, candidates="firing")
    # tokens 0-5: bit 0 off where it is usually on, log2(7/8), beats bit 1's log2(1/4)
    assert paper.features[:6, 0].tolist() == [0] * 6
    # elsewhere bit 0 is in its usual state, log2(1/8), below bit 1's log2(3/4) or log2(1/4)
    assert paper.counts().tolist() == [6, 42, 0]
    assert firing.counts().tolist() == [30, 12, 0]  # tokens 0-5 fire nothing; 6-17: bit 1
    assert paper.activated(min_samples=5) == 2  # bit 0 has its n_I + 1 = 6 records
    stats = feature_statistics(FixedSAE(3), codes, paper, firing_records=firing, n_explain=5,
                               activated_min_samples=12)  # fmt: skip
    assert stats["activated"] == 2 and stats["activated_firing"] == 1


def test_feature_statistics_columns():
    torch.manual_seed(0)
    bae = BAE(BAEConfig(d_in=4, d_sae=8))
    bae.b_enc.data[0] = 100.0  # bit 0 always on: constant and dead on rarity
    x = torch.randn(64, 4)
    records = top_k_records(
        bae, x, torch.zeros(64, 2).long(), torch.arange(64), "burstiness", k=3,
        prior=code_prior(bae, x, source="evaluation"),
    )  # fmt: skip
    stats = feature_statistics(bae, x, records, dense_threshold=0.3, n_explain=4)
    rates = bae.encode_bits(x).mean(0)
    rarity = torch.minimum(rates, 1 - rates)
    assert rates[0] == 1.0 and stats["dead"] == int((rarity == 0).sum()) >= 1
    assert stats["constant"] == int((rarity < 1e-4).sum()) >= 1
    assert stats["dense"] == int((rarity > 0.3).sum())
    assert torch.equal(stats["firing_frequency"], rarity)
    assert stats["activated"] == int((records.counts() > 4).sum())
    assert stats["decoder_covariance_norm"] == pytest.approx(decoder_covariance_norm(bae.W_dec))
    # L0: the bits in their rare state per token (the canonical code's L0), not the bits at 1
    assert stats["l0"] == pytest.approx(rarity.sum().item(), rel=1e-5)
    assert stats["l0"] < rates.sum().item()


def test_constant_counts_a_bit_fixed_at_one_and_sae_statistics_use_firing():
    codes = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    stats = feature_statistics(FixedSAE(3), codes)  # a BAE's code: rarity min(p, 1 - p)
    assert stats["firing_frequency"].tolist() == [0.0, 0.5, 0.25]
    assert stats["constant"] == 1 and stats["dead"] == 1  # bit 0, fixed at 1
    assert stats["dense"] == 2 and stats["l0"] == 0.75
    stats = feature_statistics(FixedLatents(3), codes)  # an SAE's latents: firing rates
    assert stats["firing_frequency"].tolist() == [1.0, 0.5, 0.25]
    assert stats["dead"] == 0 and stats["dense"] == 3 and stats["constant"] == 0
    assert stats["l0"] == 1.75


def test_the_activity_of_a_bit_is_its_rare_state_token_by_token():
    codes = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    majority = codes.mean(0) > 0.5  # bit 0 usually on, bit 1 usually off
    active = latent_activity(FixedSAE(2), codes, majority)
    assert active.tolist() == [[False, True], [False, False], [True, False], [False, False]]
    assert torch.equal(active.float().mean(0), firing_frequency(FixedSAE(2), codes))
    with pytest.raises(ValueError, match="majority"):
        latent_activity(FixedSAE(2), codes)


def test_the_quickstart_table_and_the_firing_plot_count_the_same_dead_and_dense():
    """The quickstart's table (``feature_statistics``) and its plot's legend read one firing
    frequency: a BAE whose raw bits are on for most tokens has dense bits by its raw firing
    rate and none by its rare state; both say the latter."""
    from sae_lens_bae.plots import _firing_histogram, _log_frequency_bins, subplots

    codes = torch.zeros(40, 5)
    codes[:, 0] = 1.0  # always on: dead and constant
    codes[:30, 1] = 1.0  # on for 75%: active (rare state) on 25%, dense
    codes[:2, 2] = 1.0  # 5%
    codes[:1, 3] = 1.0  # 2.5%; latent 4 never on: dead
    for model in (FixedSAE(5), FixedLatents(5)):
        stats = feature_statistics(model, codes)
        frequencies = {"model": stats["firing_frequency"]}
        fig, ax = subplots()
        counts = {"model": frequency_counts(stats["firing_frequency"])}
        _firing_histogram(ax, frequencies, _log_frequency_bins(frequencies), counts, 0.1)
        label = ax.get_legend_handles_labels()[1][0]
        assert label == f"model (5 features, {stats['dead']} dead, {stats['dense']} dense)"
    assert (stats["dead"], stats["dense"]) == (1, 2)  # the SAE: latent 0 fires on every token
    bae = feature_statistics(FixedSAE(5), codes)
    assert (bae["dead"], bae["dense"], bae["constant"]) == (2, 1, 2)


def test_records_save_load_and_context(tmp_path, tiny_hf_llama_dir):
    from transformers import AutoTokenizer

    from sae_lens_bae.features import FeatureRecords

    tokenizer = AutoTokenizer.from_pretrained(tiny_hf_llama_dir)
    sequences = torch.tensor([[1, 10, 11, 12, 13], [1, 20, 21, 22, 23]])
    positions = torch.tensor([[0, 3], [1, 1]])
    acts = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    records = top_k_records(
        FixedSAE(2), acts, positions, torch.tensor([12, 20]), "raw", k=1, sequences=sequences
    )
    assert records.context(0, tokenizer, before=2, after=1) == "w10 w11<<w12>>w13"
    records.save(tmp_path / "r.safetensors")
    loaded = FeatureRecords.load(tmp_path / "r.safetensors")
    assert torch.equal(loaded.features, records.features) and loaded.magnitude == "raw"
    assert loaded.d_sae == 2 and torch.equal(loaded.sequences, sequences)
    assert loaded.off_tokens.tolist() == [[1, -1], [0, -1]]  # each feature is off on one token
    assert not list(tmp_path.glob(".*partial"))
    bare = top_k_records(FixedSAE(2), acts, positions, torch.tensor([12, 20]), "raw", k=1)
    with pytest.raises(ValueError, match="without the token rows"):
        bare.context(0, tokenizer)


def test_detection_negatives_are_tokens_where_the_feature_is_off():
    from sae_lens_bae.comsem import select_samples

    # feature 0 fires on tokens 0-7 (weakly), feature 1 on tokens 0-3 and 8-11 (strongly), k = 1:
    # on tokens 0-3 feature 0 is active but outranked, so absent from the records
    acts = torch.zeros(20, 2)
    acts[:8, 0] = 1.0
    acts[:4, 1] = 5.0
    acts[8:12, 1] = 5.0
    positions = torch.stack([torch.zeros(20), torch.arange(20)], 1).long()
    records = top_k_records(FixedLatents(2), acts, positions, torch.arange(20), "raw", k=1,
                            sequences=torch.arange(20)[None], off_samples=0)  # fmt: skip
    assert records.features[:4, 0].tolist() == [1] * 4  # feature 0 hidden on tokens 0-3
    # from the records alone, sure negatives of feature 0: tokens with an empty slot (nothing
    # fires): 12-19. Not 0-3 (it fires there), nor 8-11 (feature 1 fills the slot: feature 0
    # could hide below it)
    assert records.surely_off(0).nonzero().flatten().tolist() == list(range(12, 20))
    assert records.surely_off(1).nonzero().flatten().tolist() == list(range(12, 20))
    # with off tokens sampled from the full latents (batches of 7 rows: the sample streams),
    # every token where a feature is 0 is known; 5 samples per feature pick 5 of them
    full = top_k_records(FixedLatents(2), acts, positions, torch.arange(20), "raw", k=1,
                         sequences=torch.arange(20)[None], batch_size=7)  # fmt: skip
    assert full.surely_off(0).nonzero().flatten().tolist() == list(range(8, 20))
    assert full.surely_off(1).nonzero().flatten().tolist() == [4, 5, 6, 7, *range(12, 20)]
    few = top_k_records(FixedLatents(2), acts, positions, torch.arange(20), "raw", k=1,
                        off_samples=5, batch_size=7)  # fmt: skip
    for feature in (0, 1):
        sampled = few.off_tokens[feature]  # type: ignore[index]
        assert len(set(sampled.tolist())) == 5 and (acts[sampled, feature] == 0).all()

    class Words:
        def decode(self, ids, skip_special_tokens=False):  # noqa: ARG002
            return " ".join(f"t{i}" for i in ids)

    items = select_samples(records, Words(), n_explain=1, n_test=3, negatives=True, seed=4)
    for item in items:
        assert len(item.negatives) == len(item.test)
        for sample in item.negatives:
            index = int(sample.token.strip()[1:])
            assert acts[index, item.feature] == 0, (item.feature, index)
    # burstiness: a token whose weakest record is a bit in its usual state lists every active bit
    codes = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    bursty = top_k_records(FixedSAE(3), codes, positions[:3], torch.arange(3), "burstiness", k=2,
                           prior=torch.tensor([0.2, 0.2, 0.2]), off_samples=0)  # fmt: skip
    assert bursty.surely_off(2).tolist() == [True, False, False]
    sampled = top_k_records(FixedSAE(3), codes, positions[:3], torch.arange(3), "burstiness", k=2,
                            prior=torch.tensor([0.2, 0.2, 0.2]))  # fmt: skip
    assert sampled.surely_off(2).tolist() == [True, True, False]  # bit 2 is 0 (usual) on 0 and 1
