"""``bae bench llm-truth``: the truth of a set of an LLM's states from its tokens, the trust
rule's set-level conditions, and the benchmark's outputs on the tiny model."""

import json
import math

import matplotlib.image
import pytest
import torch

from sae_lens_bae.entropy import EntropyRecipe
from sae_lens_bae.entropy.estimate import (
    code_entropy,
    discrete_set_bits,
    unreliable_reasons,
)
from sae_lens_bae.experiments import llm_truth
from sae_lens_bae.experiments.llm_truth import LLMTruthConfig, parse_cell, token_truth

BOS = 1


def rows(*bodies):
    return torch.tensor([[BOS, *body] for body in bodies])


def test_the_truth_is_the_plug_in_entropy_of_the_distinct_prefixes():
    # position 1: first tokens 5, 5, 6, 7 -> counts 2, 1, 1 of 4: 1.5 bits, 3 distinct
    tokens = rows([5, 9, 3], [5, 9, 4], [6, 9, 3], [7, 8, 3])
    assert token_truth(tokens, 1, embedding=False) == (1.5, 3)
    # position 2: prefixes (5,9), (5,9), (6,9), (7,8) -> the same counts
    assert token_truth(tokens, 2, embedding=False) == (1.5, 3)
    # position 3: every prefix distinct -> log2 4 = 2 bits, though token 3 repeats three times
    assert token_truth(tokens, 3, embedding=False) == (2.0, 4)
    # the embedding hook reads the token at the position alone: 3, 4, 3, 3 -> 3/4, 1/4
    bits, distinct = token_truth(tokens, 3, embedding=True)
    assert distinct == 2 and bits == pytest.approx(
        -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25))
    )
    # at position 2 the embedding sees 9, 9, 9, 8 while the prefixes were 3 distinct
    assert token_truth(tokens, 2, embedding=True)[1] == 2


def test_the_truth_counts_positions_after_bos_and_a_constant_set_holds_nothing():
    tokens = rows([4, 4], [4, 5])
    assert token_truth(tokens, 0, embedding=False) == (0.0, 1)  # BOS alone
    assert token_truth(tokens, 1, embedding=False) == (0.0, 1)  # the same first token
    assert token_truth(tokens, 2, embedding=False) == (1.0, 2)
    with pytest.raises(ValueError, match=r"position must be in \[0, 2\]"):
        token_truth(tokens, 3, embedding=False)


def test_cells_name_a_layer_the_embedding_or_a_full_hook():
    assert parse_cell("15@2") == ("blocks.15.hook_resid_post", 2)
    assert parse_cell("3@1", hook="hook_mlp_out") == ("blocks.3.hook_mlp_out", 1)
    assert parse_cell("embed@4") == ("hook_embed", 4)
    assert parse_cell("blocks.2.attn.hook_z@1") == ("blocks.2.attn.hook_z", 1)
    for bad in ("15", "15@", "@2", "15@x", "15@0"):
        with pytest.raises(ValueError):
            parse_cell(bad)
    with pytest.raises(ValueError, match="past the window"):
        LLMTruthConfig(cells=("5@9",), window=8)
    cells = LLMTruthConfig(cells=("embed@1", "5@2"), sample_sizes=(10, 20)).truth_cells()
    assert [(c.hook, c.position, c.n_states) for c in cells] == [
        ("hook_embed", 1, 10), ("blocks.5.hook_resid_post", 2, 10),
        ("hook_embed", 1, 20), ("blocks.5.hook_resid_post", 2, 20),
    ]  # fmt: skip


class FirstBits:
    """Stands in for a BAE: codes the first ``k`` coordinates of states that are 0 or
    ``scale`` (one bit each) and decodes them, the rest as 0."""

    def __init__(self, k: int, scale: torch.Tensor) -> None:
        self.k, self.scale = k, scale

    def encode_bits(self, x):
        return (x[:, : self.k] > self.scale[: self.k] / 2).float()

    encode = encode_bits

    def decode(self, codes):
        rest = torch.zeros(len(codes), len(self.scale) - self.k)
        return torch.cat([codes * self.scale[: self.k], rest], dim=1)


