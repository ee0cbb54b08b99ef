"""Entropy cells: convergence, seeds, and the flags that say how far to trust an estimate."""

import pytest
import torch

from sae_lens_bae import train_sae
from sae_lens_bae.entropy import EntropyRecipe, directional_data, estimate_entropies
from sae_lens_bae.entropy.tables import reliability_note
from sae_lens_bae.saes.objective import binary_entropy
from sae_lens_bae.training import Convergence, ConvergenceMonitor


def test_convergence_monitor_on_hand_made_curves():
    rule = Convergence(check_every=10, window=2, rtol=0.01, atol_bits=0.1, min_steps=20,
                       horizon=0.0)  # fmt: skip
    monitor = ConvergenceMonitor(rule, 2)
    assert [n for n in range(40) if monitor.due(n)] == [9, 19, 29, 39]
    # checks up to min_steps are not evidence: the objective is not complete yet
    assert monitor.update(9, [0.5, 0.5], [3.0, 9.0]) == []
    assert monitor.update(19, [0.5, 0.5], [3.0, 9.0]) == [] and monitor.errors == [[], []]
    assert monitor.update(29, [0.5, 0.4], [3.0, 8.0]) == []
    assert monitor.update(39, [0.5, 0.3], [3.0, 7.0]) == []  # two checks: one window only
    # model 0: windows (3.0, 3.0) and (3.05, 3.1) differ by 0.075 <= 0.1 bits; model 1 drifts
    assert monitor.update(49, [0.5, 0.3], [3.05, 6.9]) == []
    assert monitor.update(59, [0.5, 0.3], [3.1, 6.9]) == [0]
    assert monitor.converged_at == [60, None] and not monitor.done
    # model 1: errors (0.3, 0.3) vs (0.3, 0.3), bits (6.9, 6.9) vs (6.9, 6.9) at last: flat;
    # model 0 is no longer checked
    assert monitor.update(69, [9.9, 0.3], [9.9, 6.9]) == [1]
    assert monitor.errors[0] == [0.5, 0.5, 0.5, 0.5]
    assert monitor.done and monitor.converged_at == [60, 70]


def test_a_slow_drift_is_not_a_plateau_over_the_horizon():
    """Entropy rising 0.02 bits per check (10 steps) after 100 steps: two windows of 2 checks
    differ by 0.04 bits, under the 0.1-bit tolerance, but at that pace training as long again
    (100 steps: 5 times the windows' 20 steps apart) would add 0.2 bits."""
    rules = {h: Convergence(check_every=10, window=2, rtol=0.0, atol_bits=0.1, horizon=h)
             for h in (0.0, 1.0)}  # fmt: skip
    monitors = {h: ConvergenceMonitor(rule, 1) for h, rule in rules.items()}
    stopped = {}
    for n, step in enumerate(range(69, 200, 10)):
        for h, monitor in monitors.items():
            if monitor.update(step, [0.1], [9.0 + 0.02 * n]):
                stopped[h] = step + 1
    assert stopped == {0.0: 100}  # the windows-only rule stops at its first chance
    # a plateau passes with the horizon too: windows 9.0 and 9.01 at step 130 project to
    # 0.01 x 130 / 20 = 0.065 bits; 9.0 and 9.02 would project to 0.13 and keep it training
    for last, expected in ((9.01, [0]), (9.02, [])):
        plateau = ConvergenceMonitor(rules[1.0], 1)
        checks = zip((99, 109, 119, 129), (9.0, 9.0, last, last), strict=True)
        assert [plateau.update(step, [0.1], [bits]) for step, bits in checks][-1] == expected


@pytest.mark.slow
def test_the_convergence_rule_stops_early_on_an_easy_set():
    train, test = directional_data(2, d=16, n_train=2048, n_test=512, seed=3)
    recipe = EntropyRecipe.of(expansion=2, steps=4000, batch_size=256, lr=4e-3)
    (cell,) = estimate_entropies([train], recipe, eval_sets=[test], normalise=False,
                                 progress=False)  # fmt: skip
    # the entropy term is off for the first 1000 steps; then two windows of 5 checks
    assert 2000 <= cell.steps < 4000
    assert cell.bits == pytest.approx(2.0, abs=0.05) and cell.reliable
    assert cell.n_distinct == 4 and cell.ceiling_bits == 2.0
    budget = EntropyRecipe.of(expansion=2, steps=900, batch_size=256, lr=4e-3, converge=False)
    (full,) = estimate_entropies([train], budget, eval_sets=[test], normalise=False,
                                 progress=False)  # fmt: skip
    assert full.steps == 900


