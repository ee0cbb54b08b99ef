import math
import re

import pytest
import torch

from sae_lens_bae import BAETrainingSAE, BAETrainingSAEConfig, train_sae
from sae_lens_bae.outliers import outliers_set_aside
from sae_lens_bae.saes.input_frame import fix_frame_from_set, in_input_units, placement
from sae_lens_bae.stacks import StackedBAE, train_stacked_baes
from sae_lens_bae.training import DrainHold


def binary_mixtures(n_sets, n=1024, d=8, rank=3, dtype=torch.float64, noise=0.0):
    """Sets of ``n`` binary combinations of ``rank`` orthonormal directions (2^rank distinct
    points), each plus Gaussian noise of scale ``noise``."""
    g = torch.Generator().manual_seed(0)
    sets = []
    for _ in range(n_sets):
        basis = torch.linalg.qr(torch.randn(d, rank, generator=g, dtype=torch.float64))[0].T
        x = torch.randint(0, 2, (n, rank), generator=g).double() @ basis
        if noise:
            x = x + noise * torch.randn(n, d, generator=g, dtype=torch.float64)
        sets.append(x.to(dtype))
    return sets


# the learning rate's warm-up must match as well (SAELens' scheduler in both):
# (config fields, trainer arguments)
OPTIONS = {
    "paper terms": ({}, {}),
    "lr warm-up, cosine": ({}, {"lr_warm_up_steps": 12, "lr_scheduler_name": "cosineannealing",
                                "lr_end": 2e-4}),
    "adam beta2": ({}, {"adam_beta2": 0.9}),
    # the codes of these sets decorrelate by step 20: off for the last 30 of 40 steps
    "covariance off at the end": ({"covariance_off_from_step": 10}, {}),
}  # fmt: skip


@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("bits_per_feature", [1, 2])
def test_stacked_training_equals_separate_trainings(bits_per_feature, dtype, options):
    """The stack and three separate runs end with the same weights up to rounding.

    The bound: with the same codes, the runs differ only in the order of their float reductions
    (batched matmuls; for bits_per_feature > 1 the single BAE steps its code twice, the stack once).
    A step then moves each weight by the same update up to a few roundings at the weights' scale,
    and over ``steps`` steps those add up to about ``steps * eps * scale``: nothing amplifies them
    while no code bit differs (40 Adam steps of lr 2e-3 are far from chaotic).
    float64 makes that bound ~1e-15: equality to float64 rounding."""
    sets = binary_mixtures(3, dtype=getattr(torch, dtype), noise=0.02)
    cfg = BAETrainingSAEConfig(
        coefficient_width=None,
        d_in=8,
        d_sae=12,
        bits_per_feature=bits_per_feature,
        dtype=dtype,
        entropy_off_steps=10,  # 10 of the 40 steps
        entropy_coefficient=1e-2,
        covariance_coefficient=1e-3,
        input_variance=1.0,  # each frame fixed on its set before the first step, on both sides
        **OPTIONS[options][0],
    )
    seeds, steps = [5, 6, 7], 40
    trainer = {"training_samples": steps * 64, "batch_size": 64, "lr": 2e-3, **OPTIONS[options][1]}
    stacked, histories, taken = train_stacked_baes(sets, cfg, seeds=seeds, progress=False,
                                                   **trainer)  # fmt: skip
    assert len(histories[0]["reconstruction_loss"]) == steps and taken == [steps] * 3
    for g, (x, seed) in enumerate(zip(sets, seeds, strict=True)):
        alone = train_sae(x, cfg, seed=seed, **trainer).sae  # its frame folded when it ended
        for name, value in alone.state_dict().items():
            mine = in_input_units(stacked[g]).state_dict()[name]
            if not value.is_floating_point():
                assert torch.equal(mine, value), (g, name)
                continue
            bound = steps * torch.finfo(value.dtype).eps * value.abs().max().item()
            assert (mine - value).abs().max().item() <= bound, (g, name, bound)
        first = BAETrainingSAEConfig(
            d_in=8, d_sae=12, bits_per_feature=bits_per_feature, dtype=dtype
        )
        assert not torch.allclose(alone.W_enc, StackedBAE(first, [seed]).W_enc[0])  # it trained


