"""Hidden-state compression (compress/decompress, packed format) and the more-bit benchmark."""

from __future__ import annotations

import json
import math

import matplotlib.image
import pytest
import torch

from sae_lens_bae import (
    BAE,
    BAEConfig,
    BAETrainingSAE,
    BAETrainingSAEConfig,
    compress,
    decompress,
)
from sae_lens_bae.compression import (
    LOSSLESS_THRESHOLD,
    CompressedStates,
    compression_report,
    decoder_bytes,
    pack_uints,
    prior_fingerprint,
    unpack_uints,
)
from sae_lens_bae.saes.binary import bits_to_values


def _bae(bits_per_feature: int = 1, d_in: int = 8, d_sae: int = 32) -> tuple[BAE, torch.Tensor]:
    """A BAE whose codes are sparse around a known prior (encoder bias pushes most bits off)."""
    torch.manual_seed(0)
    bae = BAE(BAEConfig(d_in=d_in, d_sae=d_sae, bits_per_feature=bits_per_feature))
    with torch.no_grad():
        bae.b_enc.fill_(-1.5)
        bae.b_enc[:3] = 2.0  # three bits mostly on: their prior rounds to 1
    prior = torch.rand(bae.cfg.n_bits, generator=torch.Generator().manual_seed(1)) * 0.3
    prior[:3] = 0.9
    prior[3] = 0.5  # a tie: round(0.5) is 0 here, and a 0 bit must not count as a flip
    return bae, prior


@pytest.mark.parametrize("width", [1, 5, 12, 17])
def test_pack_unpack_round_trip(width):
    values = torch.randint(0, 2**width, (1001,), generator=torch.Generator().manual_seed(width))
    data = pack_uints(values, width)
    assert len(data) == (1001 * width + 7) // 8
    assert torch.equal(unpack_uints(data, width, 1001), values)
    with pytest.raises(ValueError, match="lie in"):
        pack_uints(torch.tensor([2**width]), width)


@pytest.mark.parametrize("bits_per_feature", [1, 2])
def test_lossless_threshold_round_trip_is_exact(bits_per_feature, tmp_path):
    bae, prior = _bae(bits_per_feature)
    h0 = torch.randn(300, 8)
    packed = compress(bae, h0, LOSSLESS_THRESHOLD, prior=prior)
    code = bae.encode_bits(h0)
    assert torch.equal(packed.codes(prior), code)  # the stored flips are the code
    size = packed.save(tmp_path / "c.safetensors")
    loaded = CompressedStates.load(tmp_path / "c.safetensors")
    assert torch.equal(loaded.counts, packed.counts) and torch.equal(loaded.indices, packed.indices)
    restored = decompress(bae, loaded, prior=prior)
    assert torch.equal(restored, bae.decode(bits_to_values(code, bits_per_feature)))
    base = (prior > 0.5).float()
    assert torch.equal(packed.counts, (code != base).sum(-1))  # only flips are stored
    # the file: 8 bytes of header length, the header, then the bit-packed counts and indices
    # (ceil(log2(n_bits + 1)) and ceil(log2 n_bits) bits each) or the n x n_bits bitmap
    header = int.from_bytes((tmp_path / "c.safetensors").read_bytes()[:8], "little")
    n_bits = code.shape[1]
    flips = int(packed.counts.sum())
    as_indices = (math.ceil(300 * math.ceil(math.log2(n_bits + 1)) / 8)
                  + math.ceil(flips * math.ceil(math.log2(n_bits)) / 8))  # fmt: skip
    assert size == 8 + header + min(as_indices, math.ceil(300 * n_bits / 8))
    # the file says which prior it was made with: another one is refused, not silently used
    assert loaded.prior_key == packed.prior_key == prior_fingerprint(prior)
    other = prior.clone()
    other[5] = 0.9  # rounds differently at one bit
    with pytest.raises(ValueError, match="another prior"):
        decompress(bae, loaded, prior=other)
    near = prior.clone()
    near[5] = 0.4  # rounds the same: the same codes, accepted
    assert torch.equal(decompress(bae, loaded, prior=near), restored)


def test_higher_thresholds_keep_fewer_flips_and_errors():
    bae, prior = _bae()
    h0 = torch.randn(300, 8)
    counts = [compress(bae, h0, t, prior=prior).counts.sum() for t in (-1.0, -0.5, -0.2, 0.0)]
    assert all(a >= b for a, b in zip(counts, counts[1:], strict=False))
    top = compress(bae, h0, 0.0, prior=prior)  # only bits whose prior is exactly 0 or 1
    surprising = ((bae.encode_bits(h0) - prior).abs() >= 1.0 - 1e-6).sum()
    assert top.counts.sum() == surprising
    with pytest.raises(ValueError, match="threshold"):
        compress(bae, h0, -1.5, prior=prior)
    with pytest.raises(ValueError, match="d_in"):
        compress(bae, torch.randn(4, 9), prior=prior)
    with pytest.raises(ValueError, match="prior"):
        top.codes(torch.rand(5))