def test_the_rule_flags_a_code_that_merges_states_of_a_discrete_set():
    # 64 values (6 bits), 4 states each; the last 4 coordinates are small: a code of the first
    # 2 reconstructs the set (0.5% error) and merges 4 of its 6 bits
    index = torch.arange(64).repeat(4)
    scale = torch.tensor([1, 1] + [0.05] * 4)
    states = ((index[:, None] >> torch.arange(6)) & 1).float() * scale
    estimate = code_entropy(FirstBits(2, scale), states)
    assert (estimate.state_bits, estimate.code_bits, estimate.bits) == (6.0, 2.0, 2.0)
    assert estimate.relative_error < 0.01 and estimate.typical_relative_error < 0.01
    assert not estimate.reliable
    # the rule without the set-level conditions (errors, ceiling, resolved excess) certified it
    assert not unreliable_reasons(
        estimate.bits, estimate.ceiling_bits, estimate.relative_error, estimate.excess_bits,
        typical_error=estimate.typical_relative_error,
    )  # fmt: skip
    # every state distinct (e.g. the same values with a little noise): the rule cannot tell
    # merging from reading at the code's resolution, and does not ask
    assert discrete_set_bits(6.0, 64, 256) == 6.0 and discrete_set_bits(8.0, 256, 256) is None
    noisy = states + 1e-4 * torch.randn(states.shape, generator=torch.Generator().manual_seed(0))
    assert code_entropy(FirstBits(2, scale), noisy).reliable
    # the code of all six bits reads the set
    assert code_entropy(FirstBits(6, scale), states).reliable


class Copies:
    """Stands in for a BAE of a 0/1 state: two one-hot bits, the first copied ``copies``
    times; decodes exactly."""

    def __init__(self, copies: int) -> None:
        self.copies = copies

    def encode_bits(self, x):
        one_hot = torch.cat([1 - x, x], dim=1)
        return torch.cat([one_hot, *[one_hot[:, :1]] * self.copies], dim=1)

    encode = encode_bits

    def decode(self, codes):
        return codes[:, 1:2]


def test_the_rule_flags_code_bits_that_count_entropy_twice_on_the_set():
    # two values, 128 each: 1 bit; two fair one-hot bits and 2 copies of the first: 4 bits
    states = torch.tensor([0.0] * 128 + [1.0] * 128)[:, None]
    estimate = code_entropy(Copies(2), states)
    assert (estimate.state_bits, estimate.code_bits, estimate.bits) == (1.0, 1.0, 4.0)
    reasons = unreliable_reasons(
        estimate.bits, 10.0, 0.0, None, state_bits=1.0, code_bits=estimate.code_bits
    )
    assert reasons == ["code bits count 3.00 bits twice on this set"]


QUICK = EntropyRecipe.of(expansion=2, steps=60, batch_size=64, seeds=1)


def test_the_benchmark_writes_rows_table_and_plot(tiny_hf_llama_dir, tiny_corpus, tmp_path):
    cfg = LLMTruthConfig(
        model=str(tiny_hf_llama_dir),
        dataset=str(tiny_corpus),
        cells=("embed@1", "1@1", "0@2"),
        sample_sizes=(100, 200),
        window=4,
        recipe=QUICK,
        out=tmp_path,
    )
    summary = llm_truth.run(cfg, progress=False)
    rows = summary["rows"]
    saved = json.loads((tmp_path / "llm-truth.json").read_text())
    assert saved["rows"] == rows and len(rows) == 6
    keys = {"hook", "position", "n_states", "distinct", "truth_bits", "bits", "reliable"}
    assert keys | {"joint_code_bits", "reference_bits"} <= set(rows[0])
    for row in rows:
        # the tiny model's states are an injective function of the prefixes: the set's own
        # plug-in entropy (counted from the states) is the truth (counted from the tokens)
        assert row["state_bits"] == pytest.approx(row["truth_bits"], abs=1e-9)
        assert row["n_distinct"] == row["distinct"] and row["n_samples"] == row["n_states"]
        assert row["joint_code_bits"] <= row["truth_bits"] + 1e-9
        off = abs(row["bits"] - row["truth_bits"])
        assert row["within_tolerance"] == (off <= max(0.25, 0.03 * row["truth_bits"]))
        assert not (row["reliable"] and not row["within_tolerance"])  # never certified wrong
        assert row["reliable"] or row["reasons"]
    # the first-token cells share their truth across hooks; the embedding's is the same here
    assert rows[0]["truth_bits"] == rows[1]["truth_bits"]
    report = (tmp_path / "llm-truth.md").read_text()
    assert "| hook | position | states | distinct | truth |" in report
    assert "reliable readings off the truth by more" in report or "reliable reading off" in report
    assert matplotlib.image.imread(tmp_path / "llm-truth.png").shape[0] > 100
    with pytest.raises(ValueError, match="fewer than the largest sample size"):
        llm_truth.run(
            LLMTruthConfig(
                model=str(tiny_hf_llama_dir), dataset=str(tiny_corpus), cells=("1@1",),
                sample_sizes=(100000,), recipe=QUICK, out=tmp_path / "big",
            ),
            progress=False,
        )  # fmt: skip