def test_each_bae_of_a_stack_reads_its_set_in_its_own_input_frame():
    """A set and the same set scaled by 10 and moved: in one stack, the second BAE's frame
    absorbs the change (k a tenth of the first's), and both learn the same codes, their weights
    equal but for what SAELens' clipping at gradient norm 1 does with the second BAE's loss,
    100 times the first's (``mse_loss`` is in the inputs' units), as two separate runs would."""
    x = binary_mixtures(1, dtype=torch.float64)[0]
    cfg = BAETrainingSAEConfig(coefficient_width=None, 
        d_in=8, d_sae=12, dtype="float64", input_variance=0.5 / 8,
        entropy_off_steps=10, entropy_coefficient=1e-2, covariance_coefficient=1e-3,
    )  # fmt: skip
    near, far = train_stacked_baes(
        [x, 10 * x + 3], cfg, seeds=[5, 5], training_samples=40 * 64, batch_size=64,
        progress=False,
    ).baes  # fmt: skip
    assert far.input_scale.item() == pytest.approx(near.input_scale.item() / 10, rel=1e-6)
    for name in ("W_enc", "b_enc", "W_dec"):
        assert torch.allclose(getattr(far, name), getattr(near, name), atol=1e-4), name
    assert torch.equal(far.encode_bits(10 * x + 3), near.encode_bits(x))


def test_a_stack_that_frames_its_sets_trains_as_on_the_sets_framed_beforehand():
    """The input frame is the one input scaling: each BAE of a stack frames its set (from the
    whole set) and trains as a BAE without a frame trains on that set moved and scaled
    beforehand: the same codes, the weights equal but for the rounding of the frame (kept in
    fp32) and SAELens' clipping at gradient norm 1, which sees the framed BAE's loss 1 / k^2
    times the other's (``mse_loss`` is in the inputs' units)."""
    mixtures = binary_mixtures(2, dtype=torch.float64)
    sets = [mixtures[0] * 3.0 + 1.0, mixtures[1] * 0.2 - 5.0]
    fields = {"d_in": 8, "d_sae": 12, "dtype": "float64",
              "entropy_off_steps": 10, "entropy_coefficient": 1e-2, "coefficient_width": None,
              "covariance_coefficient": 1e-3}  # fmt: skip
    run = {"seeds": [5, 6], "training_samples": 40 * 64, "batch_size": 64, "progress": False}
    framed = train_stacked_baes(sets, BAETrainingSAEConfig(**fields, input_variance=0.5), **run)
    moved = []
    for x in sets:
        variance, shift = placement(x)
        moved.append((x + shift) * (0.5 * 8 / variance) ** 0.5)  # 0.5 per dimension
    plain = train_stacked_baes(moved, BAETrainingSAEConfig(**fields, input_variance=None), **run)
    for g, (mine, theirs) in enumerate(zip(framed.baes, plain.baes, strict=True)):
        expected = (0.5 * 8 / placement(sets[g])[0]).item() ** 0.5
        assert mine.input_scale.item() == pytest.approx(expected, rel=1e-6)
        for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
            assert torch.allclose(getattr(mine, name), getattr(theirs, name), atol=2e-2), name
        assert torch.equal(mine.encode_bits(sets[g]), theirs.encode_bits(moved[g]))
    k2 = 0.5 * 8 / placement(sets[0])[0].item()  # the first BAE's k^2: its error in frame units
    framed_error = [k2 * value for value in framed.histories[0]["reconstruction_loss"]]
    assert framed_error == pytest.approx(plain.histories[0]["reconstruction_loss"], rel=1e-2)