def test_compression_report_measures_size_and_error():
    bae, prior = _bae()
    h0 = torch.randn(200, 8)
    rows = compression_report(bae, h0, (-1.0, 0.0), prior=prior)
    assert [r["threshold"] for r in rows] == [-1.0, 0.0]
    for row in rows:
        assert row["original_bytes_float32"] == 200 * 8 * 4
        assert row["ratio_float32"] == pytest.approx(200 * 8 * 4 / row["bytes"])
        # decoder weights and bias and the prior, in float32 (the default has no input frame)
        assert row["bytes_with_decoder"] == row["bytes"] + (32 * 8 + 8 + 32) * 4
    exact = decompress(bae, compress(bae, h0, prior=prior), prior=prior)
    assert rows[0]["mse"] == pytest.approx(float((exact - h0).pow(2).mean()), rel=1e-5)
    cosines = [torch.dot(a, b) / (a.norm() * b.norm()) for a, b in zip(exact, h0, strict=True)]
    assert rows[0]["cosine"] == pytest.approx(float(sum(cosines) / len(cosines)), rel=1e-5)


def test_decoder_bytes_count_what_decoding_reads():
    """W_dec, b_dec and the prior of the saved BAE; a framed training BAE's frame is folded into
    the saved weights, so it costs nothing more."""
    framed = BAETrainingSAE(BAETrainingSAEConfig(d_in=8, d_sae=32, input_variance=1.0))
    plain = BAE(BAEConfig(d_in=8, d_sae=32))
    assert decoder_bytes(plain) == 4 * (32 * 8 + 8 + 32) == decoder_bytes(framed)


def test_more_bit_decoding_matches_the_formula_on_hand_made_bits():
    bae, _ = _bae(bits_per_feature=3, d_sae=2)
    bits = torch.tensor([[1.0, 0.0, 1.0, 0.0, 1.0, 1.0]])  # feature 0: 1 + 4 = 5, feature 1: 6
    values = bits_to_values(bits, 3)
    assert torch.allclose(values, torch.tensor([[5 / 7, 6 / 7]]))
    expected = values @ bae.W_dec + bae.b_dec
    assert torch.allclose(bae.decode(values), expected, atol=1e-6)


@pytest.mark.slow
def test_bae_compress_and_more_bits_on_the_tiny_model(tiny_hf_llama_dir, tiny_corpus, tmp_path):
    from sae_lens_bae.experiments import compress, more_bits
    from sae_lens_bae.experiments.compress import CompressionConfig
    from sae_lens_bae.experiments.more_bits import MoreBitsConfig

    common = dict(dataset=str(tiny_corpus), model=str(tiny_hf_llama_dir), context_size=32,
                  max_sequences=64, steps=20, batch_size=128)  # fmt: skip
    summary = compress.run(CompressionConfig(**common, thresholds=(-1.0, -0.5), out=tmp_path / "c"))
    assert [r["threshold"] for r in summary["rows"]] == [-1.0, -0.5]
    assert summary["rows"][0]["flips_per_vector"] >= summary["rows"][1]["flips_per_vector"]
    assert "| -1 |" in (tmp_path / "c" / "compression.md").read_text()
    assert matplotlib.image.imread(tmp_path / "c" / "compression.png").shape[0] > 100

    from sae_lens_bae.comsem.loopback import LoopbackServer

    with LoopbackServer() as server:  # with the ComSem columns, judged by the rule-based server
        settings = MoreBitsConfig(**common, bits_per_feature=(1, 3), comsem_llm="rules",
                                  comsem_base_url=server.base_url, comsem_max_features=2,
                                  out=tmp_path / "m")  # fmt: skip
        result = more_bits.run(settings)
    rows = result["rows"]
    assert "| FA | FI | ComSem |" in (tmp_path / "m" / "more_bits.md").read_text()
    for row, name in zip(rows, ("C1", "C3"), strict=True):
        own = json.loads((tmp_path / "m" / "comsem" / name / "summary.json").read_text())
        assert row["comsem_score"] == own["mean_score"] and own["evaluated"] <= 2
    assert [r["bits_per_feature"] for r in rows] == [1, 3]
    assert [r["n_bits"] for r in rows] == [32, 96]  # decoder width d_in = 32 for every C
    one = BAETrainingSAEConfig(
        d_in=32, d_sae=128
    )  # per feature, the penalties weigh what they do at C = 1
    assert rows[1]["entropy_coefficient"] == pytest.approx(one.entropy_coefficient / 3)
    assert rows[1]["covariance_coefficient"] == pytest.approx(one.covariance_coefficient / 9)
    assert rows[0]["covariance_coefficient"] == pytest.approx(one.covariance_coefficient)
    assert rows[0]["magnitude"] == "burstiness" and rows[1]["magnitude"] == "raw"
    saved = json.loads((tmp_path / "m" / "more_bits.json").read_text())
    assert saved["rows"] == rows
    assert matplotlib.image.imread(tmp_path / "m" / "more_bits.png").shape[0] > 100
    with pytest.raises(ValueError, match="bits_per_feature"):
        MoreBitsConfig(bits_per_feature=(0,))


@pytest.mark.parametrize(("flips", "layout"), [(1, "indices"), (8, "bitmap")])
def test_the_smaller_layout_is_saved_and_round_trips(flips, layout, tmp_path):
    generator = torch.Generator().manual_seed(flips)
    rows = [torch.randperm(16, generator=generator)[:flips].sort().values for _ in range(10)]
    packed = CompressedStates(
        counts=torch.full((10,), flips), indices=torch.cat(rows), n_bits=16, threshold=-1.0
    )
    assert packed.layout() == layout
    packed.save(tmp_path / "s.safetensors")
    loaded = CompressedStates.load(tmp_path / "s.safetensors")
    assert torch.equal(loaded.counts, packed.counts) and torch.equal(loaded.indices, packed.indices)
    prior = torch.full((16,), 0.2)
    assert torch.equal(loaded.codes(prior), packed.codes(prior))
