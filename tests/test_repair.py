"""Repair of codes that count bits twice (``entropy.repair``): bits the rest of a code
determines are found from its words, knocked out, and the BAE retrained without them."""

from __future__ import annotations

import math

import pytest
import torch

from sae_lens_bae.entropy import EntropyRecipe, code_entropy
from sae_lens_bae.entropy.repair import (
    KNOCKED_OUT_BIAS,
    conditional_entropies,
    knock_out_,
    redundant_bits,
    repair_baes,
    resolved_code_words,
)
from sae_lens_bae.saes.bae import BAETrainingSAE
from sae_lens_bae.saes.decoder_refit import least_squares_decoder
from sae_lens_bae.stacks.training import StackedBAE, train_stacked_baes

TETRAHEDRON = torch.tensor([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]]).float()


def _h(p: float) -> float:
    return -p * math.log2(p) - (1 - p) * math.log2(1 - p)


def _cube(n: int = 4000, seed: int = 0) -> torch.Tensor:
    """n states near the corners of {0,1}^3, each corner n / 8 times, all distinct."""
    generator = torch.Generator().manual_seed(seed)
    corners = ((torch.arange(n)[:, None] >> torch.arange(3)) & 1).float()
    return corners + 0.01 * torch.randn(n, 3, generator=generator)


def _signs(states: torch.Tensor, normals: torch.Tensor) -> torch.Tensor:
    """Bit k fires where normals[k] . (2x - 1) > 0 (x rounded to its corner)."""
    return ((2 * states.round() - 1) @ normals.T > 0).float()


def test_conditional_entropies_are_the_plug_in_over_words_that_differ_in_one_bit():
    # 8 states: 00 twice, 01 twice, 10 four times (no 11)
    words = torch.tensor([[0, 0], [0, 1], [1, 0]])
    counts = torch.tensor([2, 2, 4])
    given = conditional_entropies(words, counts)
    # bit 0: given c1 = 0 (6 states) it is 1 on 4 of them; given c1 = 1 it is fixed at 0
    assert given[0].item() == pytest.approx(6 / 8 * _h(4 / 6), abs=1e-12)
    # bit 1: given c0 = 0 (4 states) a fair bit; given c0 = 1 fixed
    assert given[1].item() == pytest.approx(4 / 8, abs=1e-12)


def test_redundant_bits_find_one_bit_of_a_three_in_four_code_and_none_of_the_axes():
    states = _cube()
    fair = torch.randint(0, 2, (4000, 5), generator=torch.Generator().manual_seed(1)).float()
    three_in_four = torch.cat([fair, _signs(states, TETRAHEDRON)], dim=1)
    found = redundant_bits(three_in_four)
    assert len(found) == 1 and found[0] in range(5, 9)  # one of the four, any one
    assert redundant_bits(torch.cat([fair, _signs(states, torch.eye(3))], dim=1)) == []
    copied = torch.cat([fair, fair[:, 2:3]], dim=1)  # a bit twice: one copy is redundant
    assert redundant_bits(copied) == [2]
    constant = torch.cat([fair, torch.ones(4000, 1)], dim=1)  # holds no bits: nothing to save
    assert redundant_bits(constant) == []


def test_redundant_bits_look_for_nothing_where_the_set_cannot_tell():
    """16 fair bits on 4000 states: nearly every word once, and each word's neighbours in one
    bit mostly absent, so every bit would look fixed by the rest."""
    fair = torch.randint(0, 2, (4000, 16), generator=torch.Generator().manual_seed(0)).float()
    assert redundant_bits(fair) == []
    assert redundant_bits(fair[:, :10]) == []  # 1024 words, about 4 states each: resolved


def test_code_words_are_read_in_chunks_and_only_where_the_set_resolves_them(monkeypatch):
    import sae_lens_bae.entropy.repair as repair

    states = _cube()
    bae = _three_in_four_bae(states, EntropyRecipe())
    words, counts = resolved_code_words(bae, states)
    expected, held = torch.unique(bae.encode_bits(states).long(), dim=0, return_counts=True)
    order = torch.argsort((words * 2 ** torch.arange(11, -1, -1)).sum(1))  # as unique sorts
    assert torch.equal(words[order], expected) and torch.equal(counts[order], held)  # 8 x 500
    monkeypatch.setattr(repair, "_HASH_BLOCK", 12 * 7)  # 7 states a chunk: the same words
    chunked, chunk_counts = resolved_code_words(bae, states)
    assert torch.equal(chunked, words) and torch.equal(chunk_counts, counts)
    assert redundant_bits(words, counts) == redundant_bits(bae.encode_bits(states))
    assert resolved_code_words(bae, states[:15]) is None  # 8 words in 15 states: under 2 each
    _, twice = resolved_code_words(bae, states[:16])  # type: ignore[misc]  # each word twice
    assert twice.tolist() == [2] * 8


def _three_in_four_bae(states: torch.Tensor, recipe: EntropyRecipe) -> BAETrainingSAE:
    """A BAE of ``recipe``'s config (12 bits at d = 3) whose bits 0-3 are the
    tetrahedron's threshold bits on the cube and 4-11 are knocked out, with the
    least-squares decoder of that code."""
    bae = BAETrainingSAE(recipe.config(3, framed=False))
    with torch.no_grad():
        bae.W_enc[:, :4] = 2 * TETRAHEDRON.T
        bae.b_enc[:4] = -TETRAHEDRON.sum(1)
        knock_out_(bae, list(range(4, 12)))
        weights, bias = least_squares_decoder(bae.encode_bits(states), states)
        bae.W_dec.copy_(weights)
        bae.b_dec.copy_(bias)
    return bae