def test_the_stacked_trainer_drops_the_covariance_term_from_its_step():
    """40 steps with ``covariance_off_from_step = 30``: the term is paid on the first 30 and is
    exactly zero on the last 10, for every BAE of the stack."""
    cfg = BAETrainingSAEConfig(
        coefficient_width=None,
        d_in=8,
        d_sae=12,
        covariance_coefficient=1e-3,
        covariance_off_from_step=30,
    )
    _, histories, _ = train_stacked_baes(binary_mixtures(2), cfg, training_samples=40 * 64,
                                         batch_size=64, progress=False)  # fmt: skip
    for history in histories:
        assert all(value > 0 for value in history["covariance_loss"][:30])
        assert history["covariance_loss"][30:] == [0.0] * 10


def test_stacked_rejects_bad_shapes_and_normalisation():
    model = StackedBAE(BAETrainingSAEConfig(d_in=8, d_sae=32), [0, 1])
    with pytest.raises(ValueError, match=r"\[2, batch, 8\]"):
        model.losses(torch.randn(3, 16, 8), 0)
    with pytest.raises(ValueError, match="normalise them beforehand"):
        StackedBAE(
            BAETrainingSAEConfig(
                d_in=8,
                d_sae=32,
                normalize_activations="expected_average_only_in",
                input_variance=None,
            ),
            [0],
        )
    with pytest.raises(ValueError, match="2 activation sets but 1 seeds"):
        train_stacked_baes(
            [torch.randn(64, 8)] * 2,
            BAETrainingSAEConfig(d_in=8, d_sae=32),
            training_samples=64,
            seeds=[0],
        )


@pytest.mark.parametrize("final", [None, 60])
def test_converged_baes_drop_out_and_the_others_train_as_if_alone(final):
    """Members that converge leave the stacked matmuls; every member, early or late, ends with
    the weights, code means and step count it gets when trained alone under the same rule. With
    ``covariance_off_from_step`` (the last quarter of 80 steps), a member in its final phase (the
    term off) trains beside members that still pay it, each as it would alone."""
    from sae_lens_bae.training import Convergence

    g = torch.Generator().manual_seed(1)
    sets = [binary_mixtures(1, rank=rank)[0] for rank in (1, 3)]
    sets.append(torch.randn(1024, 8, generator=g, dtype=torch.float64))  # never flat early
    cfg = BAETrainingSAEConfig(coefficient_width=None, 
        d_in=8, d_sae=12, dtype="float64", entropy_off_steps=10, entropy_coefficient=1e-2,
        covariance_coefficient=1e-3,
        covariance_off_from_step=final, input_variance=None,  # frames differ: see above
    )  # fmt: skip
    rule = Convergence(check_every=5, window=2, rtol=0.05, atol_bits=0.1, atol_error=1e-2,
                       horizon=0.0)  # fmt: skip
    kwargs = dict(training_samples=80 * 64, batch_size=64, lr=2e-3, progress=False,
                  convergence=rule)  # fmt: skip
    seeds = [5, 6, 7]
    stacked = train_stacked_baes(sets, cfg, seeds=seeds, **kwargs)
    assert len(set(stacked.steps)) > 1, stacked.steps  # they stopped at different steps
    assert min(stacked.steps) < 80
    if final:  # the Gaussian set's BAE (whose code never decorrelates on its own: the binary
        # sets' do) trained its last quarter without the term, beside a member still paying it
        covariance = stacked.histories[2]["covariance_loss"]
        paid = covariance.index(0.0)  # converged there: (80 - 60) / 60 = 1/3 of that more, unpaid
        assert all(value > 0 for value in covariance[:paid])
        assert covariance[paid:] == [0.0] * math.ceil(paid / 3)
        assert stacked.steps[2] < max(stacked.steps)
    for g, (x, seed) in enumerate(zip(sets, seeds, strict=True)):
        alone = train_stacked_baes([x], cfg, seeds=[seed], **kwargs)
        assert alone.steps == [stacked.steps[g]]
        assert len(stacked.histories[g]["reconstruction_loss"]) == stacked.steps[g]
        for name, value in alone.baes[0].state_dict().items():
            if name == "code_mean_count":  # the stack's shared counter
                continue
            assert torch.allclose(stacked.baes[g].state_dict()[name], value, rtol=1e-9,
                                  atol=1e-12), (g, name)  # fmt: skip


