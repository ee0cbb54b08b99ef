"""The magnitudes that rank a token's features, on hand-made codes and activations: each
family's own (raw activation, burstiness) and the two every family is read by (rescaled, the
support's burstiness), with the exact records and `activated` counts they give."""

import math

import pytest
import torch

from sae_lens_bae.features import feature_magnitudes, top_k_records
from tests.test_features import FixedLatents, FixedSAE

# 8 tokens, 3 latents: latent 0 large and frequent (5/8), latent 1 small (2/8), latent 2 rare (1/8)
ACTS = torch.tensor(
    [[10, 1, 0], [10, 0, 0], [10, 0, 0], [10, 0, 2], [10, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0]],
    dtype=torch.float32,
)


def _counts(model, magnitude, prior=None, inputs=ACTS):
    n = inputs.shape[0]
    positions = torch.stack([torch.arange(n) // 4, torch.arange(n) % 4], -1)  # 2 sequences
    records = top_k_records(
        model, inputs, positions, torch.arange(n), magnitude, k=1, prior=prior, off_samples=0
    )
    return records


def test_an_sae_read_by_each_magnitude_gives_its_own_records():
    # raw: latent 0's 10 wins wherever it fires; tokens 6-7 fire nothing
    assert _counts(FixedLatents(3), "raw").counts().tolist() == [5, 1, 0]
    # rescaled: z of latent 0's 10 is 0.77, of latent 1's 1 is 1.73, of latent 2's 2 is 2.65
    assert _counts(FixedLatents(3), "rescaled").counts().tolist() == [3, 2, 1]
    # support: log2|1[z != 0] - f|, f = (5, 2, 1) / 8; latent 0 off (log2 5/8) is the top of
    # tokens 6-7, latent 0 on (log2 3/8) loses to latent 1 on (log2 6/8) and latent 2 on
    support = _counts(FixedLatents(3), "support")
    assert support.counts().tolist() == [5, 2, 1]
    assert support.magnitudes[6, 0].item() == pytest.approx(math.log2(5 / 8))
    assert [_counts(FixedLatents(3), m).activated(1) for m in ("raw", "rescaled", "support")] == [
        1,
        2,
        2,
    ]


def test_a_bae_read_by_the_common_magnitudes():
    bae, code = FixedSAE(3), (ACTS != 0).float()  # its code: the support of the SAE above
    native = _counts(bae, "burstiness", prior=code.mean(0), inputs=code)
    support = _counts(bae, "support", inputs=code)
    # the support's burstiness of a binary code is its burstiness under the evaluation prior
    assert torch.equal(native.features, support.features)
    assert support.counts().tolist() == [5, 2, 1]
    # rescaled: a bit's canonical bit (1 in its rare state), z-scored: sqrt((1 - q) / q) when
    # active; bit 0 (on for 5/8) is active where it is off, tokens 5-7; tokens 1, 2, 4: none
    rescaled = _counts(bae, "rescaled", inputs=code)
    assert rescaled.counts().tolist() == [2, 2, 1]
    assert rescaled.magnitudes[6, 0].item() == pytest.approx(math.sqrt(5 / 3), rel=1e-6)
    assert rescaled.features[[1, 2, 4], 0].tolist() == [-1, -1, -1]


def test_records_per_sequence_sum_to_the_counts():
    records = _counts(FixedLatents(3), "support")
    sequences, per_sequence = records.counts_by_sequence()
    assert sequences.tolist() == [0, 1]
    assert per_sequence.tolist() == [[2, 1, 1], [3, 1, 0]]
    assert torch.equal(per_sequence.sum(0), records.counts())


def test_an_unknown_magnitude_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="burstiness, raw, rescaled, support"):
        feature_magnitudes(FixedLatents(3), ACTS, "loudest")