@pytest.mark.slow
def test_a_translated_set_reads_the_same_entropy():
    """Entropy does not change when every state moves by one vector. LLM states share a large
    mean; scaled by their mean squared norm this 4-bit set, moved 10 times its norm away, read
    0.00 bits at 101% error: the penalties outweighed a reconstruction of 1% of the scale. Each
    BAE now frames its set by its variance and places it where the recipe was calibrated
    (``saes.input_scale``)."""
    train, test = directional_data(4, d=12, n_train=2048, n_test=512, seed=3)
    direction = torch.randn(12, generator=torch.Generator().manual_seed(1))
    shift = 10 * 2**0.5 * direction / direction.norm()  # 10 times the states' rms norm
    recipe = EntropyRecipe.of(expansion=2, steps=4000, batch_size=256)
    near, far = estimate_entropies([train, train + shift], recipe, seeds=[0, 0],
                                   eval_sets=[test, test + shift], progress=False)  # fmt: skip
    # the same minibatches: the same k, and t moved by the translation (up to fp32 rounding)
    assert far.scale == pytest.approx(near.scale, rel=1e-4)
    assert torch.allclose(far.bae.input_shift, near.bae.input_shift - shift, atol=1e-4)
    for cell, held_out in ((near, test), (far, test + shift)):
        # a cell's codes of its own held-out states, framed as in training: its estimate
        assert binary_entropy(cell.codes(held_out).mean(0)).item() == pytest.approx(cell.bits)
    for cell in (near, far):
        assert cell.bits == pytest.approx(4.0, abs=0.05) and cell.reliable
        assert cell.relative_error < 0.01 and cell.typical_relative_error < 0.01


def test_an_undersized_bae_is_flagged_unreliable():
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(1024, 16, generator=generator)  # full rank: 1024 distinct states
    small = EntropyRecipe.of(expansion=1, steps=40, batch_size=256, converge=False, seeds=2)
    (cell,) = estimate_entropies([states], small, progress=False)
    assert cell.relative_error > 0.2 and not cell.reliable
    assert cell.n_distinct == 1024 and cell.ceiling_bits == pytest.approx(10.0)
    assert len(cell.bits_per_seed) == 2 and cell.bits_std is not None
    assert cell.bits == pytest.approx(sum(cell.bits_per_seed) / 2)
    summary = cell.summary()
    assert summary["reliable"] is False and summary["ceiling_bits"] == cell.ceiling_bits


def test_the_reliability_note_says_why_each_cell_is_unreliable():
    rows = [
        {"layer": 5, "bits": 3.2, "relative_error": 0.04, "ceiling_bits": 9.0, "reliable": True},
        {"layer": 25, "bits": 10.2, "relative_error": 0.21, "ceiling_bits": 10.0,
         "reliable": False},
        {"layer": 15, "bits": 2.0, "relative_error": 0.65, "ceiling_bits": 9.0, "reliable": False},
        {"layer": 20, "bits": 6.6, "relative_error": 0.03, "ceiling_bits": 12.0,
         "excess_bits": 3.6, "reliable": False},
        {"layer": 21, "bits": 6.0, "relative_error": 0.03, "ceiling_bits": 12.0,
         "excess_bits": 0.25, "reliable": True},
        {"layer": 4, "bits": 6.6, "relative_error": 0.18, "typical_relative_error": 0.68,
         "ceiling_bits": 9.9, "reliable": False},
    ]  # fmt: skip
    note = reliability_note(rows, lambda row: f"layer {row['layer']}").splitlines()
    assert note[0].startswith("2 of 6 cells are reliable")
    assert note[1] == (
        "- unreliable: layer 25: relative error 0.21, estimate 10.2 bits, over its ceiling 10.0"
    )
    assert note[2] == "- unreliable: layer 15: relative error 0.65"
    assert note[3] == (
        "- unreliable: layer 20: dependent code bits: 3.6 bits over the code's joint entropy"
    )
    assert note[4] == "- unreliable: layer 4: typical state's error 0.68"
    assert note[-1].startswith("Most cells are unreliable")