def test_the_convergence_rule_waits_out_the_learning_rate_warm_up():
    """A plateau during the lr warm-up is not convergence: under a rule that any two windows
    pass (tolerances far above any change), a BAE stops at the first check where two windows of
    checks exist, counted from the end of the warm-up."""
    from sae_lens_bae.training import Convergence

    x = binary_mixtures(1, rank=1)[0]
    cfg = BAETrainingSAEConfig(d_in=8, d_sae=12, dtype="float64")
    rule = Convergence(check_every=5, window=2, rtol=1e6, atol_bits=1e6, atol_error=1e6,
                       horizon=0.0)  # fmt: skip
    kwargs = dict(training_samples=200 * 64, batch_size=64, lr=2e-3, progress=False,
                  convergence=rule, seeds=[5])  # fmt: skip
    assert train_stacked_baes([x], cfg, **kwargs).steps == [20]  # 2 windows of 2 checks of 5
    assert train_stacked_baes([x], cfg, lr_warm_up_steps=50, **kwargs).steps == [70]


def test_a_converged_bae_trains_its_last_fraction_without_the_covariance_term():
    """Under a rule that stops at step 20, ``covariance_off_from_step = 160`` of 200 steps (the
    last fifth) adds ceil(40 / 160 * 20) = 5 steps without the term (the last fifth of 25),
    after the same first 20 steps, and none when the rule stops the BAE where the budget's own
    final phase has begun."""
    from sae_lens_bae.training import Convergence

    x = binary_mixtures(1)[0]
    rule = Convergence(check_every=5, window=2, rtol=1e6, atol_bits=1e6, atol_error=1e6,
                       horizon=0.0)  # fmt: skip
    kwargs = dict(batch_size=64, lr=2e-3, progress=False, convergence=rule, seeds=[5])

    def train(off_from, steps, **extra):
        cfg = BAETrainingSAEConfig(d_in=8, d_sae=12, dtype="float64", covariance_coefficient=1e-3,
                                   coefficient_width=None,
                                   covariance_off_from_step=off_from)  # fmt: skip
        return train_stacked_baes([x], cfg, training_samples=steps * 64, **kwargs, **extra)

    plain, final = train(None, 200), train(160, 200)
    assert plain.steps == [20] and final.steps == [25]
    covariance = final.histories[0]["covariance_loss"]
    assert covariance[:20] == plain.histories[0]["covariance_loss"]
    assert all(value > 0 for value in covariance[:20]) and covariance[20:] == [0.0] * 5
    assert train(21, 26).steps == [25]  # 20 + ceil(5 / 21 * 20)
    # with a 50-step warm-up the rule stops at 70 (test above); 70 + ceil(17.5) = 88
    assert train(160, 200, lr_warm_up_steps=50).steps == [88]
    # converged at 20 of a 24-step budget whose final phase is off from step 19
    assert train(19, 24).steps == [20]
    # a final phase that starts at or after the budget's end never begins
    assert train(200, 200).steps == [20] == train(300, 200).steps


def test_a_drain_hold_reads_a_fall_of_more_than_its_bits_between_two_windows():
    rule = DrainHold(extra=0.5, window=2, min_fall_bits=1.0)
    assert rule.draining([10.0, 10.0, 8.5, 9.4])  # 10 -> 8.95: a fall of 1.05
    assert not rule.draining([10.0, 10.0, 9.0, 9.0])  # a fall of exactly 1
    assert not rule.draining([8.0, 8.0, 10.0, 10.0])  # a rise
    assert not rule.draining([10.0, 10.0, 5.0])  # fewer than two windows
    assert rule.draining([0.0, 99.0, 80.0, 10.0, 10.0])  # only the last two windows count
    assert rule.extra_steps(45000) == 22500 and DrainHold(extra=0.0).extra_steps(10) == 0
    with pytest.raises(ValueError, match="extra >= 0"):
        DrainHold(extra=-0.1)