def test_a_knocked_out_bit_stays_off_through_training():
    states = _cube()
    recipe = EntropyRecipe.of(steps=400)
    bae = _three_in_four_bae(states, recipe)
    cfg = recipe.config(3, framed=False)
    training = train_stacked_baes([states], cfg, training_samples=200 * 512, lr=4e-3,
                                  progress=False, init=[bae])  # fmt: skip
    trained = training.baes[0]
    assert trained.encode_bits(states)[:, 4:].sum().item() == 0.0
    # the CPU surrogate's floor (4e-13 of its peak) moves them by Adam's eps-sized steps only
    assert trained.W_enc[:, 4:].abs().max().item() < 1e-6
    assert (trained.b_enc[4:] - KNOCKED_OUT_BIAS).abs().max().item() < 1e-3
    assert not torch.equal(trained.W_enc[:, :4], bae.W_enc[:, :4])  # the others trained


def test_a_stack_starts_from_the_baes_it_is_given():
    recipe = EntropyRecipe()
    bae = _three_in_four_bae(_cube(), recipe)
    stack = StackedBAE(recipe.config(3, framed=False), [7], init=[bae])
    assert torch.equal(stack.W_enc[0], bae.W_enc) and torch.equal(stack.W_dec[0], bae.W_dec)
    with pytest.raises(ValueError, match="2 seeds but 1 BAEs"):
        StackedBAE(recipe.config(3, framed=False), [7, 8], init=[bae])


@pytest.mark.slow
def test_repair_turns_a_three_in_four_code_into_the_axis_code():
    """The 3-in-4 code reads 4 bits for 3 with exact reconstruction; knocked out of one
    bit and trained on, the other three re-encode the planted bits as the axes (the only three
    threshold bits a linear decoder reads the cube from exactly), one bit less at the same
    reconstruction: the held-out objective is lower, so the repair replaces the BAE."""
    states, check = _cube(), _cube(seed=1)
    recipe = EntropyRecipe.of(steps=8000)  # a repair budget of 2000 steps
    bae = _three_in_four_bae(states, recipe)
    before = code_entropy(bae, check)
    assert before.bits == pytest.approx(4.0, abs=1e-3) and not before.reliable
    baes = [bae]
    repairs = repair_baes(baes, [states], [check], recipe, seeds=[0], progress=False)
    assert list(repairs) == [0] and len(repairs[0].knocked_out) == 1
    assert repairs[0].knocked_out[0] in range(4) and baes[0] is not bae
    after = code_entropy(baes[0], check)
    assert after.bits == pytest.approx(3.0, abs=1e-3)
    assert after.relative_error < 1e-3 and after.reliable
    assert 0 < repairs[0].steps <= 2000 * recipe.selection.repair_rounds


def test_an_axis_code_is_left_as_it_is():
    states = _cube()
    recipe = EntropyRecipe()
    bae = BAETrainingSAE(recipe.config(3, framed=False))
    with torch.no_grad():
        bae.W_enc[:, :3] = 2 * torch.eye(3)
        bae.b_enc[:3] = -1.0
        knock_out_(bae, list(range(3, 12)))
    baes = [bae]
    assert repair_baes(baes, [states], [states], recipe, seeds=[0], progress=False) == {}
    assert baes[0] is bae


@pytest.mark.slow
def test_estimate_entropies_reads_a_three_in_four_code_after_its_repair(monkeypatch):
    """The grid's training is replaced by the hand-made 3-in-4 BAE: the cell reads the set's 3
    bits, says which bit went and how many steps the repair took."""
    import sae_lens_bae.entropy.cells as cells
    from sae_lens_bae.entropy import estimate_entropies
    from sae_lens_bae.stacks.training import StackedTraining

    states, check = _cube(), _cube(seed=1)
    recipe = EntropyRecipe.of(steps=8000)
    made = _three_in_four_bae(states, recipe)

    def trained(*_args, **_kwargs) -> StackedTraining:  # as if the recipe's training made it
        return StackedTraining([made], [{}], [8000])

    monkeypatch.setattr(cells, "train_stacked_baes", trained)
    (cell,) = estimate_entropies([states], recipe, eval_sets=[check], normalise=False,
                                 progress=False)  # fmt: skip
    assert cell.bits == pytest.approx(3.0, abs=1e-3) and cell.reliable
    [[bit]] = cell.knocked_out_bits
    assert bit in range(4) and cell.steps == 8000 and 0 < cell.repair_steps <= 4000
    (kept,) = estimate_entropies([states], recipe.changed(repair_rounds=0), eval_sets=[check],
                                 normalise=False, progress=False)  # fmt: skip
    assert kept.bits == pytest.approx(4.0, abs=1e-3) and not kept.reliable
    assert kept.knocked_out_bits is None and kept.repair_steps == 0
    assert recipe.repairs and not recipe.changed(objective=False).repairs  # the ablation never