def test_the_recipes_learning_rate_schedule_reaches_the_stacked_trainer():
    """A warm-up and a cosine decay in the recipe train the cell's BAE as train_stacked_baes does
    with them (the same weights), and differently from a constant lr."""
    from sae_lens_bae.stacks import train_stacked_baes

    x, _ = directional_data(2, 8, 1024, 16, seed=0)
    schedule = {"lr_warm_up_steps": 5, "lr_end": 1e-3}
    recipe = EntropyRecipe.of(steps=20, batch_size=64, converge=False, repair_rounds=0,
                           **schedule)  # fmt: skip  # no repair: the trained BAE itself
    [cell] = estimate_entropies([x], recipe, progress=False, bootstrap=0)
    run = {"training_samples": 20 * 64, "seeds": [0], "batch_size": 64, "lr": recipe.optimiser.lr}
    cosine = {**schedule, "lr_scheduler_name": recipe.optimiser.lr_scheduler_name}
    assert cosine["lr_scheduler_name"] == "cosineannealing"  # an lr_end means a cosine
    direct = train_stacked_baes([x], recipe.config(8), progress=False, **run, **cosine)
    assert torch.equal(cell.bae.W_enc, direct.baes[0].W_enc)
    constant = train_stacked_baes([x], recipe.config(8), progress=False, **run)
    assert not torch.allclose(cell.bae.W_enc, constant.baes[0].W_enc)


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"lr_warm_up_steps": -1}, "lr_warm_up_steps"), ({"steps": 10, "lr_warm_up_steps": 10},
     "lr_warm_up_steps"), ({"lr_end": 1.0}, "lr_end"), ({"lr_end": 0.0}, "lr_end")],
)  # fmt: skip
def test_a_recipe_with_a_bad_schedule_says_so(fields, message):
    with pytest.raises(ValueError, match=message):
        EntropyRecipe.of(**fields)


def test_held_out_objective_is_the_loss_the_bae_trains_on():
    """On one minibatch, with the coefficients at their final values and the entropy term on,
    the held-out objective is the loss ``training_forward_pass`` reports, in the units of the
    BAE's input frame (set on its training set, as a registry ``entropy`` BAE's is)."""
    from sae_lens.saes.sae import TrainStepInput

    from sae_lens_bae.evaluation import held_out_objective
    from sae_lens_bae.saes.bae import BAETrainingSAE
    from sae_lens_bae.saes.input_frame import fix_frame_from_set

    cfg = EntropyRecipe.of(expansion=2).config(8)
    bae = BAETrainingSAE(cfg)
    x = 3 * torch.randn(64, 8, generator=torch.Generator().manual_seed(0)) + 1.0
    fix_frame_from_set(bae, x, max_rows=64, seed=0)
    step = TrainStepInput(sae_in=x, coefficients=cfg.coefficients(), dead_neuron_mask=None,
                          n_training_steps=10**6, is_logging_step=False)  # fmt: skip
    expected = float(bae.training_forward_pass(step).loss.detach())
    assert float(bae.input_scale) != pytest.approx(1.0, rel=0.1)  # the frame is set and used
    assert held_out_objective(bae, x, 64) == pytest.approx(expected, rel=1e-6)
    # 70 rows in minibatches of 32: the mean over rows 0-31 and 32-63, the short tail left out
    tail = torch.cat([x, x[:6]])
    first, second = (held_out_objective(bae, x[i : i + 32], 32) for i in (0, 32))
    assert held_out_objective(bae, tail, 32) == pytest.approx((first + second) / 2, rel=1e-6)
    assert first != pytest.approx(second, rel=1e-3)