def _drain_run(drain_hold, **config):
    x = binary_mixtures(1)[0]
    cfg = BAETrainingSAEConfig(d_in=8, d_sae=12, dtype="float64", covariance_coefficient=1e-3,
                               covariance_off_from_step=32, coefficient_width=None,
                               **config)  # fmt: skip
    return train_stacked_baes([x], cfg, training_samples=40 * 64, batch_size=64, lr=2e-3,
                              lr_scheduler_name="cosineannealing", lr_end=2e-4, seeds=[5],
                              progress=False, drain_hold=drain_hold)  # fmt: skip


def test_a_drain_hold_that_never_holds_changes_nothing():
    plain = _drain_run(None)
    unheld = _drain_run(DrainHold(extra=1.0, check_every=5, window=2, min_fall_bits=1e9))
    assert unheld.steps == plain.steps == [40]
    assert unheld.histories == plain.histories
    for name, value in plain.baes[0].state_dict().items():
        assert torch.equal(unheld.baes[0].state_dict()[name], value), name


class _AlwaysDraining(DrainHold):
    """A drain hold whose code always reads as draining (what a hold does, not when)."""

    def draining(self, entropies):  # noqa: ARG002
        return True


def test_a_held_schedule_stands_still_then_runs_its_full_course():
    """40 schedule steps, at most 20 held, a check every 5 steps: held from the check after
    step 5 while the rest of the schedule (35 steps) still fits in what is left after the next
    5, i.e. through the check after step 20, so steps 6-25 train at step 5's learning rate and
    phase, and then the schedule's 35 steps run: 60 steps. The losses match the unheld run up to
    the first held step's (computed before its update), and differ after it; the covariance-off
    final fifth is the last 8 steps in both."""
    plain = _drain_run(None)
    held = _drain_run(_AlwaysDraining(extra=0.5, check_every=5))
    assert plain.steps == [40] and held.steps == [60]
    reconstruction = held.histories[0]["reconstruction_loss"]
    assert reconstruction[:7] == plain.histories[0]["reconstruction_loss"][:7]
    assert reconstruction[7] != plain.histories[0]["reconstruction_loss"][7]
    for run, steps in ((plain, 40), (held, 60)):
        covariance = run.histories[0]["covariance_loss"]
        assert len(covariance) == steps and covariance[-8:] == [0.0] * 8
        assert all(value > 0 for value in covariance[:-8])


def test_a_drain_hold_shows_the_held_steps_and_the_code_bits_as_it_trains(capsys):
    """What a run stopped by a time limit leaves in its log: the held steps and the check
    states' bits at the last check."""
    x = binary_mixtures(1)[0]
    cfg = BAETrainingSAEConfig(d_in=8, d_sae=12)
    hold = _AlwaysDraining(extra=0.5, check_every=5)
    train_stacked_baes(
        [x], cfg, training_samples=20 * 64, batch_size=64, seeds=[5], progress=True, drain_hold=hold
    )
    bar = capsys.readouterr().err.splitlines()[-1]
    assert "held=10" in bar and re.search(r"bits=\d+\.\d\b", bar), bar


def test_a_stacks_record_of_codes_moves_only_its_trained_rows_as_each_bae_alone():
    """A stack's trained rows move their running means exactly as each BAE alone would
    (``update_running_mean``); the rows that did not train keep theirs."""
    from sae_lens_bae.saes.bae_step import record_code
    from sae_lens_bae.saes.code_mean import update_running_mean
    from sae_lens_bae.saes.minibatch import LOCAL_BATCH

    torch.manual_seed(0)
    cfg = BAETrainingSAEConfig(d_in=4, d_sae=6)
    model = StackedBAE(cfg, [0, 1, 2])
    bits = (torch.rand(2, 16, 6) > 0.5).float()  # rows 0 and 2 of the stack trained
    means = torch.rand(3, 6)
    model.code_mean.copy_(means)
    model.code_mean_count.fill_(4.0)
    record_code(model.code_mean, model.code_mean_count, bits, LOCAL_BATCH, torch.tensor([0, 2]))
    for row, g in ((0, 0), (1, 2)):
        alone, alone_count = means[g].clone(), torch.tensor(4.0)
        update_running_mean(alone, alone_count, bits[row].mean(0))
        assert torch.equal(model.code_mean[g], alone) and alone_count == model.code_mean_count == 5
    assert torch.equal(model.code_mean[1], means[1])


@pytest.mark.parametrize("kill_after", [7, 62])  # a member stops at step 57
def test_a_killed_stacked_run_goes_on_to_the_uninterrupted_weights(
    tmp_path, monkeypatch, training_steps, kill_after
):
    """Killed after ``kill_after`` steps (before and after a member converged, with the covariance
    term's final phase and a drain hold in play), the same call on the same folder
    ends with the weights, histories and steps of a run that was never interrupted; a finished
    run returns without a step; another run's folder is refused in one line."""
    from sae_lens_bae.training import Convergence

    g = torch.Generator().manual_seed(1)
    sets = [binary_mixtures(1, rank=rank)[0] for rank in (1, 3)]
    sets.append(torch.randn(1024, 8, generator=g, dtype=torch.float64))
    cfg = BAETrainingSAEConfig(
        d_in=8, d_sae=12, dtype="float64", entropy_off_steps=8, entropy_coefficient=1e-2,
        covariance_coefficient=1e-3, covariance_off_from_step=45, coefficient_width=None,
        input_variance=1.0,  # the entropy recipe's frame, so the members converge apart
    )  # fmt: skip
    rule = Convergence(check_every=5, window=2, rtol=0.05, atol_bits=0.1, atol_error=1e-2,
                       horizon=0.0)  # fmt: skip
    kwargs = dict(training_samples=60 * 64, batch_size=64, lr=2e-3, progress=False, seeds=[5, 6, 7],
                  convergence=rule, drain_hold=DrainHold(extra=0.5, check_every=5, window=2,
                                                         min_fall_bits=0.0))  # fmt: skip
    whole = train_stacked_baes(sets, cfg, **kwargs)
    assert min(whole.steps) < max(whole.steps)  # a member stopped before the others
    training_steps.kill(after=kill_after)
    with pytest.raises(KeyboardInterrupt):
        train_stacked_baes(sets, cfg, checkpoint=tmp_path / "run", **kwargs)
    training_steps.count()
    resumed = train_stacked_baes(sets, cfg, checkpoint=tmp_path / "run", **kwargs)
    assert training_steps.taken == max(whole.steps) - kill_after  # only the steps not yet taken
    assert resumed.steps == whole.steps and resumed.histories == whole.histories
    for ours, theirs in zip(resumed.baes, whole.baes, strict=True):
        for name, value in theirs.state_dict().items():
            assert torch.equal(ours.state_dict()[name], value), name
    monkeypatch.setattr(StackedBAE, "losses", None)  # finished: no step is taken again
    again = train_stacked_baes(sets, cfg, checkpoint=tmp_path / "run", **kwargs)
    assert again.steps == whole.steps and torch.equal(again.baes[2].W_enc, whole.baes[2].W_enc)
    with pytest.raises(ValueError, match=r"holds another run \(other data or settings\)"):
        train_stacked_baes([x * 2 for x in sets], cfg, checkpoint=tmp_path / "run", **kwargs)