def test_restarts_keep_the_restart_of_lowest_held_out_objective():
    """``restarts`` trains that many BAEs per seed (seed b + 1000 s + 100000 q, stacked) and
    keeps the one whose held-out objective is lowest; every restart's objective is reported."""
    from sae_lens_bae.entropy import code_entropy
    from sae_lens_bae.evaluation import held_out_objective
    from sae_lens_bae.saes.decoder_refit import refit_decoder
    from sae_lens_bae.stacks import train_stacked_baes

    x, test = directional_data(3, 8, 1024, 256, seed=0)
    recipe = EntropyRecipe.of(expansion=2, steps=60, batch_size=64, converge=False, seeds=2,
                           restarts=3, repair_rounds=0)  # fmt: skip  # the restarts as trained
    [cell] = estimate_entropies([x], recipe, eval_sets=[test], progress=False,
                                bootstrap=0)  # fmt: skip
    seeds = [1000 * s + 100_000 * q for s in range(2) for q in range(3)]
    direct = train_stacked_baes([x] * 6, recipe.config(8), training_samples=60 * 64, seeds=seeds,
                                batch_size=64, lr=recipe.optimiser.lr, progress=False)  # fmt: skip
    for bae in direct.baes:  # the recipe refits every restart's decoder before comparing them
        refit_decoder(bae, x, seed=0)
    objectives = [held_out_objective(bae, test, 64) for bae in direct.baes]
    assert cell.restart_objectives == [pytest.approx(objectives[:3], rel=1e-6),
                                       pytest.approx(objectives[3:], rel=1e-6)]  # fmt: skip
    assert len(set(objectives[:3])) == 3  # the restarts ended in different places
    best = [min(range(3), key=objectives.__getitem__), 3 + min(range(3),
            key=objectives[3:].__getitem__)]  # fmt: skip
    assert torch.equal(cell.bae.W_enc, direct.baes[best[0]].W_enc)
    assert cell.bits_per_seed == [pytest.approx(code_entropy(direct.baes[g], test).bits)
                                  for g in best]  # fmt: skip
    assert cell.restart_bits == [[pytest.approx(code_entropy(direct.baes[g], test).bits)
                                  for g in range(3 * s, 3 * s + 3)] for s in range(2)]  # fmt: skip
    assert cell.summary()["restart_objectives"] == cell.restart_objectives
    [plain] = estimate_entropies([x], EntropyRecipe.of(expansion=2, steps=60, batch_size=64,
                                 converge=False, repair_rounds=0), eval_sets=[test],
                                 progress=False, bootstrap=0)  # fmt: skip
    assert (
        plain.restart_objectives is None and plain.restart_bits is None
    )  # restart 0 is the seed a plain recipe trains
    assert torch.equal(plain.bae.W_enc, direct.baes[0].W_enc)


def test_a_recipes_drain_hold_reaches_the_stacked_trainer():
    """``EntropyRecipe.drain_hold`` reaches the cell's trainer as a ``DrainHold`` and engages
    there: the code over-codes the 3-bit set and its entropy falls, so a run without a stop
    rule takes more than its 1100 steps (the hold is checked every 100 steps and decides from
    its tenth check), held a whole number of checks and at most ``drain_hold`` times the steps."""
    from sae_lens_bae.training import DrainHold

    x, test = directional_data(3, 8, 1024, 256, seed=0)
    recipe = EntropyRecipe.of(expansion=2, steps=1100, batch_size=64, converge=False,
                              drain_hold=1.0, repair_rounds=0, lr_end=4e-4)  # fmt: skip
    assert recipe.drain_rule() == DrainHold(extra=1.0)
    assert EntropyRecipe().drain_rule() is None
    [cell] = estimate_entropies([x], recipe, eval_sets=[test], progress=False,
                                bootstrap=0)  # fmt: skip
    assert 1100 < cell.steps <= 2200 and cell.steps % 100 == 0
    with pytest.raises(ValueError, match="drain_hold must be at least 0"):
        EntropyRecipe.of(drain_hold=-0.5)


def test_a_recipe_without_seeds_or_restarts_says_so():
    with pytest.raises(ValueError, match="restarts must be at least 1"):
        EntropyRecipe.of(restarts=0)


def test_a_recipes_adam_beta2_reaches_the_optimizer_as_saelens_trainer_takes_it():
    """``EntropyRecipe.adam_beta2`` trains the cell's BAE as SAELens' ``SAETrainer`` (through
    ``train_sae``) trains one with that ``adam_beta2``, and not as it does with the default."""
    x, _ = directional_data(3, 8, 1024, 256, seed=0)
    recipe = EntropyRecipe.of(expansion=2, steps=40, batch_size=64, converge=False, adam_beta2=0.9,
                           repair_rounds=0)  # fmt: skip  # no repair: the trained BAE itself
    # unframed: train_sae frames on its first minibatch, a stack on the whole set
    [cell] = estimate_entropies([x], recipe, normalise=False, progress=False, bootstrap=0)
    trainer = {"training_samples": 40 * 64, "batch_size": 64, "lr": recipe.optimiser.lr}
    cfg = recipe.config(8, framed=False)
    alone = train_sae(x.float(), cfg, seed=0, adam_beta2=0.9, **trainer).sae
    default = train_sae(x.float(), cfg, seed=0, **trainer).sae
    assert torch.allclose(cell.bae.W_enc, alone.W_enc, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(cell.bae.W_enc, default.W_enc, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match=r"adam_beta2 must be in \[0.0, 1.0\), got 1.0"):
        EntropyRecipe.of(adam_beta2=1.0)