@pytest.mark.parametrize("bits_per_feature", [1, 2])
def test_a_stack_step_is_each_bae_s_own_step_input_frame_included(bits_per_feature):
    """One ``StackedBAE.losses`` step of G BAEs gives what G ``BAETrainingSAE`` steps (SAELens'
    ``training_forward_pass``) give on the same minibatches: every term, gradients, input frames
    (set on the first step by both, from each BAE's own minibatch) and running mean codes, on
    the first step and on the next, whose frames are kept. Both go through ``saes.bae_step``;
    any drift between the two steps (a frame condition, a weight on a term, a phase, the
    record) fails here."""
    import copy

    from sae_lens.saes.sae import TrainStepInput

    from sae_lens_bae import BAETrainingSAE, bae_config

    d, members, rows = 8, 3, 64
    cfg = bae_config(
        d, 12, recipe="entropy", dtype="float64", bits_per_feature=bits_per_feature,
        entropy_off_steps=0,
    )  # fmt: skip
    assert cfg.input_variance is not None
    alone = []
    for seed in (5, 6, 7):
        torch.manual_seed(seed)
        alone.append(BAETrainingSAE(cfg))
    g = torch.Generator().manual_seed(0)
    scales = torch.tensor([1.0, 10.0, 0.1], dtype=torch.float64)[:, None, None]
    batches = [scales * (torch.randn(members, rows, d, generator=g, dtype=torch.float64) + 3)
               for _ in range(2)]  # fmt: skip
    # each frame fixed on its member's rows, as before training
    for member, sae in enumerate(alone):
        fix_frame_from_set(sae, torch.cat([x[member] for x in batches]), 10**6, seed=0)
    batches[0][1, 5] *= 50  # an extreme row in one member's minibatch, after a clean set's frame
    stack = StackedBAE(cfg, [5, 6, 7], init=[copy.deepcopy(sae) for sae in alone])
    assert (stack.input_scale > 0).all()
    for n, x in enumerate(batches):
        stack.zero_grad()
        terms = stack.losses(x, n)
        terms["loss"].sum().backward()
        for member, sae in enumerate(alone):
            sae.zero_grad()
            output = sae.training_forward_pass(
                TrainStepInput(sae_in=x[member], coefficients=sae.get_coefficients(),
                               dead_neuron_mask=None, n_training_steps=n, is_logging_step=False)
            )  # fmt: skip
            output.loss.backward()
            assert sae.input_scale > 0 and stack.input_scale[member] == sae.input_scale
            assert torch.equal(stack.input_shift[member], sae.input_shift)
            for name in ("mse_loss", "entropy_loss", "covariance_loss"):
                assert output.losses[name] > 0, name  # every term on
                torch.testing.assert_close(terms[name][member], output.losses[name], msg=name)
            torch.testing.assert_close(terms["loss"][member], output.loss)
            entropy = terms["batch_entropy_bits"][member].item()
            assert entropy == pytest.approx(output.metrics["batch_entropy_bits"](), rel=1e-12)
            for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
                grad = getattr(stack, name).grad[member]
                torch.testing.assert_close(grad, getattr(sae, name).grad, msg=name)
            torch.testing.assert_close(stack.code_mean[member], sae.code_mean)
            assert stack.code_mean_count == sae.code_mean_count == n + 1
        assert outliers_set_aside(stack) == sum(outliers_set_aside(sae) for sae in alone) == 1


def test_a_stack_frames_a_set_with_extreme_rows_as_train_sae_does(tmp_path):
    """A set with a few states far out: ``train_sae`` sets them aside before fixing the frame,
    and a stack fixes each member's on the same rows (an extreme row's square would otherwise
    set k): one frame for the same set and seed on both paths."""
    from sae_lens import TrainingSAE

    from sae_lens_bae.training.checkpoints import latest_checkpoint

    x = torch.randn(2048, 8, generator=torch.Generator().manual_seed(0)) + 1.0
    x[::400] *= 200.0  # 6 rows at about 200 times the median norm
    cfg = BAETrainingSAEConfig(d_in=8, d_sae=12, input_variance=1.0)
    run = {"training_samples": 4 * 64, "batch_size": 64}
    train_sae(x, cfg, seed=3, checkpoint_dir=tmp_path, n_checkpoints=0,
              save_final_checkpoint=True, **run)  # fmt: skip
    alone = TrainingSAE.load_from_disk(latest_checkpoint(tmp_path))
    stacked = train_stacked_baes([x], cfg, seeds=[3], progress=False, **run).baes[0]
    assert stacked.input_scale.item() == pytest.approx(alone.input_scale.item(), rel=1e-6)
    torch.testing.assert_close(stacked.input_shift, alone.input_shift, rtol=1e-6, atol=1e-6)
    whole = BAETrainingSAE(cfg)  # the frame the extreme rows would have set
    fix_frame_from_set(whole, x, max_rows=x.shape[0], seed=3)
    assert whole.input_scale.item() < stacked.input_scale.item() / 10
